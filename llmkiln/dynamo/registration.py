"""What an llmkiln process registers with Dynamo: its worker configuration, and the record that tells the launcher
which discovery entries are its own.

Shared by the worker (llmkiln.dynamo.worker) and the prefill tier's stand-in (llmkiln.dynamo.prefill_standin),
whose registrations must agree field by field: the frontend keeps a tier's first configuration. This module
imports `dynamo`; the launcher only starts the processes that use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dynamo.common.backend import WorkerConfig
from dynamo.common.constants import DisaggregationMode

from llmkiln.atomic import write_text_atomic
from llmkiln.dynamo.cluster import INSTANCE_FILE_ENV
from llmkiln.dynamo.worker_options import WorkerOptions


def worker_config(
    args: WorkerOptions, model_dir: Path, served_model_name: str, mode: DisaggregationMode
) -> WorkerConfig:
    """The Dynamo worker configuration of a process started with `args` (file discovery unless the environment
    names another backend; TCP requests, ZMQ events)."""
    return WorkerConfig(
        namespace=args.namespace,
        component=args.component_name,
        endpoint=args.endpoint,
        model_name=str(model_dir),
        served_model_name=args.served_model_name or served_model_name,
        endpoint_types="chat,completions",
        discovery_backend=os.environ.get("DYN_DISCOVERY_BACKEND", "file"),
        request_plane="tcp",
        event_plane="zmq",
        enable_kv_routing=args.kv_events,
        disaggregation_mode=mode,
    )


def record_instance(worker_id: int) -> None:
    """Write this process's Dynamo instance id where the launcher said ($LLMKILN_INSTANCE_FILE,
    cluster.ClusterSpec.instance_file): which discovery entries are this process's. Nothing when unset."""
    record = os.environ.get(INSTANCE_FILE_ENV)
    if record:
        write_text_atomic(
            Path(record), json.dumps({"instance_id": worker_id, "pid": os.getpid()}), mode=0o600
        )
