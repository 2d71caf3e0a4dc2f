"""The exact commands that serve a trtllm-llmapi engine folder on a GPU host, written beside it (deploy.json for
scripts, DEPLOY.md for people): the `docker run` of the pinned container, taking the llmapi model code from the
container, `tritonserver` on the generated repository, and the equivalent `trtllm-serve` (OpenAI endpoint).

The docker line mounts the engine folder at the same path (model.yaml holds absolute paths), gives the python
backend shared memory (--shm-size) and installs nothing into the container: the model code is copied from the
container into the mounted repository, never pip-installed. Servers bind 127.0.0.1 and the recipe's ports;
open them deliberately (--http-address 0.0.0.0 behind your own network policy) when exposing the service.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from llmkiln.engine_dir import HF_CHECKPOINT_DIR
from llmkiln.recipe import Recipe
from llmkiln.trtllm import llmapi_repo, pins

SHM_SIZE = "2g"  # NVIDIA's own docker lines for the TensorRT-LLM containers use --shm-size=2g


def commands(recipe: Recipe, engine_dir: Path) -> dict[str, Any]:
    """{name: argv} for the engine folder that will live at `engine_dir` on the serving host."""
    e = Path(engine_dir)
    s = recipe.serve
    repo = e / "triton_repo"
    upstream = Path(pins.pin("llmapi_model_files")) / "1"
    docker = ["docker", "run", "--rm", "--gpus", "all", f"--shm-size={SHM_SIZE}", "--ulimit", "memlock=-1",
              "--ulimit", "stack=67108864", "--net", "host", "-v", f"{e}:{e}", "-w", str(e), pins.container()]  # fmt: skip
    take = [
        "cp",
        *[str(upstream / f) for f in llmapi_repo.UPSTREAM_FILES],
        str(repo / llmapi_repo.MODEL / "1") + "/",
    ]
    triton = ["tritonserver", f"--model-repository={repo}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
              "--metrics-address=127.0.0.1", f"--http-port={s.http_port}", f"--grpc-port={s.grpc_port}",
              f"--metrics-port={s.metrics_port}"]  # fmt: skip
    sched, t = recipe.scheduler, recipe.trtllm
    # The CLI flags repeat what llm_api_options.yaml says, so trtllm-serve's own defaults (e.g. max_batch_size
    # 2048) never apply even where a version reads the flags after the file.
    serve = ["trtllm-serve", str(e / HF_CHECKPOINT_DIR), "--backend", "pytorch", "--host", "127.0.0.1",
             "--port", str(s.http_port), "--tp_size", str(t.tp_size), "--pp_size", str(t.pp_size),
             "--max_batch_size", str(sched.max_batch_size), "--max_num_tokens", str(sched.max_num_tokens),
             "--max_seq_len", str(recipe.limits.max_seq_len),
             "--kv_cache_free_gpu_memory_fraction", str(recipe.kv_cache.free_gpu_memory_fraction),
             "--extra_llm_api_options", str(e / "llm_api_options.yaml")]  # fmt: skip
    return {
        "container": pins.container(),
        "tensorrt_llm": pins.pin("tensorrt_llm"),
        "docker_run": docker,
        "take_model_files": take,
        "tritonserver": triton,
        "trtllm_serve": serve,
        "warmup_texts": recipe.warmup.texts(),
    }


def deploy_markdown(recipe: Recipe, cmds: dict[str, Any]) -> str:
    docker = shlex.join(cmds["docker_run"])
    return f"""# Serving {recipe.name} (backend trtllm-llmapi) on a GPU host

Pinned container: `{cmds["container"]}` (TensorRT-LLM {cmds["tensorrt_llm"]}). FP8 needs a GPU with compute
capability >= {pins.pin("fp8_min_compute_capability")}. This folder must be at the same path on the GPU host.

## Triton (llmapi model, warmed up before READY)

```
{docker} bash -c '{shlex.join(cmds["take_model_files"])} && {shlex.join(cmds["tritonserver"])}'
```

The first command takes the llmapi model code (model.py, helpers.py) from the container into
triton_repo/tensorrt_llm/1/. To compare the container's config.pbtxt with llmkiln's first (I/O names,
parameters), use `kiln repo --check triton_repo --upstream-models {Path(pins.pin("llmapi_model_files")).parent}
--take-model-files` instead (scripts/gpu_verify.sh does).

Start tritonserver as above, not with upstream's `launch_triton_server.py`: that launcher always passes
`--disable-auto-complete-config` (NVIDIA/TensorRT-LLM@0a2e2c1:triton_backend/scripts/launch_triton_server.py,
`get_cmd`), and the llmapi model applies `triton_config` from 1/model.yaml (`max_batch_size: 0`, `decoupled:
true`) only in its `auto_complete_config`, which that flag skips: the model would load non-decoupled and refuse
streamed requests ("Streaming is only supported if model is deployed using decoupled mode"). What to do: use the
tritonserver command above (auto-complete on; tensor parallelism comes from `tensor_parallel_size` in
model.yaml, the LLM API starts its own workers). Where tooling insists on the launcher, take the command it
builds and drop `--disable-auto-complete-config` from it; do not move `max_batch_size` / `decoupled` into
config.pbtxt instead (`kiln repo --check` refuses that: model.py's auto_complete_config sets them).

## trtllm-serve (OpenAI-compatible endpoint)

```
{docker} {shlex.join(cmds["trtllm_serve"])}
```

trtllm-serve has no warmup before it reports ready: send the recipe's warmup prefixes
(deploy.json `warmup_texts`) once before routing traffic to it, so the first real request reuses their KV blocks.
"""
