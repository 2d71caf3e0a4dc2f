"""experiments.decode_tail: the trade-off table and its inputs (nothing measured here)."""

from __future__ import annotations

import json

import pytest

from experiments import decode_tail
from llmkiln.bench.report import machine_info


def level(ttft: float, itl99: float, tok_s: float) -> dict:
    return {
        "requests": 64,
        "errors": 0,
        "ttft_ms": {"p50": ttft, "p95": ttft * 2},
        "itl_ms": {"p50": 10.0, "p99": itl99},
        "output_tok_s": tok_s,
    }


def test_the_table_has_every_point_and_the_ratios_to_the_peer():
    meta = {
        "system": "bench-ov-bf16/dynamo",
        "field": "scheduler.max_prefill_tokens_decoding",
        "values": ["none", "64"],
        "fixed": "",
        "system_tokens": 1500,
        "user_tokens": [30, 40],
        "output_tokens": 32,
        "requests": "64",
        "warmup": 8,
        "machine": machine_info(),
        "command": "python -m experiments.decode_tail ...",
    }
    rows = [
        decode_tail._row("max_prefill_tokens_decoding=none", "8", level(100.0, 90.0, 300.0)),
        decode_tail._row("max_prefill_tokens_decoding=64", "8", level(150.0, 30.0, 280.0)),
    ]
    peer = [decode_tail._row("ovgenai-bf16", "8", level(250.0, 20.0, 350.0))]
    text = decode_tail.summary_markdown(meta, rows, peer)
    assert (
        "| max_prefill_tokens_decoding=64 | 8 | 150 | 300 | 10.0 | 30.0 | 280.0 | 1.50 | 0.60 | 0 |" in text
    )
    assert "| ovgenai-bf16 | 8 | 250 | 500 | 10.0 | 20.0 | 350.0 | - | - | 0 |" in text
    assert machine_info()["cpu"]["kind"] in text


def test_bad_grid_and_peer_are_refused(tmp_path):
    with pytest.raises(SystemExit) as exc:
        decode_tail.main(["--out", str(tmp_path), "--grid", "max_prefill_tokens_decoding"])
    assert exc.value.code == 2
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"systems": {}}))
    with pytest.raises(SystemExit) as exc:
        decode_tail.main(
            [
                "--out",
                str(tmp_path),
                "--grid",
                "a.b=none",
                "--peer",
                f"{summary}:ovgenai-bf16",
                "--system",
                "nosuch/dynamo",
            ]
        )
    assert exc.value.code == 2
