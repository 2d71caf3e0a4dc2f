"""What one request brings from, or asks for, another engine (prefill/decode separation), typed.

`KvHandoff` is the engine-side half of the KV connector's decision for a request (llmkiln.host.kv_connector
decides it): `kv_import` — blocks of this prompt filled from another engine (`LLMEngine.kv.reserve_import`, runtime.engine_kv),
published right before the request is queued so its admission finds them as a cached prefix; `export_prefix` —
pin the prompt's stored blocks when the request ends normally, for another engine to read (`handle.exported`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmkiln.runtime.kv_blocks import Reservation


@dataclass(frozen=True)
class KvHandoff:
    kv_import: Reservation | None = None
    export_prefix: bool = False
