"""The prefill tier's stand-in: what answers the frontend's prefill calls while no prefill worker is up.

    python -m llmkiln.dynamo.prefill_standin <a prefill worker's arguments>     (env LLMKILN_STANDIN_TRIGGER=FILE)

Dynamo 1.6.1's frontend admits a disaggregated model's requests only while a worker of each registered tier exists:
with every prefill worker dead or hung it answers 503, though the decode workers could prefill the prompts
themselves. The launcher of a prefill/decode launch (llmkiln.dynamo.launcher) keeps this process ready beside the
workers: it loads no engine and registers nothing until its trigger file appears — imports done, so activation
takes a registration, not a start. When the launcher finds no prefill worker up (one killed, or killed by the
liveness check for hanging) it creates the trigger; the stand-in then registers in the prefill component with the
prefill workers' registration (the engine folder's recipe: context, KV block size) and answers every prefill call
at once with a `LocalPrefill` hand-off marked as a fallback: the decode worker prefills the prompt itself and counts
it (llmkiln_kv_transfer_fallbacks_total). Once a prefill worker has registered again the launcher stops the
stand-in (SIGTERM: Dynamo unregisters it; nothing is ever in flight here) and starts a fresh one, waiting again.

This module imports `dynamo`; the launcher only starts it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import os
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from dynamo._core import Context
from dynamo.common.backend import EngineConfig, GenerateChunk, GenerateRequest, LlmRegistration, WorkerConfig
from dynamo.common.backend import LLMEngine as DynamoEngine
from dynamo.common.backend.disagg import enforce_prefill_max_tokens
from dynamo.common.backend.health_check import build_health_check_payload, is_probe
from dynamo.common.backend.publisher import KvEventSource
from dynamo.common.backend.run import run
from dynamo.common.constants import DisaggregationMode

from llmkiln.dynamo.cluster import STANDIN_TRIGGER_ENV
from llmkiln.dynamo.registration import record_instance, worker_config
from llmkiln.dynamo.worker_options import WorkerOptions
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.host.disaggregated_params import LocalPrefill
from llmkiln.host.roles import WorkerRole

log = logging.getLogger("llmkiln.dynamo.prefill_standin")

TRIGGER_POLL_S = 0.02


class PrefillStandIn(DynamoEngine):
    """A prefill-tier registration without an engine (see the module docstring)."""

    def __init__(self, args: WorkerOptions) -> None:
        if args.role is not WorkerRole.PREFILL:
            raise BadInput(
                f"the prefill stand-in takes a prefill worker's arguments (--role prefill), got {args.role}"
            )
        self.args = args
        self.folder = resolve_engine(args.engine).require()
        self.recipe = self.folder.recipe(args.engine_overrides(self.folder.recipe().backend))
        self.handoffs = 0
        # the prefill workers' registration (from the trigger file): registered as is
        self.registration: dict[str, Any] = {}

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[PrefillStandIn, WorkerConfig]:
        args = WorkerOptions.from_argv(argv)
        standin = cls(args)
        trigger = os.environ.get(STANDIN_TRIGGER_ENV)
        if trigger:  # ready and waiting: registration only once the launcher asks for it
            log.info("prefill stand-in ready: registers once %s exists", trigger)
            while not Path(trigger).exists():
                await asyncio.sleep(TRIGGER_POLL_S)
            standin.registration = _registration(Path(trigger))
            log.info(
                "prefill stand-in activated: the decode workers prefill every prompt until a prefill worker is up"
            )
        config = worker_config(
            args, standin.folder.path, standin.recipe.serve.model_name, DisaggregationMode.PREFILL
        )
        return standin, config

    async def start(self, worker_id: int) -> EngineConfig:
        record_instance(
            worker_id
        )  # the launcher tells this instance apart from the prefill workers by its id
        r = self.recipe
        got = self.registration
        per_seq = -(-r.limits.max_seq_len // r.kv_cache.tokens_per_block)
        return EngineConfig(
            model=str(self.folder.path),
            served_model_name=None,
            llm=LlmRegistration(
                context_length=int(got.get("context_length", r.limits.max_seq_len)),
                kv_cache_block_size=r.kv_cache.tokens_per_block,
                total_kv_blocks=int(got.get("total_kv_blocks", max(1, per_seq * r.scheduler.max_batch_size))),
                max_num_seqs=int(got.get("max_num_seqs", r.scheduler.max_batch_size)),
                max_num_batched_tokens=int(got.get("max_num_batched_tokens", r.scheduler.max_num_tokens)),
            ),
        )

    async def kv_event_sources(self) -> list[KvEventSource]:
        return []  # no blocks, no events: the router sees no overlap here

    async def health_check_payload(self) -> dict[str, Any] | None:
        bos = self.folder.genai_config().bos_token_id
        return build_health_check_payload(bos_token_id=1 if bos is None else bos)

    async def is_quiescent(self) -> bool:
        return True  # every answer is immediate

    async def abort(self, context: Context) -> None:
        return None

    async def cleanup(self) -> None:
        log.info("prefill stand-in stopped after %d hand-off(s)", self.handoffs)

    async def generate(
        self, request: GenerateRequest, context: Context
    ) -> AsyncGenerator[GenerateChunk, None]:
        n = len(request.get("token_ids") or ())
        if is_probe(request):  # a canary: one token back, the engine's way
            yield {
                "token_ids": [int(t) for t in request["token_ids"][:1]],
                "index": 0,
                "finish_reason": "length",
            }
            return
        enforce_prefill_max_tokens(request)
        self.handoffs += 1
        handoff = LocalPrefill(prompt_tokens=n, uncached_tokens=n, limit=0, fallback=True)
        yield {
            "token_ids": [],
            "index": 0,
            "finish_reason": "length",
            "completion_usage": {
                "prompt_tokens": n,
                "completion_tokens": 0,
                "total_tokens": n,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
            "disaggregated_params": handoff.to_json(),
        }


def _registration(trigger: Path) -> dict[str, Any]:
    """The prefill workers' runtime configuration the launcher wrote in the trigger file ({}: none known)."""
    try:
        got = json.loads(trigger.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def main(argv: list[str] | None = None) -> None:
    faulthandler.enable(all_threads=True)
    run(PrefillStandIn, argv)


if __name__ == "__main__":
    main()
