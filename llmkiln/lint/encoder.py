"""Requests to token ids exactly as the runtime sees them.

Raw prompts go to `tokenizer.encode(text, add_special_tokens=True)` like `LLMEngine.encode` (the Triton path:
`text_input`). Chat messages are rendered with the engine's chat template (`EngineDir.chat_template()`, rendered
by `llmkiln.chat_template.render` with the tokenizer's bos/eos strings) and the rendered text is encoded without
adding special tokens again: the template writes BOS itself, exactly as Hugging Face's
apply_chat_template(tokenize=True) and the OpenAI chat endpoint (Dynamo 1.6.1's frontend, measured: one BOS)
do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from llmkiln.chat_template import render
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.lint.requests import PromptRequest


def _token_text(value: object) -> str:
    """tokenizer_config.json spells special tokens as a string or as {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return ""


@dataclass
class PromptEncoder:
    """Renders and tokenizes requests for one engine."""

    tokenizer: Tokenizer
    chat_template: str | None
    bos_text: str
    eos_text: str
    bos_id: int | None
    source: str = "engine"

    @classmethod
    def from_engine(cls, folder: EngineDir) -> PromptEncoder:
        folder.require()
        tok_file = folder.tokenizer_file()
        if tok_file is None:
            raise BadInput(f"{folder.path}: no tokenizer.json; lint-prompts needs the engine's tokenizer")
        tokenizer = Tokenizer.from_file(str(tok_file))
        cfg = folder.tokenizer_config()
        bos_text, eos_text = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        bos_id = tokenizer.token_to_id(bos_text) if bos_text else None
        if bos_id is None and folder.has_onnx_model():
            bos_id = folder.genai_config().bos_token_id
            if bos_id is not None and not bos_text:
                bos_text = tokenizer.id_to_token(bos_id) or ""
        template = folder.chat_template()
        return cls(tokenizer, template, bos_text, eos_text, bos_id, source=str(folder.path))

    # ------------------------------------------------------------------ text
    def _require_template(self) -> str:
        if not self.chat_template:
            raise BadInput(
                f"{self.source}: requests with 'messages' need a chat template, and this engine has none; "
                "set the recipe field `chat_template` (or send raw 'prompt' text)"
            )
        return self.chat_template

    def render(self, request: PromptRequest, bos_text: str | None = None) -> str:
        """The prompt text the server would tokenize for this request."""
        if request.messages is None:
            return request.prompt or ""
        return render(
            self._require_template(),
            request.message_dicts(),
            add_generation_prompt=True,
            bos_token=self.bos_text if bos_text is None else bos_text,
            eos_token=self.eos_text,
            source=f"{self.source}: chat_template",
        )

    def render_system_part(self, request: PromptRequest, full_text: str) -> str | None:
        """The rendered text of the leading system message alone, when the request's full rendering
        (`full_text`) starts with it (templates that put the system prompt first); None otherwise."""
        if not request.messages or request.messages[0][0] != "system":
            return None
        head = render(
            self._require_template(),
            [request.message_dicts()[0]],
            add_generation_prompt=False,
            bos_token=self.bos_text,
            eos_token=self.eos_text,
            source=f"{self.source}: chat_template",
        )
        return head if head and full_text.startswith(head) else None

    # ------------------------------------------------------------------ ids
    def encode_texts(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text (add_special_tokens=True: as `LLMEngine.encode` makes them)."""
        batch = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in batch]

    def encode_requests(self, requests: Sequence[PromptRequest], texts: Sequence[str]) -> list[list[int]]:
        """The ids the server computes for each request from its rendered text (see the module docstring)."""
        out: list[list[int]] = [[] for _ in requests]
        for special in (True, False):
            idx = [i for i, r in enumerate(requests) if self.adds_special_tokens(r) == special]
            for i, ids in zip(idx, self.encode_texts([texts[i] for i in idx], special), strict=True):
                out[i] = ids
        return out

    @staticmethod
    def adds_special_tokens(request: PromptRequest) -> bool:
        """Raw prompts get the tokenizer's special tokens (BOS); rendered chat templates write their own."""
        return not request.is_chat

    def leading_bos(self, ids: Sequence[int]) -> int:
        """How many BOS tokens the ids start with."""
        n = 0
        while self.bos_id is not None and n < len(ids) and ids[n] == self.bos_id:
            n += 1
        return n
