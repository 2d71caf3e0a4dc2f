"""The cascade op's AMX path (tile instructions in software, tests/runtime/amx_emulation.h) against its AVX-512
path, both against OpenVINO's PagedAttention, at the chat shapes on a real model (README.md, "Correctness"):

    PYTHONPATH=. python bench/results/cpu-speed-zen5/op-balance/amx_emulated_shapes.py engines/smollm2-ov-bf16

7 decodes + a 100-token turn on the 1504-token shared prefix (experiments.shared_prefix_runs), five different
turns; each build runs in a process of its own (one extension of the op's name per process). Per turn: the
largest, 90th-percentile and mean over rows of |cascade - paged| / max |paged|, and the rows whose argmax agree."""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TURNS = (400, 1000, 5000, 9000, 20000)  # first token id of each turn's 100


def dump(mode: str, engine: str, out: str) -> None:
    from experiments.shared_prefix_runs import PAST, prefix_with_decoders
    from experiments.shared_prefix_runs import token_ids as ids
    from llmkiln.runtime import cascade_attention

    if mode == "amx":
        header = Path("tests/runtime/amx_emulation.h").resolve()
        flags = ("-mamx-tile", "-mamx-bf16", "-DLLMKILN_AMX_EMULATED", "-include", str(header))
        ext = cascade_attention.extension(flags)
        cascade_attention.extension = lambda: ext
    cascade_attention.routing = lambda cpu, bf16: cascade_attention.ALWAYS
    r, tables, turn = prefix_with_decoders(Path(engine), 8, 40)
    dec = [(f"s{i}", (5 + i,), PAST + 40, tables[i]) for i in range(7)]
    plans = [[*dec, ("t", ids(r, s, 100), PAST, turn)] for s in TURNS]
    runs = {
        cascade: np.stack([r._run(p, [len(t) for _, t, _, _ in p], cascade=cascade) for p in plans])
        for cascade in (False, True)
    }
    np.savez(out, paged=runs[False], cascade=runs[True])


def main() -> None:
    if sys.argv[1] in ("native", "amx"):
        dump(*sys.argv[1:4])
        return
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("native", "amx"):
            subprocess.run([sys.executable, __file__, mode, sys.argv[1], f"{tmp}/{mode}.npz"], check=True)
        native, amx = np.load(f"{tmp}/native.npz"), np.load(f"{tmp}/amx.npz")
        paged = native["paged"]
        for k in range(len(TURNS)):
            scale = np.abs(paged[k]).max()
            line = [f"turn {k}"]
            for name, run in (("AVX-512", native["cascade"]), ("AMX (software tiles)", amx["cascade"])):
                d = np.abs(run[k] - paged[k]).max(-1) / scale
                agree = (run[k].argmax(-1) == paged[k].argmax(-1)).mean()
                line.append(
                    f"{name}: max {d.max():.4f} p90 {np.quantile(d, 0.9):.4f} mean {d.mean():.4f} argmax {agree:.3f}"
                )
            print(" | ".join(line))


if __name__ == "__main__":
    main()
