"""How a prefill or decode host moves KV (llmkiln.host.kv_transfer): the KV transfer's options, each default
declared here once and checked here once.

`kiln serve --dynamo`, `kiln deploy dynamo` and the worker's command line (llmkiln.dynamo.worker_options) take
them as `--kv-export-timeout` and `--max-local-prefill-tokens` (FLAGS: the same names everywhere, so a refusal
names the flag the user typed); `HostOptions.kv` hands them to the host's `KvTransfer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from llmkiln.errors import BadInput


@dataclass(frozen=True)
class KvTransferOptions:
    """export_timeout_s: a prefill host releases an export no decode host read after this long (a decode worker
    that died mid-transfer never says anything). max_local_prefill_tokens: a prompt whose uncached part is at
    most this many tokens skips the prefill tier — the prefill host hands it back at once and the decode host
    prefills it, in runs capped to the same limit (KvTransfer.local_handoff; 0: every prompt is prefilled on
    the prefill tier). pull_timeout_s: the longest a decode host's NIXL read may take before it prefills the
    prompt itself (no flag)."""

    export_timeout_s: float = 30.0
    # Why 128 (docs/serve.md, "Short prompts skip the prefill tier"): measured on this 2-core host,
    # bench-llama-125m on one core prefills 128 tokens in ~100 ms (the recipe's tpot_slo_ms), so a local prefill
    # stretches the decode worker's running decodes by about one TPOT budget, while on the prefill tier the
    # prompt would wait for the chunk in progress there (128-512 tokens: 0.1-0.4 s), then a second hop and a
    # transfer.
    max_local_prefill_tokens: int = 128
    pull_timeout_s: float = 10.0

    # field -> its command-line flag (kiln serve --dynamo, kiln deploy dynamo, python -m llmkiln.dynamo.worker)
    FLAGS: ClassVar[Mapping[str, str]] = {
        "export_timeout_s": "--kv-export-timeout",
        "max_local_prefill_tokens": "--max-local-prefill-tokens",
    }

    def __post_init__(self) -> None:
        if not self.export_timeout_s > 0:  # NaN too
            raise BadInput(
                f"--kv-export-timeout must be > 0 (seconds a prompt's exported KV stays pinned for a decode "
                f"worker), got {self.export_timeout_s:g}"
            )
        if self.max_local_prefill_tokens < 0:
            raise BadInput(
                f"--max-local-prefill-tokens must be >= 0 (0: off), got {self.max_local_prefill_tokens}"
            )
        if not self.pull_timeout_s > 0:
            raise BadInput(f"the KV pull timeout must be > 0 seconds, got {self.pull_timeout_s:g}")

    def flags_changed(self) -> list[str]:
        """The flags whose value differs from its default (in FLAGS order)."""
        default = KvTransferOptions()
        return [flag for name, flag in self.FLAGS.items() if getattr(self, name) != getattr(default, name)]
