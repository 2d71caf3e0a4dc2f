"""Prefill and decode hosts in one process with the real stories260K engines (onnxruntime's prefix store) and
real NIXL agents (UCX, DRAM): the decode host pulls the prompt's blocks from the
prefill host's blocks and its greedy output is the aggregated engine's; exports are released after the import, on
a failed pull and on timeout; nothing stays pinned."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from llmkiln.host.disaggregated_params import KvHandle, LocalPrefill, params_from_json
from llmkiln.host.engine_host import EngineHost
from llmkiln.host.host_options import HostOptions
from llmkiln.host.kv_transfer import TransferFailed
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime.handoff import KvHandoff
from llmkiln.runtime.request import SamplingParams

pytest.importorskip("nixl_cu12")

GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. "


def wait_for(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def pinned(host: EngineHost) -> int:
    assert host.engine.block_store is not None
    return host.engine.block_store.num_pinned


# Not stories-ov-fp32 here: a NIXL agent on OpenVINO's pools in the pytest process left it to die of SIGSEGV in a
# later test (3 of 3 runs; not understood yet, see the issue-29 note). The paged path's NIXL moves are covered by
# tests/host/test_kv_connector.py (the paged fake runner's numpy blocks) and measured on OpenVINO's pools by
# experiments/kv_handoff_cost.py (one process that exits after it).
@pytest.fixture(scope="module", params=["stories-fp32", "stories-int8"])
def hosts(request, engine_factory):
    folder: Path = engine_factory(request.param)
    agg = EngineHost.open(folder, HostOptions())
    pre = EngineHost.open(
        folder, HostOptions(role=WorkerRole.PREFILL, kv=KvTransferOptions(export_timeout_s=1.0))
    )
    dec = EngineHost.open(folder, HostOptions(role=WorkerRole.DECODE))
    try:
        yield agg, pre, dec
    finally:
        for h in (agg, pre, dec):
            h.shutdown(5.0)
    for h in (pre, dec):
        assert h.metrics.values["kv_registrations"] == 0


def prefill(pre: EngineHost, ids: list[int]) -> KvHandle:
    """Run the prompt on the prefill host and export its blocks (pinned at the request's end)."""
    assert pre.kv is not None
    h = pre.engine.submit(
        ids, SamplingParams(max_tokens=1, temperature=0.0), handoff=KvHandoff(export_prefix=True)
    )
    h.result()
    assert h.exported is not None
    params = pre.kv.open_export(h.exported.result(10))
    assert params is not None
    assert params_from_json(params.to_json()) == params  # what travels as disaggregated_params
    return params


def test_decode_output_equals_aggregated_and_export_released(hosts) -> None:
    agg, pre, dec = hosts
    ids = agg.engine.encode(PROMPT * 3)
    expected = agg.engine.submit(ids, GREEDY).result()
    params = prefill(pre, ids)
    assert "values" not in str(params.to_json())  # a handle, never KV values
    assert pre.kv.num_open_exports == 1 and pinned(pre) == len(params.block_ids)
    res, stats = dec.kv.pull(params, ids)
    assert stats.read_blocks == len(params.block_ids) > 0 and stats.nbytes > 0
    assert 0 < stats.read_seconds <= stats.seconds
    handle = dec.engine.submit(ids, GREEDY, handoff=KvHandoff(kv_import=res))
    assert handle.result() == expected
    bs = dec.engine.block_store.tokens_per_block
    assert handle.num_cached_tokens >= len(params.block_ids) * bs
    wait_for(lambda: pre.kv.num_open_exports == 0 and pinned(pre) == 0)  # the READ's notification released it
    assert pinned(pre) == 0 and pinned(dec) == 0
    assert pre.metrics.values["kv_exports_expired"] == 0
    # the same prompt again: the decode store has the blocks, nothing is read, the export is still released
    params = prefill(pre, ids)
    res, stats = dec.kv.pull(params, ids)
    assert stats.read_blocks == 0
    assert dec.engine.submit(ids, GREEDY, handoff=KvHandoff(kv_import=res)).result() == expected
    wait_for(lambda: pre.kv.num_open_exports == 0 and pinned(pre) == 0)
    assert pinned(pre) == 0 and pinned(dec) == 0


def test_failed_pull_gives_everything_back(hosts) -> None:
    _agg, pre, dec = hosts
    ids = pre.engine.encode(PROMPT * 2 + "The end.")
    params = prefill(pre, ids)
    bad = dataclasses.replace(params, layout={**params.layout, "dtype": "other"})
    with pytest.raises(TransferFailed):
        dec.kv.pull(bad, ids)
    wait_for(lambda: pre.kv.num_open_exports == 0 and pinned(pre) == 0)  # the decode side said it failed
    assert pinned(pre) == 0 and pinned(dec) == 0


def test_unanswered_export_expires(hosts) -> None:
    _agg, pre, dec = hosts
    ids = pre.engine.encode("A dog ran. " * 12)
    prefill(pre, ids)  # nobody pulls it
    assert pre.kv.num_open_exports == 1 and pinned(pre) > 0
    wait_for(lambda: pre.kv.num_open_exports == 0 and pinned(pre) == 0, timeout_s=5.0)
    assert pinned(pre) == 0
    assert pre.metrics.values["kv_exports_expired"] >= 1
    assert pre.metrics.values["kv_export_blocks"] == 0


def test_local_handoff_decides_on_the_uncached_part(hosts) -> None:
    """Conditional disaggregation on the prefill host: a prompt whose uncached part is at most the limit is handed
    back at once (no engine call, nothing pinned, no KV); a longer uncached one is prefilled here; once its
    prefix is stored, a repeat's uncached part is short and it is handed back too."""
    agg, pre, dec = hosts
    kv = pre.kv
    assert kv is not None and dec.kv is not None
    limit = kv.max_local_prefill_tokens
    assert limit == KvTransferOptions().max_local_prefill_tokens == 128  # the default
    short = agg.engine.encode(PROMPT * 2)
    long = agg.engine.encode("The cat sat on a warm mat and purred. " * 20)
    assert len(short) <= limit < len(long)
    before = pre.metrics.values["kv_local_handoffs"]
    local = kv.local_handoff(short)
    assert isinstance(local, LocalPrefill) and params_from_json(local.to_json()) == local
    assert local.uncached_tokens == len(short)
    assert pinned(pre) == 0 and kv.num_open_exports == 0
    assert kv.local_handoff(long) is None  # nothing of it stored here: prefilled on the prefill tier
    assert pre.engine.kv.cached_prefix_estimate(long) == 0
    params = prefill(pre, long)
    kv.release(params.export_id, "test", wait=True)
    bs = pre.engine.block_store.tokens_per_block
    whole = (len(long) - 1) // bs * bs
    assert pre.engine.kv.cached_prefix_estimate(long) == len(params.block_ids) * bs == whole
    again = kv.local_handoff(long)  # its prefix is stored here now: only the last partial block is uncached
    assert again is not None and again.uncached_tokens == len(long) - whole
    assert pre.metrics.values["kv_local_handoffs"] == before + 2
    assert pinned(pre) == 0 and kv.num_open_exports == 0
    kv.max_local_prefill_tokens = 0  # off: every prompt is prefilled on the prefill tier
    try:
        assert kv.local_handoff(short) is None
    finally:
        kv.max_local_prefill_tokens = limit
