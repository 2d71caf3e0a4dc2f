import pathlib
import statistics
import sys

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)
assert r.cascade_prompt_req is not None


def dec(n):
    return decodes_on(tables, n, 40)


def run(plan):
    # prompt runs marked as the engine marks them: they take the prompt copy
    return run_ms(r, plan, True, prompt=any(len(s[1]) > 1 for s in plan))


def on_twin(plan):
    r.cascade_req, r.cascade_prompt_req = r.cascade_prompt_req, r.cascade_req
    try:
        run(plan)
    finally:
        r.cascade_req, r.cascade_prompt_req = r.cascade_prompt_req, r.cascade_req


mixed = [("t", token_ids(r, 900, 100), PAST, turn)] + dec(7)
for _ in range(3):
    run(dec(7))
    on_twin(dec(7))
    on_twin(dec(6))
    run(mixed)
for _rnd in range(2):
    res = {}
    res["same"] = statistics.median([run(dec(7)) for _ in range(10)])
    for name, f in [
        ("after twin dec7", lambda: on_twin(dec(7))),
        ("after twin dec6", lambda: on_twin(dec(6))),
        ("after twin mixed", lambda: run(mixed)),
        ("after own dec6", lambda: run(dec(6))),
    ]:
        v = []
        for _ in range(10):
            f()
            v.append(run(dec(7)))
        res[name] = statistics.median(v)
    print(" | ".join(f"{k} {v:.1f}" for k, v in res.items()))
