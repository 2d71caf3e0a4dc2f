"""Roles and the host's role options: WorkerRole is the one spelling of a role, KvTransferOptions and HostOptions
check themselves once, when made (BadInput naming the flag)."""

from __future__ import annotations

import pytest

from llmkiln.errors import BadInput
from llmkiln.host.host_options import HostOptions
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import TIERS, WorkerRole


def test_roles_are_an_enum_whose_values_are_the_command_line_spelling():
    assert [r.value for r in WorkerRole] == ["aggregated", "prefill", "decode"]
    assert WorkerRole("prefill") is WorkerRole.PREFILL and WorkerRole.DECODE == "decode"
    assert TIERS == (WorkerRole.PREFILL, WorkerRole.DECODE)
    assert [r.moves_kv for r in WorkerRole] == [False, True, True]
    assert not hasattr(WorkerRole.AGGREGATED, "available")  # every role runs: nothing to ask
    with pytest.raises(ValueError):
        WorkerRole("encode")


def test_kv_transfer_options_defaults_and_refusals():
    kv = KvTransferOptions()
    assert (kv.export_timeout_s, kv.max_local_prefill_tokens, kv.pull_timeout_s) == (30.0, 128, 10.0)
    assert kv.flags_changed() == []
    assert KvTransferOptions(max_local_prefill_tokens=0).flags_changed() == ["--max-local-prefill-tokens"]
    with pytest.raises(BadInput, match="--kv-export-timeout must be > 0"):
        KvTransferOptions(export_timeout_s=0)
    with pytest.raises(BadInput, match="--kv-export-timeout must be > 0"):
        KvTransferOptions(export_timeout_s=float("nan"))
    with pytest.raises(BadInput, match=r"--max-local-prefill-tokens must be >= 0 \(0: off\), got -1"):
        KvTransferOptions(max_local_prefill_tokens=-1)
    with pytest.raises(BadInput, match="pull timeout"):
        KvTransferOptions(pull_timeout_s=0)


def test_host_options_check_the_role_once():
    assert HostOptions().role is WorkerRole.AGGREGATED
    assert HostOptions(role="decode").role is WorkerRole.DECODE  # type: ignore[arg-type]  # a value string
    prefill = HostOptions(role=WorkerRole.PREFILL, kv=KvTransferOptions(export_timeout_s=1.0))
    assert prefill.kv.export_timeout_s == 1.0
    with pytest.raises(
        BadInput, match="--kv-export-timeout: KV transfer option.s. of the prefill and decode"
    ):
        HostOptions(kv=KvTransferOptions(export_timeout_s=1.0))  # an aggregated host moves no KV
    with pytest.raises(ValueError):
        HostOptions(role="encode")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="--compute-priority"):
        HostOptions(compute_priority="high")  # type: ignore[arg-type]
