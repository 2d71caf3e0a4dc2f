#!/usr/bin/env bash
# A GGUF for llama.cpp from a Hugging Face checkpoint folder (the llama.cpp peer, experiments/cpu_peer_llama_cpp.py):
#   bash scripts/llama_cpp_gguf.sh HF_DIR OUT.gguf [f16|bf16]        (default f16)
# Prints OUT.gguf on stdout (everything else goes to stderr).
# Runs llama.cpp's own converter, convert_hf_to_gguf.py from the llama.cpp that llama-cpp-python 0.3.36 vendors
# (unpacked by scripts/llama_cpp_env.sh into VENV/src; its gguf-py is the gguf 0.19.0 release), under the venv of
# scripts/llama_cpp_env.sh ($LLMKILN_LLAMACPP_VENV or /tmp/llmkiln-llamacpp/venv; made first when missing), with
# --outtype f16|bf16: the 2-D weights in that type, norms and other 1-D tensors in f32 (the converter's rule).
# The converter reads a staging copy of HF_DIR (step 1 below: the tokenizer files of a folder written by
# transformers' GGUF loader need fixes the converter cannot make itself; the weights are linked, not copied). Then
# the file is loaded in llama.cpp (vocabulary and weights) and its tokenizer compared with HF_DIR's tokenizer.json
# on a few texts, so that a file llama.cpp cannot read, or one that tokenizes differently, fails here. Writes
# OUT.gguf.tmp first and renames it: an interrupted run leaves no OUT.
# Which type: f16. On this CPU (AMD EPYC, AVX2/FMA/F16C, no AVX512-BF16) llama.cpp's CPU backend (0.3.36, 2
# threads) evaluated a 512-token SmolLM2-135M prompt ~1.3x faster in f16 than in bf16, decode about the same
# (numbers in the notes of experiments/cpu_peer_llama_cpp.py). A 135M model converts in ~15 s.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 HF_DIR OUT.gguf [f16|bf16]" >&2; exit 2; }
[ -d "$1" ] || { echo "llama_cpp_gguf.sh: $1: no such folder (give a Hugging Face checkpoint folder)" >&2; exit 2; }
HF=$(cd "$1" && pwd)
OUT=$2
TYPE=${3:-f16}
case "$TYPE" in f16|bf16) ;; *) echo "llama_cpp_gguf.sh: type $TYPE: choose f16 or bf16" >&2; exit 2 ;; esac
[ -f "$HF/config.json" ] && [ -f "$HF/tokenizer.json" ] ||
  { echo "llama_cpp_gguf.sh: $HF has no config.json or tokenizer.json (not a Hugging Face folder)" >&2; exit 2; }
PY=$(bash "$ROOT/scripts/llama_cpp_env.sh")
VENV=$(dirname "$(dirname "$PY")")
CONVERT=$(ls "$VENV"/src/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py 2>/dev/null | head -n1)
[ -n "$CONVERT" ] || { echo "llama_cpp_gguf.sh: no convert_hf_to_gguf.py under $VENV/src: rerun scripts/llama_cpp_env.sh" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
tmp="$OUT.tmp"
staging=$(mktemp -d "${TMPDIR:-/tmp}/llama-cpp-gguf.XXXXXX")
trap 'rm -rf "$staging" "$tmp"' EXIT
stage="$staging/$(basename "$HF")"  # the converter names the model after its folder unless --model-name says
mkdir "$stage"
# general.name: config.json's _name_or_path (or the _model_name_or_path transformers' GGUF loader writes), else the
# folder's name, so the same input always gives the same file
NAME=$("$PY" -P -c 'import json, sys; c = json.load(open(sys.argv[1])); print(c.get("_name_or_path") or c.get("_model_name_or_path") or "")' "$HF/config.json")
t0=$(date +%s)

# 1. The staging folder: HF_DIR's files linked, its tokenizer files copied with what the converter cannot read
#    fixed (each change is printed; none changes a token id, step 3 checks):
#    - a byte-level BPE tokenizer.json with "byte_fallback": true (what transformers' GGUF loader writes: the
#      dequantized SmolLM2 folder has it) makes the converter take it for a SentencePiece-style Llama vocabulary
#      (gguf.LlamaHfVocab) instead of GPT-2's byte-level one (llama.cpp then aborts in byte_to_token on the first
#      prompt); with no <0xXX> byte tokens in the vocabulary the fallback has nothing to fall back to (the tokenizers
#      library then takes the unk token either way), so the copy says false;
#    - tokenizer_config.json's "tokenizer_class": "TokenizersBackend" (transformers 5) is unknown to the
#      converter's transformers 4.57: PreTrainedTokenizerFast (which reads tokenizer.json) instead;
#    - a bos/eos token in tokenizer_config.json that is not config.json's bos_token_id/eos_token_id (the dequantized
#      SmolLM2 folder says eos <|im_start|>; its config.json says 2 = <|im_end|>, as the original GGUF does):
#      config.json's, so the GGUF's special ids are the model's.
"$PY" -P - "$HF" "$stage" >&2 <<'PYEOF'
import json, re, sys
from pathlib import Path

src, stage = Path(sys.argv[1]), Path(sys.argv[2])
for f in src.iterdir():
    if f.name not in ("tokenizer.json", "tokenizer_config.json"):
        (stage / f.name).symlink_to(f.resolve())


def say(msg):
    print(f"llama_cpp_gguf.sh: staging copy: {msg}")


tj = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
model = tj["model"]
vocab = dict(model["vocab"]) if isinstance(model.get("vocab"), dict) else {}
vocab.update({t["content"]: t["id"] for t in tj.get("added_tokens", [])})
byte_tokens = [t for t in vocab if re.fullmatch(r"<0x[0-9A-F]{2}>", t)]
if model.get("type") == "BPE" and model.get("byte_fallback") and not byte_tokens:
    if '"ByteLevel"' in json.dumps(tj.get("pre_tokenizer")):
        model["byte_fallback"] = False
        say("tokenizer.json byte_fallback true -> false (a byte-level BPE without <0xXX> tokens: nothing to fall back to)")
(stage / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
tc_path = src / "tokenizer_config.json"
tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.is_file() else {}
if tc.get("tokenizer_class") == "TokenizersBackend":
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    say("tokenizer_config.json tokenizer_class TokenizersBackend -> PreTrainedTokenizerFast")
cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
by_id = {i: t for t, i in vocab.items()}
for typ in ("bos", "eos"):
    want = cfg.get(f"{typ}_token_id")
    have = tc.get(f"{typ}_token")
    if isinstance(want, int) and want in by_id and have not in (None, by_id[want]):
        say(f"tokenizer_config.json {typ}_token {have!r} -> {by_id[want]!r} (config.json {typ}_token_id {want})")
        tc[f"{typ}_token"] = by_id[want]
        tc.pop(f"{typ}_token_id", None)
(stage / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, ensure_ascii=False), encoding="utf-8")
PYEOF

# 2. The converter (it imports its `conversion` package from its own folder, so no -P; it puts its gguf-py first)
"$PY" "$CONVERT" "$stage" --outfile "$tmp" --outtype "$TYPE" ${NAME:+--model-name "$NAME"} >&2

# 3. The file loads in llama.cpp, and its tokenizer gives HF_DIR's tokenizer.json ids (encoded as llmkiln does:
#    special tokens on) for a few texts when it tokenizes them as llama.cpp's server does a prompt (special tokens
#    parsed, the GGUF's BOS rule)
"$PY" -P - "$tmp" "$HF" >&2 <<'PYEOF'
import collections, sys
import gguf, llama_cpp
from tokenizers import Tokenizer

path, hf = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(path)
types = collections.Counter(t.tensor_type.name for t in r.tensors)
keys = ("general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id")
meta = {k.split(".")[-1]: r.fields[k].contents() for k in keys if k in r.fields}
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, verbose=False)
tok = Tokenizer.from_file(f"{hf}/tokenizer.json")
texts = [
    "The capital of France is",
    "  two  spaces, a tab\tand\nnew lines; digits 12345 and more: café ☕ 日本語",
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n",
    "System: you are a careful assistant for a pottery workshop. Follow these notes.\nUser 3: kiln cup",
]
for text in texts:
    ours, theirs = tok.encode(text).ids, llm.tokenize(text.encode(), add_bos=True, special=True)
    if ours != theirs:
        sys.exit(f"llama_cpp_gguf.sh: {path}: llama.cpp tokenizes {text!r} as {theirs}, tokenizer.json as {ours}")
print(f"llama_cpp_gguf.sh: {len(r.tensors)} tensors {dict(types)}, {meta}; loads in llama.cpp ({llm.n_vocab()} tokens, "
      f"n_ctx_train {llm._model.n_ctx_train()}); its ids are tokenizer.json's on {len(texts)} texts")
PYEOF
mv "$tmp" "$OUT"
echo "llama_cpp_gguf.sh: wrote $OUT ($TYPE, $(( $(date +%s) - t0 )) s)" >&2
echo "$OUT"
