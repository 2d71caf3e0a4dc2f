"""Regenerate stories-calib.jsonl and stories-eval.jsonl by sampling the fp32 stories260K model.

Run: .venv/bin/python calibration/make_stories.py /path/to/stories260K
Each story starts from a hand-written opening line (OPENINGS_*; calibration and evaluation openings are
disjoint) and is continued by the model with temperature sampling (seeded, so the files are reproducible with
the same torch/transformers versions).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

OPENINGS_CALIB = [
    "Once upon a time, there was a little girl named Lily.",
    "Tom had a big red ball.",
    "One day, a little bird sat on a tree.",
    "Sara and Ben went to the park.",
    "There was a small cat who liked to sleep.",
    "Max wanted to build a tall tower.",
    "The sun was hot and the sky was blue.",
    "Mom gave Tim a new toy car.",
    "A little dog found a bone in the garden.",
    "Lucy liked to draw pictures of flowers.",
    "Once upon a time, there was a big bear.",
    "The boy saw a shiny rock by the river.",
    "Anna had a doll with a pink dress.",
    "One morning, the farmer went to see his cows.",
    "Jack and his dad went fishing.",
    "There was a happy frog in the pond.",
]
OPENINGS_EVAL = [
    "Once upon a time, there was a kind old man.",
    "Mia found a box under her bed.",
    "The little fish swam in the sea.",
    "Ben did not want to eat his soup.",
    "One day, it started to rain very hard.",
    "Zoe had a friend named Sam.",
    "A small mouse lived in a big house.",
    "The girl saw a rainbow in the sky.",
]
SEEDS_CALIB = (11, 12, 13, 14)
SEEDS_EVAL = (101, 102, 103, 104)
TEMPERATURE = 0.8
MAX_NEW_TOKENS = 160


def sample(model, tok, opening: str, seed: int) -> str:
    torch.manual_seed(seed)
    ids = tok(opening, return_tensors="pt").input_ids
    out = model.generate(
        ids, do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS
    )
    return tok.decode(out[0], skip_special_tokens=True).strip()


def write(path: Path, split: str, openings: list[str], seeds: tuple[int, ...], model, tok) -> None:
    rows = []
    for o_i, opening in enumerate(openings):
        for seed in seeds:
            text = sample(model, tok, opening, seed)
            rows.append(
                {
                    "id": f"stories-{split}-{len(rows):04d}",
                    "prompt": opening,
                    "text": text,
                    "source": f"sampled: stories260K fp32, opening {split}[{o_i}], seed {seed}, T={TEMPERATURE}",
                }
            )
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    src = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    here = Path(__file__).parent
    with torch.no_grad():
        write(here / "stories-calib.jsonl", "calib", OPENINGS_CALIB, SEEDS_CALIB, model, tok)
        write(here / "stories-eval.jsonl", "eval", OPENINGS_EVAL, SEEDS_EVAL, model, tok)


if __name__ == "__main__":
    main()
