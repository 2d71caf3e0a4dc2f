"""An offline byte-level BPE tokenizer for generated Llamas, trained on a small corpus shipped in the package.

The vocabulary always has exactly `vocab_size` entries so that every id a random model can emit decodes:
ids 0/1/2 are <unk>/<s>/</s>, then the 256 byte symbols and the learned merges, then `<reserved_N>` entries
(plain vocabulary entries that no merge produces: they decode to their own text and never appear in an encoding).
The post-processor prepends <s> (BOS) like Llama's tokenizer. Training is deterministic (same corpus, same
vocabulary), so the written tokenizer.json is byte-identical from run to run.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from llmkiln.errors import BadInput

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL_TOKENS = (UNK, BOS, EOS)
CORPUS_RESOURCE = "tokenizer_corpus.txt"


def corpus_lines() -> list[str]:
    """The training corpus: a few KB of plain English sentences shipped with llmkiln."""
    text = resources.files("llmkiln.build").joinpath(CORPUS_RESOURCE).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE on the shipped corpus and pad it with reserved entries to exactly `vocab_size`."""
    min_size = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < min_size:
        raise BadInput(
            f"tokenizer vocab_size {vocab_size} is too small: a byte-level BPE needs at least {min_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer)
    tok = _pad_vocab(tok, vocab_size)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, BOS_ID)],
    )
    _check(tok, vocab_size)
    return tok


def _pad_vocab(tok: Tokenizer, vocab_size: int) -> Tokenizer:
    """Append `<reserved_ID>` entries to the BPE vocabulary until it has exactly `vocab_size` ids."""
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    # NOTE: the special tokens live in the BPE vocab too (the trainer puts them there), so max+1 is the count.
    while next_id < vocab_size:
        vocab[f"<reserved_{next_id}>"] = next_id
        next_id += 1
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _check(tok: Tokenizer, vocab_size: int) -> None:
    ids = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    if ids != {UNK_ID, BOS_ID, EOS_ID} or tok.token_to_id(BOS) != BOS_ID:
        raise RuntimeError(f"special token ids are {ids}, expected <unk>=0 <s>=1 </s>=2")
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids, expected {vocab_size}")


def tokenizer_config(model_max_length: int) -> dict[str, object]:
    """tokenizer_config.json for transformers' PreTrainedTokenizerFast (BOS comes from the post-processor)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "padding_side": "left",
    }


def special_tokens_map() -> dict[str, str]:
    """special_tokens_map.json."""
    return {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}


def write_tokenizer(out_dir: Path, vocab_size: int, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into out_dir."""
    tok = build_tokenizer(vocab_size)
    # Tokenizer.save(pretty=True) writes a stable layout: vocab ordered by id, merges in training order.
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(model_max_length))
    _write_json(out_dir / "special_tokens_map.json", special_tokens_map())


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
