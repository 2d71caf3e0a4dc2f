"""The whole prefill/decode path through the KV connector, without a model: two LLMEngines on the paged fake runner
(its "KV" is the token ids, in numpy blocks NIXL moves like the OpenVINO pools), a prefill and a decode host with
real NIXL agents. The decode engine reads every context through its block table, so its output equals the
reference model's only if the right bytes landed in the right blocks."""

from __future__ import annotations

import asyncio

import pytest

from llmkiln.host.disaggregated_params import HandoffInvalid, LocalPrefill, params_from_json
from llmkiln.host.engine_host import EngineHost
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.request import SamplingParams
from llmkiln.runtime.scheduler import SchedulerConfig
from tests.runtime.conftest import EOS, PagedFakeRunner, reference_generate

pytest.importorskip("nixl_cu12")

BS = 4
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def _engine() -> tuple[LLMEngine, PagedFakeRunner]:
    config = SchedulerConfig.make(
        eos_token_ids=(EOS,), max_batch_size=4, max_num_tokens=64, max_prefill_tokens=16, tokens_per_block=BS
    )
    runner = PagedFakeRunner(4, 4 * 64 + 32, BS)
    return LLMEngine(config, runner).start(), runner


@pytest.fixture
def hosts():
    made = []
    for role in (WorkerRole.PREFILL, WorkerRole.DECODE):
        engine, runner = _engine()
        host = EngineHost(engine, role=role)
        host.attach_kv_transfer(KvTransferOptions(export_timeout_s=5.0, max_local_prefill_tokens=8))
        made.append((host, runner))
    try:
        yield made
    finally:
        for host, _ in made:
            host.shutdown(5.0)


async def _serve(host: EngineHost, ids: list[int], received: object = None):
    """What a front door does: the connector's plan, submit, the hand-off after the end."""
    plan = await host.connector.before(ids, received)
    if plan.answer is not None:
        return plan, None, plan.answer.to_json()
    handle = host.engine.submit(ids, PARAMS, handoff=plan.handoff)
    out = await asyncio.to_thread(handle.result, 30)
    return plan, (handle, out), await host.connector.after(handle, plan)


def test_decode_engine_gets_the_prefill_engines_blocks(hosts) -> None:
    (pre, pre_runner), (dec, dec_runner) = hosts
    ids = [int(3 + (i * 7) % 90) for i in range(37)]  # 9 whole blocks of 4
    plan, (_, _), sent = asyncio.run(_serve(pre, ids))
    assert plan.handoff is not None and plan.handoff.export_prefix
    assert sent and sent["kind"] == "llmkiln.kv/1" and len(sent["block_ids"]) == 9
    assert pre_runner.prefill_tokens == 37
    dplan, (handle, out), back = asyncio.run(_serve(dec, ids, sent))
    assert dplan.handoff is not None and dplan.handoff.kv_import is not None
    assert out == reference_generate(ids, 6)
    assert handle.num_cached_tokens == 36 and dec_runner.prefill_tokens == 1  # only the last token computed
    assert back is None  # the decode role hands nothing on
    assert dec.metrics.values["kv_imports"] == 1 and dec.metrics.values["kv_fallbacks"] == 0
    assert pre.kv is not None
    _wait(lambda: pre.kv.num_open_exports == 0)  # released once read
    for host in (pre, dec):
        store = host.engine.block_store
        assert store is not None
        assert host.engine.call(lambda s=store: s.num_pinned).result(5) == 0


def test_a_short_prompt_is_prefilled_on_the_decode_engine(hosts) -> None:
    (pre, pre_runner), (dec, dec_runner) = hosts
    ids = [5, 6, 7, 8, 9, 10]  # under max_local_prefill_tokens (8)
    plan, ran, sent = asyncio.run(_serve(pre, ids))
    assert isinstance(plan.answer, LocalPrefill) and ran is None and pre_runner.prefill_tokens == 0
    dplan, (_, out), _ = asyncio.run(_serve(dec, ids, sent))
    assert dplan.local_prefill and out == reference_generate(ids, 6)
    assert dec_runner.prefill_tokens == 6
    assert dec.metrics.values["kv_local_prefills"] == 1 and dec.metrics.values["kv_local_prefill_tokens"] == 6


def test_the_stand_ins_hand_back_is_prefilled_here_as_a_fallback(hosts) -> None:
    """While no prefill worker is up the launcher's stand-in answers every prefill call with a LocalPrefill marked
    `fallback`: the decode engine prefills the whole prompt and counts a fallback, not a chosen local prefill."""
    _, (dec, dec_runner) = hosts
    ids = [int(3 + (i * 11) % 90) for i in range(23)]  # longer than max_local_prefill_tokens (8)
    back = LocalPrefill(len(ids), len(ids), 0, fallback=True).to_json()
    assert params_from_json(back) == LocalPrefill(len(ids), len(ids), 0, True)
    dplan, (_, out), _ = asyncio.run(_serve(dec, ids, back))
    assert dplan.handoff is None and not dplan.local_prefill and out == reference_generate(ids, 6)
    assert dec_runner.prefill_tokens == len(ids)
    assert dec.metrics.values["kv_fallbacks"] == 1 and dec.metrics.values["kv_local_prefills"] == 0
    with pytest.raises(HandoffInvalid, match="fallback"):
        params_from_json({**back, "fallback": "yes"})


def test_a_bad_hand_off_falls_back_to_prefilling_here(hosts) -> None:
    (pre, _), (dec, dec_runner) = hosts
    ids = [int(3 + (i * 5) % 90) for i in range(21)]
    _, _, sent = asyncio.run(_serve(pre, ids))
    assert sent is not None
    for bad in (
        {"kind": "llmkiln.kv/1", "agent": "x"},
        {**sent, "layout": {**sent["layout"], "dtype": "other"}},
    ):
        before = dec.metrics.values["kv_fallbacks"]
        dplan, (_, out), _ = asyncio.run(_serve(dec, ids, bad))
        assert dplan.handoff is None and out == reference_generate(ids, 6)
        assert dec.metrics.values["kv_fallbacks"] == before + 1


def _wait(cond, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)
