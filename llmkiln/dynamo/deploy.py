"""`kiln deploy dynamo RECIPE -o DIR`: the Kubernetes DynamoGraphDeployment for a recipe's engine.

`DeployOptions` is the launch of `kiln serve --dynamo` (llmkiln.dynamo.options.LaunchOptions: the same flags,
defaults and checks — a flag that does not apply is refused by both with the same message) plus what a
cluster needs (image, volume, names, CPUs per pod).

Written (atomically, as one folder):
- `dynamo-graph-deployment.yaml`: `apiVersion: nvidia.com/v1beta1`, `kind: DynamoGraphDeployment` with a
  `Frontend` component (`python3 -m dynamo.frontend`, KV router, migration) and an `LlmkilnWorker` component
  (`python3 -m llmkiln.dynamo.worker` with the arguments of its `WorkerOptions`, `workers` replicas, CPU and
  memory requests = limits, the engine folder mounted read-only from a PersistentVolumeClaim) for a recipe of
  llmkiln's CPU runtime (onnx-cpu or openvino-cpu: both run in llmkiln's own Dynamo worker, the same command). Layout as in the upstream v1beta1 examples (the ai-dynamo
  wheel ships them: dynamo/profiler/templates/dgd/<backend>/agg.yaml): components[] with name, type
  (frontend | worker), replicas, podTemplate.spec.containers[] (name main, image, command, args, resources).
  Discovery is the operator's business in a cluster (it sets the backend); nothing here pins it.
- `README.md`: what to copy where and how to apply it.

Recipes on TensorRT-LLM's LLM-API path (backend trtllm-llmapi) get a `TrtllmWorker` component instead:
`python3 -m dynamo.trtllm --model <checkpoint> --served-model-name NAME --extra-engine-args /config/llm_api.yaml
--publish-kv-events`, GPUs = tp × pp, the upstream tensorrtllm-runtime image; the `--extra-engine-args` YAML is
`llm_api_options(recipe, target="dynamo")` (llmkiln.trtllm.llmapi, the one recipe → LLM(**kwargs) mapping, for the
TensorRT-LLM of Dynamo's runtime image, pins.json dynamo_tensorrt_llm, checked against its facts), written as
`llm_api.yaml` and as the ConfigMap `llm-api-configmap.yaml` mounted at /config. The checkpoint is the ModelOpt
unified HF checkpoint inside the engine folder (`--checkpoint`, default <recipe>/hf_checkpoint on the volume).
Refused: onnx-gpu (the deployment writes CPU pods for llmkiln's worker; serve it with `kiln serve`) and
Triton-engine trtllm recipes (dynamo.trtllm 1.6.1 loads HF checkpoints on the PyTorch backend, not trtllm-build
engines).

`--prefill-workers P --decode-workers D` (as `kiln serve --dynamo`) writes the prefill/decode variant, laid out
as the wheel's disagg template (dynamo/profiler/templates/dgd/trtllm/disagg.yaml: components `prefill` and
`decode` of types prefill / decode beside the Frontend): CPU recipes get `LlmkilnPrefill` (`--role prefill
--kv-export-timeout S --max-local-prefill-tokens N`, KV moved by NIXL, llmkiln.host.kv_transfer) and
`LlmkilnDecode` (`--role decode`, the same N: it caps the decode worker's prefill runs); LLM-API recipes get
`TrtllmPrefill` /
`TrtllmDecode` (`python3 -m dynamo.trtllm ... --disaggregation-mode prefill --publish-kv-events` / `decode`)
with `prefill.yaml` / `decode.yaml` = `disaggregated_llm_api_options(recipe, role)` (llmkiln.trtllm.
cache_transceiver: the aggregated options plus cache_transceiver_config, overlap scheduler off on prefill), both
in the ConfigMap.

`check_layout(doc)` compares a document with the wheel's agg (or disagg) template (apiVersion, kind, the component and
container fields used); the tests also validate it with the wheel's own pydantic model of a DGD.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from llmkiln.atomic import atomic_dir, replace_dir
from llmkiln.capabilities import Backend
from llmkiln.dynamo.options import LaunchOptions
from llmkiln.dynamo.worker_options import WORKER_MODULE, WorkerOptions
from llmkiln.engine_dir import HF_CHECKPOINT_DIR, EngineDir, default_engines_root
from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import TIERS, WorkerRole
from llmkiln.recipe import Recipe, load_recipe
from llmkiln.runtime.kv_quant import bytes_per_block
from llmkiln.trtllm import pins
from llmkiln.trtllm.cache_transceiver import Role, disaggregated_llm_api_options
from llmkiln.trtllm.facts import FACTS_FILES, check_options
from llmkiln.trtllm.llmapi import llm_api_options
from llmkiln.versions import package_versions

API_VERSION = "nvidia.com/v1beta1"
KIND = "DynamoGraphDeployment"
DGD_FILE = "dynamo-graph-deployment.yaml"
ENGINES_MOUNT = "/engines"
MIB = 2**20
# What a worker process needs besides its KV pools, store and weights (Python, onnxruntime, Dynamo runtime):
# measured ~90-110 MB RSS for a Dynamo worker before its model (../shared/reference/dynamo.md), plus slack.
WORKER_BASE_MIB = 512
FRONTEND_MEMORY = "1Gi"
TEMPLATE = ("profiler", "templates", "dgd", "trtllm", "agg.yaml")  # in the ai-dynamo wheel
TRTLLM_IMAGE = str(pins.pin("dynamo_trtllm_image"))  # as in the upstream v1beta1 examples (pins.json)
DISAGG_TEMPLATE = ("profiler", "templates", "dgd", "trtllm", "disagg.yaml")
# the tiers of a disaggregated LLM-API deployment: dynamo.trtllm's role names and options files
TRTLLM_ROLES: dict[WorkerRole, Role] = {WorkerRole.PREFILL: "prefill", WorkerRole.DECODE: "decode"}
ROLE_FILES = {WorkerRole.PREFILL: "prefill.yaml", WorkerRole.DECODE: "decode.yaml"}
# llmkiln's CPU runtime: every such recipe runs in llmkiln's Dynamo worker (python -m llmkiln.dynamo.worker)
CPU_BACKENDS = (Backend.ONNX_CPU, Backend.OPENVINO_CPU)
LLM_API_FILE = "llm_api.yaml"
CONFIGMAP_FILE = "llm-api-configmap.yaml"
CONFIG_MOUNT = "/config"
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class DeployOptions(LaunchOptions):
    """`kiln deploy dynamo`: the launch (workers or prefill + decode workers, router, migration, KV transfer:
    LaunchOptions) and the cluster's part. None = the default noted."""

    threads_per_worker: int = 2  # CPU request/limit and intra-op threads of each CPU worker
    image: str | None = None  # default llmkiln:<version> (an image with llmkiln and ai-dynamo installed)
    engine_pvc: str = "llmkiln-engines"  # PVC holding the engines root (engines/<recipe>/ ...)
    name: str | None = None  # metadata.name; default llmkiln-<recipe>
    namespace: str | None = None
    http_port: int | None = None  # the frontend's port; default the recipe's serve.http_port
    engines_root: Path | None = None  # to size memory from the built engine
    checkpoint: str | None = (
        None  # trtllm-llmapi: checkpoint folder on the volume (default <recipe>/hf_checkpoint)
    )

    def check(self) -> None:
        super().check()
        if self.threads_per_worker < 1:
            raise BadInput(
                f"--threads-per-worker must be >= 1 (each worker pod's CPUs), got {self.threads_per_worker}"
            )
        if self.http_port is not None and not 1 <= self.http_port <= 65535:
            raise BadInput(f"http_port {self.http_port} is out of range")

    def replicas(self, role: WorkerRole) -> int:
        """Pods of a role's component."""
        if role is WorkerRole.PREFILL:
            return self.prefill_workers
        return self.decode_workers if role is WorkerRole.DECODE else self.workers


def _k8s_name(text: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    if not _DNS1123.match(name):
        raise BadInput(f"cannot make a Kubernetes name from {text!r}; give --name")
    return name


def worker_memory_mib(recipe: Recipe, engine: EngineDir | None) -> int:
    """Memory a CPU worker needs: its KV pools (from the engine's shapes), the prefix store's byte budget, the
    weights, and a base. onnx-cpu: fp32 slot pools. openvino-cpu: its block pools in the inference precision,
    the slots' runs plus shared blocks for as many tokens as the store holds (llmkiln.runtime.openvino_runner),
    and the weights once more in each compiled graph (the cascade graph and the prompt graphs are copies).
    Without a built engine the pools and weights are unknown: BadInput."""
    model_files = _model_files(recipe, engine)
    if engine is None or not model_files:
        raise BadInput(
            f"recipe {recipe.name}: build the engine first (`kiln build {recipe.name}`); the deployment mounts "
            "that folder and sizes the workers' memory from it"
        )
    info = engine.genai_config()
    kv = recipe.kv_cache
    value_bytes = 2 if recipe.backend is Backend.OPENVINO_CPU and recipe.precision == "bf16" else 4
    per_token = 2 * info.num_layers * info.kv_heads * info.head_size * value_bytes  # k and v, every layer
    pools = recipe.scheduler.max_batch_size * recipe.limits.max_seq_len * per_token
    store = kv.max_bytes if kv.prefix_reuse else 0
    shared = 0
    if recipe.backend is Backend.OPENVINO_CPU and store:
        block = bytes_per_block(kv.dtype, info.num_layers, info.kv_heads, kv.tokens_per_block, info.head_size)
        shared = store // block * kv.tokens_per_block * per_token
    weights = sum(f.stat().st_size for f in model_files)
    if recipe.backend is Backend.OPENVINO_CPU:
        # each compiled graph holds the weights once more, in the inference precision
        graphs = (2 if kv.cascade else 1) * (2 if recipe.scheduler.prompt_graph else 1)
        weights += graphs * weights * value_bytes // 4  # the IR's are fp32 (or int8: an overestimate)
    return WORKER_BASE_MIB + -(-(pools + shared + store + weights) // MIB)


def _model_files(recipe: Recipe, engine: EngineDir | None) -> list[Path]:
    """The engine's model files (the ONNX graph and its data, or the OpenVINO IR); [] when not built."""
    if engine is None:
        return []
    if recipe.backend is Backend.OPENVINO_CPU:
        xml = engine.openvino_model()
        if xml is None:
            return []
        return [xml, xml.with_suffix(".bin")]
    if not engine.has_onnx_model():
        return []
    return [f for f in engine.path.glob("model.onnx*") if f.is_file()]


def configmap_name(doc: dict[str, Any]) -> str:
    return f"{doc['metadata']['name']}-llm-api"[:63].rstrip("-")


def http_port(recipe: Recipe, opts: DeployOptions) -> int:
    """The frontend's port: the options', else the recipe's serve.http_port."""
    return recipe.serve.http_port if opts.http_port is None else opts.http_port


def deployment(recipe: Recipe, engine: EngineDir | None, opts: DeployOptions) -> dict[str, Any]:
    """The DynamoGraphDeployment document: llmkiln's worker (onnx-cpu, openvino-cpu) or dynamo.trtllm
    (trtllm-llmapi)."""
    trt = recipe.backend is Backend.TRTLLM_LLMAPI
    if recipe.backend not in CPU_BACKENDS and not trt:
        raise BadInput(
            f"recipe {recipe.name}: backend {recipe.backend.value!r}: `kiln deploy dynamo` writes llmkiln's "
            f"Dynamo worker on CPU pods (backends {', '.join(b.value for b in CPU_BACKENDS)}) or dynamo.trtllm on "
            "GPU pods, which loads HF checkpoints on TensorRT-LLM's PyTorch backend, not trtllm-build engines: "
            "use a trtllm-llmapi recipe"
            + (" (or serve this engine with `kiln serve`)" if recipe.backend is Backend.ONNX_GPU else "")
        )
    if trt:
        cpu_only = [f for f in KvTransferOptions.FLAGS.values() if f in opts.tier_flags_given()]
        if cpu_only:
            raise BadInput(
                f"{', '.join(cpu_only)}: flag(s) of llmkiln's CPU workers (their KV moves with NIXL); recipe "
                f"{recipe.name} runs dynamo.trtllm, whose cache transceiver moves the KV: remove them"
            )
    elif opts.disaggregated and not recipe.kv_cache.prefix_reuse:
        raise BadInput(
            f"recipe {recipe.name}: prefill/decode separation moves the prompt's KV through the prefix store, "
            "and kv_cache.prefix_reuse is off"
        )
    version = package_versions(("llmkiln",)).get("llmkiln") or "latest"
    image = opts.image or (TRTLLM_IMAGE if trt else f"llmkiln:{version}")
    metadata: dict[str, Any] = {"name": _k8s_name(opts.name or f"llmkiln-{recipe.name}")}
    if opts.namespace:
        metadata["namespace"] = _k8s_name(opts.namespace)
    frontend_args = [
        "-m",
        "dynamo.frontend",
        "--http-port",
        str(http_port(recipe, opts)),
        "--router-mode",
        opts.router_mode,
        "--migration-limit",
        str(opts.migration_limit),
        *(
            ["--no-router-track-active-blocks"]  # CPU workers: see llmkiln.dynamo.cluster
            if opts.router_mode == "kv" and not trt
            else []
        ),
    ]
    frontend = _component(
        "Frontend",
        "frontend",
        1,
        {
            "name": "main",
            "image": image,
            "command": ["python3"],
            "args": frontend_args,
            "resources": _cpu_resources("1", FRONTEND_MEMORY),
        },
    )
    components = [frontend]
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": {"components": components}}
    roles = TIERS if opts.disaggregated else (WorkerRole.AGGREGATED,)
    for role in roles:
        components.append(
            trtllm_worker(recipe, image, opts, configmap_name(doc), role)
            if trt
            else cpu_worker(recipe, engine, image, opts, role)
        )
    return doc


def cpu_worker_options(recipe: Recipe, opts: DeployOptions, role: WorkerRole) -> WorkerOptions:
    """The llmkiln worker of a pod: the engine on the volume, its CPUs as intra-op threads, the recipe's drain
    time, and for a prefill or decode pod its role with the launch's KV transfer options."""
    return WorkerOptions(
        engine=Path(f"{ENGINES_MOUNT}/{recipe.name}"),
        served_model_name=recipe.serve.model_name,
        threads=opts.threads_per_worker,
        drain_timeout_s=float(recipe.serve.exit_timeout_s),
        role=role,
        kv=opts.kv,
    )


def cpu_worker(
    recipe: Recipe,
    engine: EngineDir | None,
    image: str,
    opts: DeployOptions,
    role: WorkerRole = WorkerRole.AGGREGATED,
) -> dict[str, Any]:
    """The llmkiln worker component (CPU requests = limits = its intra-op threads; memory from the engine); a
    prefill or decode role makes it that tier's component."""
    memory = f"{worker_memory_mib(recipe, engine)}Mi"
    container = {
        "name": "main",
        "image": image,
        "command": ["python3"],
        "args": ["-m", WORKER_MODULE, *cpu_worker_options(recipe, opts, role).to_argv()],
        "resources": _cpu_resources(str(opts.threads_per_worker), memory),
        "volumeMounts": [{"name": "engines", "mountPath": ENGINES_MOUNT, "readOnly": True}],
    }
    volumes = [_engines_volume(opts)]
    if role is WorkerRole.AGGREGATED:
        return _component("LlmkilnWorker", "worker", opts.replicas(role), container, volumes)
    return _component(
        f"Llmkiln{role.value.capitalize()}", role.value, opts.replicas(role), container, volumes
    )


def _component(
    name: str,
    kind: str,
    replicas: int,
    container: dict[str, Any],
    volumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One DynamoGraphDeployment component: `replicas` pods of one container (and its volumes)."""
    spec: dict[str, Any] = {"containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    return {"name": name, "type": kind, "replicas": replicas, "podTemplate": {"spec": spec}}


def _cpu_resources(cpu: str, memory: str) -> dict[str, Any]:
    """Requests = limits (a Guaranteed pod: its cores are its own)."""
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


def _engines_volume(opts: DeployOptions) -> dict[str, Any]:
    return {"name": "engines", "persistentVolumeClaim": {"claimName": opts.engine_pvc, "readOnly": True}}


def trtllm_args(recipe: Recipe, opts: DeployOptions, role: WorkerRole = WorkerRole.AGGREGATED) -> list[str]:
    """`python -m dynamo.trtllm` arguments for an LLM-API recipe (flag names of ai-dynamo 1.6.1's
    dynamo/trtllm/backend_args.py; --model was --model-path before). A role adds `--disaggregation-mode` and
    that role's options file; KV events from the aggregated and prefill tiers (as the wheel's disagg template)."""
    checkpoint = opts.checkpoint or f"{recipe.name}/{HF_CHECKPOINT_DIR}"
    args = [
        "--model",
        f"{ENGINES_MOUNT}/{checkpoint}",
        "--served-model-name",
        recipe.serve.model_name,
        "--extra-engine-args",
        f"{CONFIG_MOUNT}/{ROLE_FILES.get(role, LLM_API_FILE)}",
    ]
    if role.moves_kv:
        args += ["--disaggregation-mode", TRTLLM_ROLES[role]]
    if role is not WorkerRole.DECODE:
        args.append("--publish-kv-events")
    return args


def trtllm_worker(
    recipe: Recipe,
    image: str,
    opts: DeployOptions,
    configmap: str,
    role: WorkerRole = WorkerRole.AGGREGATED,
) -> dict[str, Any]:
    """The dynamo.trtllm worker component: GPUs = tp × pp, the LLM-API YAML from a ConfigMap."""
    gpus = str(recipe.trtllm.tp_size * recipe.trtllm.pp_size)
    container = {
        "name": "main",
        "image": image,
        "command": ["python3", "-m", "dynamo.trtllm"],
        "args": trtllm_args(recipe, opts, role),
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [
            {"name": "engines", "mountPath": ENGINES_MOUNT, "readOnly": True},
            {"name": "llm-api", "mountPath": CONFIG_MOUNT, "readOnly": True},
        ],
    }
    volumes = [_engines_volume(opts), {"name": "llm-api", "configMap": {"name": configmap}}]
    if role is WorkerRole.AGGREGATED:
        return _component("TrtllmWorker", "worker", opts.replicas(role), container, volumes)
    return _component(f"Trtllm{role.value.capitalize()}", role.value, opts.replicas(role), container, volumes)


def llm_api_files(recipe: Recipe, disaggregated: bool = False) -> dict[str, dict[str, Any]]:
    """File name -> LLM-API options: llm_api.yaml, or prefill.yaml and decode.yaml (disaggregated)."""
    if not disaggregated:
        return {LLM_API_FILE: dynamo_llm_api_options(recipe)}
    out = {ROLE_FILES[role]: disaggregated_llm_api_options(recipe, TRTLLM_ROLES[role]) for role in TIERS}
    for file, options in out.items():
        check_options(options, file, target="dynamo")
    return out


def llm_api_configmap(
    recipe: Recipe, name: str, namespace: str | None, disaggregated: bool = False
) -> dict[str, Any]:
    """The ConfigMap holding llm_api.yaml (= llm_api_options(recipe)), or prefill.yaml and decode.yaml."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    header = llm_api_header(recipe)
    data = {
        f: header + yaml.safe_dump(o, sort_keys=False)
        for f, o in llm_api_files(recipe, disaggregated).items()
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def dynamo_llm_api_options(recipe: Recipe) -> dict[str, Any]:
    """llm_api_options(recipe) for the TensorRT-LLM dynamo.trtllm runs (pins.json dynamo_tensorrt_llm), checked
    against that version's facts (llm_args_facts_1.3.0rc29.json), not the Triton container's."""
    options = llm_api_options(recipe, target="dynamo")
    check_options(options, LLM_API_FILE, target="dynamo")
    return options


def llm_api_header(recipe: Recipe) -> str:
    """The comment every generated file for dynamo.trtllm starts with: the TensorRT-LLM version it targets."""
    return (
        f"# TensorRT-LLM {pins.pin('dynamo_tensorrt_llm')} (Dynamo {pins.pin('dynamo')}'s dynamo.trtllm, image "
        f"{pins.pin('dynamo_trtllm_image')})\n"
        f"# LLM(**kwargs) from recipe {recipe.name}, checked against {FACTS_FILES['dynamo'].name}\n"
    )


def shipped_template(disaggregated: bool = False) -> dict[str, Any]:
    """The v1beta1 agg (or disagg) blueprint the ai-dynamo wheel ships (read as a file; nothing of dynamo is
    imported)."""
    path = resources.files("dynamo")
    for part in DISAGG_TEMPLATE if disaggregated else TEMPLATE:
        path = path.joinpath(part)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not a YAML mapping")
    return data


def check_layout(doc: dict[str, Any], template: dict[str, Any] | None = None) -> None:
    """BadInput unless `doc` has the template's apiVersion and kind, components of its types, and only container
    fields the template uses plus the Kubernetes ones we add (env, volumeMounts, ports)."""
    t = template if template is not None else shipped_template()
    problems = []
    for key in ("apiVersion", "kind"):
        if doc.get(key) != t.get(key):
            problems.append(f"{key}: {doc.get(key)!r}, the shipped template has {t.get(key)!r}")
    t_components = t["spec"]["components"]
    types = {c["type"] for c in t_components}
    comp_keys = set().union(*(c.keys() for c in t_components))
    cont_keys = set().union(*(k.keys() for c in t_components for k in c["podTemplate"]["spec"]["containers"]))
    cont_keys |= {"env", "volumeMounts", "ports"}
    components = doc.get("spec", {}).get("components")
    if not isinstance(components, list) or not components:
        problems.append("spec.components: expected a non-empty list")
        components = []
    for i, c in enumerate(components):
        where = f"spec.components[{i}]"
        if c.get("type") not in types:
            problems.append(f"{where}.type: {c.get('type')!r} is not one of {sorted(types)}")
        if set(c) - comp_keys:
            problems.append(f"{where}: fields {sorted(set(c) - comp_keys)} are not in the template")
        if not isinstance(c.get("replicas"), int) or c["replicas"] < 1:
            problems.append(f"{where}.replicas: expected an integer >= 1")
        for j, k in enumerate(c.get("podTemplate", {}).get("spec", {}).get("containers", [])):
            extra = set(k) - cont_keys
            if extra:
                problems.append(f"{where}.containers[{j}]: fields {sorted(extra)} are not in the template")
    if {c.get("type") for c in components} != types:
        problems.append(f"expected components of the types {sorted(types)}, one each")
    if problems:
        raise BadInput(
            "the DynamoGraphDeployment does not match the shipped v1beta1 layout:\n  " + "\n  ".join(problems)
        )


def write_deployment(recipe_name: str, out_dir: Path, opts: DeployOptions, force: bool = False) -> Path:
    """Write the deployment folder for a recipe (see the module docstring); returns the DGD file."""
    recipe, _ = load_recipe(recipe_name)
    root = opts.engines_root if opts.engines_root is not None else default_engines_root()
    engine = EngineDir((root / recipe.name).resolve())
    doc = deployment(recipe, engine if engine.exists() else None, opts)
    check_layout(doc, shipped_template(opts.disaggregated))
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise BadInput(f"-o {out_dir}: the folder is not empty; give --force to replace it")
    with atomic_dir(out_dir, publish=replace_dir) as tmp:  # non-empty folders were refused above
        header = llm_api_header(recipe) if recipe.backend is Backend.TRTLLM_LLMAPI else ""
        (tmp / DGD_FILE).write_text(header + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        if recipe.backend is Backend.TRTLLM_LLMAPI:
            for file, options in llm_api_files(recipe, opts.disaggregated).items():
                (tmp / file).write_text(header + yaml.safe_dump(options, sort_keys=False), encoding="utf-8")
            cm = llm_api_configmap(
                recipe, configmap_name(doc), doc["metadata"].get("namespace"), opts.disaggregated
            )
            (tmp / CONFIGMAP_FILE).write_text(header + yaml.safe_dump(cm, sort_keys=False), encoding="utf-8")
        (tmp / "README.md").write_text(readme(recipe, doc, opts), encoding="utf-8")
    return out_dir / DGD_FILE


def readme(recipe: Recipe, doc: dict[str, Any], opts: DeployOptions) -> str:
    text = _readme(recipe, doc, opts)
    if not opts.disaggregated:
        return text
    workers = doc["spec"]["components"][1:]
    lines = [
        "",
        f"## Prefill/decode separation (`--prefill-workers {opts.prefill_workers} --decode-workers "
        f"{opts.decode_workers}`)",
        "",
        "Laid out as the ai-dynamo wheel's disagg template (dynamo/profiler/templates/dgd/trtllm/disagg.yaml):",
    ]
    for c in workers:
        args = " ".join(c["podTemplate"]["spec"]["containers"][0]["args"])
        lines.append(f"- `{c['name']}` (type {c['type']}, {c['replicas']} replica(s)): `{args}`")
    if recipe.backend is Backend.TRTLLM_LLMAPI:
        lines.append(
            "- `prefill.yaml` / `decode.yaml` (in the ConfigMap): the aggregated LLM-API options plus "
            "`cache_transceiver_config` (TensorRT-LLM moves the KV), overlap scheduler off on prefill workers."
        )
    else:
        lines.append(
            "- the prompt's KV moves from prefill to decode pods with NIXL (UCX): pods must reach each other "
            "directly (UCX picks TCP between nodes, shared memory on one)."
        )
        lines.append(
            f"- `--max-local-prefill-tokens {opts.kv.max_local_prefill_tokens}` on both tiers: a prompt whose "
            "uncached part is at most that many tokens is prefilled on the decode worker instead (it never waits at "
            "the prefill tier; 0: every prompt through it), in runs of at most that many tokens; "
            f"`--kv-export-timeout {opts.kv.export_timeout_s:g}`: a prefill pod releases KV no decode pod read "
            "after that many seconds."
        )
    return text + "\n".join(lines) + "\n"


def _readme(recipe: Recipe, doc: dict[str, Any], opts: DeployOptions) -> str:
    name = doc["metadata"]["name"]
    workers = (
        f"{opts.prefill_workers} prefill + {opts.decode_workers} decode"
        if opts.disaggregated
        else str(opts.workers)
    )
    if recipe.backend is Backend.TRTLLM_LLMAPI:
        args = " ".join(doc["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["args"])
        return f"""# {name}: recipe `{recipe.name}` on NVIDIA Dynamo with TensorRT-LLM (LLM API, PyTorch backend)

1. Build the checkpoint (`kiln build {recipe.name}`) and copy the engine folder into the PersistentVolumeClaim
   `{opts.engine_pvc}` (mounted read-only at `{ENGINES_MOUNT}`).
2. `kubectl apply -f {CONFIGMAP_FILE} -f {DGD_FILE}` (the Dynamo operator installed; GPU nodes).

Targets TensorRT-LLM {pins.pin("dynamo_tensorrt_llm")} (the image `{pins.pin("dynamo_trtllm_image")}`), not the
Triton container's {pins.pin("tensorrt_llm")}: `{LLM_API_FILE}` is checked against {FACTS_FILES["dynamo"].name}.

Worker: `python3 -m dynamo.trtllm {args}`; `{LLM_API_FILE}` (also in the ConfigMap) is
`llm_api_options(recipe)`, TensorRT-LLM's LLM(**kwargs). Written by `kiln deploy dynamo` on a CPU host: checked
against the v1beta1 layout the ai-dynamo wheel ships, not run on a GPU here.
"""
    return f"""# {name}: recipe `{recipe.name}` on NVIDIA Dynamo (Kubernetes)

1. Build the engine (`kiln build {recipe.name}`) and copy `engines/{recipe.name}/` into the PersistentVolumeClaim
   `{opts.engine_pvc}` (it is mounted read-only at `{ENGINES_MOUNT}`; the worker reads `{ENGINES_MOUNT}/{recipe.name}`).
2. Use an image with llmkiln and ai-dynamo 1.6.1 installed (`make setup` does it in a venv); set it in
   `{DGD_FILE}` (now `{doc["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0]["image"]}`).
3. With the Dynamo operator installed: `kubectl apply -f {DGD_FILE}`; the OpenAI API is the Frontend
   component's port {http_port(recipe, opts)}.

{workers} worker(s), {opts.threads_per_worker} CPU(s) each (= their engine's compute threads); router
`{opts.router_mode}`, migration limit {opts.migration_limit}. Written by `kiln deploy dynamo`; checked against
the v1beta1 layout shipped in the ai-dynamo wheel, not applied to a cluster here.
"""
