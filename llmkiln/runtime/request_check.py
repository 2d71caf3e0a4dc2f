"""What `LLMEngine.submit` checks before a request reaches the scheduler thread: the prompt as token ids in the
vocabulary, the sampling parameters, the priority and the recipe's limits. Each refusal is a RequestRejected
subclass whose message says what to change (BadRequestParams, PromptTooLong)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmkiln.runtime.request import BadRequestParams, PromptTooLong, SamplingParams
from llmkiln.runtime.scheduler import SchedulerConfig


def prompt_token_ids(
    prompt: str | Sequence[int], encode: Callable[[str], list[int]], vocab_size: int
) -> list[int]:
    """The prompt's token ids: text encoded with `encode`, ids checked to lie in [0, vocab_size)."""
    if isinstance(prompt, str):
        return encode(prompt)
    try:
        ids = [int(t) for t in prompt]
    except (TypeError, ValueError):
        raise BadRequestParams(
            f"prompt must be text or a sequence of token ids, got {type(prompt)}"
        ) from None
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequestParams(f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}")
    return ids


def check_request(
    config: SchedulerConfig, vocab_size: int, prompt_ids: list[int], params: SamplingParams, priority: int
) -> None:
    """Refuse a request this engine cannot run as asked (the limits are the recipe's)."""
    limits = config.limits
    if not isinstance(params, SamplingParams):
        raise BadRequestParams(f"params must be SamplingParams, got {type(params).__name__}")
    params.check(vocab_size)
    if params.num_speculative_tokens and config.speculative is None:
        raise BadRequestParams(
            "num_speculative_tokens: this engine does not speculate (its recipe has no speculative section); "
            "leave it out or set it to 0"
        )
    if not isinstance(priority, int):
        raise BadRequestParams(f"priority must be an integer, got {priority!r}")
    n = len(prompt_ids)
    if n == 0:
        raise BadRequestParams("the prompt is empty")
    if n > limits.max_input_len:
        raise PromptTooLong(
            f"prompt has {n} tokens; limits.max_input_len is {limits.max_input_len}: shorten the prompt"
        )
    if n + params.max_tokens > limits.max_seq_len:
        raise PromptTooLong(
            f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) = {n + params.max_tokens} exceeds "
            f"limits.max_seq_len ({limits.max_seq_len}): lower max_tokens to {max(limits.max_seq_len - n, 0)}"
        )
