import pathlib
import random
import statistics
import sys

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)
print("prompt twin:", r.cascade_prompt_req is not None)
dec8 = decodes_on(tables, 8, 40)
dec7 = dec8[:7]


def mixed(n):
    return [("t", token_ids(r, 900, n), PAST, turn), *dec7]


def run(plan):
    return run_ms(r, plan, True)


rng = random.Random(1)
for _rnd in range(2):
    res = {}
    # A: same mixed shape repeated
    for _ in range(3):
        run(mixed(100))
    res["mixed100 repeated"] = statistics.median([run(mixed(100)) for _ in range(15)])
    # B: alternate decode(7) and mixed(100)
    m, d = [], []
    for _ in range(15):
        d.append(run(dec7))
        m.append(run(mixed(100)))
    res["alt: mixed100"] = statistics.median(m)
    res["alt: dec7"] = statistics.median(d)
    # C: alternate decode and mixed of varying length 80-120
    m, d = [], []
    for _ in range(15):
        d.append(run(dec7))
        m.append(run(mixed(rng.randint(80, 120))))
    res["alt: mixed80-120"] = statistics.median(m)
    res["alt2: dec7"] = statistics.median(d)
    res["dec7 repeated"] = statistics.median([run(dec7) for _ in range(15)])
    # D: mixed varying, back to back
    res["mixed80-120 b2b"] = statistics.median([run(mixed(rng.randint(80, 120))) for _ in range(15)])
    print({k: round(v, 2) for k, v in res.items()})
