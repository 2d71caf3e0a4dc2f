"""`kiln deploy dynamo`: the DynamoGraphDeployment, validated on CPU against what the ai-dynamo wheel ships — its
v1beta1 agg templates (dynamo/profiler/templates/dgd/*/agg.yaml) and its pydantic model of a DGD
(dynamo.profiler.utils.config.Config)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmkiln.cli.main import main
from llmkiln.dynamo.deploy import (
    DGD_FILE,
    DeployOptions,
    check_layout,
    cpu_worker_options,
    deployment,
    worker_memory_mib,
    write_deployment,
)
from llmkiln.dynamo.worker_options import WorkerOptions
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.recipe import load_recipe

MAX_LOCAL_PREFILL_TOKENS = KvTransferOptions().max_local_prefill_tokens

DYNAMO_ROOT = Path(importlib.util.find_spec("dynamo").submodule_search_locations[0])

# The wheel's DGD model lives in dynamo.profiler.utils.config, whose imports reach dynamo.planner's package
# __init__ (which needs scikit-learn, a planner-only dependency not installed): the check runs in a child
# process where dynamo.planner is a bare package, so only the modules config.py needs are loaded.
VALIDATE = """
import json, sys, types
from pathlib import Path
root = Path(sys.argv[1])
planner = types.ModuleType("dynamo.planner"); planner.__path__ = [str(root / "planner")]
sys.modules["dynamo.planner"] = planner
import yaml
from dynamo.profiler.utils.config import Config
doc = yaml.safe_load(open(sys.argv[2]))
cfg = Config.model_validate(doc)
again = cfg.model_dump()
print(json.dumps({"types": [c.component_type for c in cfg.spec.components], "same": again == doc}))
"""


def validate_with_wheel_model(path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", VALIDATE, str(DYNAMO_ROOT), str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def engines_root(engine_factory) -> Path:
    return engine_factory("stories-fp32").parent


def test_writes_a_valid_dgd_for_a_cpu_recipe(engines_root, tmp_path):
    out = tmp_path / "deploy"
    path = write_deployment("stories-fp32", out, DeployOptions(workers=3, engines_root=engines_root))
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "nvidia.com/v1beta1" and doc["kind"] == "DynamoGraphDeployment"
    frontend, worker = doc["spec"]["components"]
    assert (frontend["type"], worker["type"], worker["replicas"]) == ("frontend", "worker", 3)
    main_c = worker["podTemplate"]["spec"]["containers"][0]
    assert main_c["args"][:2] == ["-m", "llmkiln.dynamo.worker"]
    assert main_c["args"][main_c["args"].index("--engine") + 1] == "/engines/stories-fp32"
    assert main_c["resources"]["requests"] == main_c["resources"]["limits"]
    assert main_c["resources"]["requests"]["cpu"] == "2"
    assert main_c["args"][main_c["args"].index("--threads") + 1] == "2"
    assert "--role" not in main_c["args"]  # aggregated: the worker's default
    volume = worker["podTemplate"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"] == {"claimName": "llmkiln-engines", "readOnly": True}
    assert main_c["volumeMounts"][0] == {"name": "engines", "mountPath": "/engines", "readOnly": True}
    assert (out / "README.md").is_file()
    checked = validate_with_wheel_model(path)
    assert checked == {"types": ["frontend", "worker"], "same": True}


@pytest.mark.parametrize("backend", ["trtllm", "vllm", "sglang"])
def test_layout_matches_every_shipped_agg_template(engines_root, backend):
    recipe, _ = load_recipe("stories-fp32")
    doc = deployment(recipe, EngineDir(engines_root / "stories-fp32"), DeployOptions())
    template = yaml.safe_load((DYNAMO_ROOT / "profiler/templates/dgd" / backend / "agg.yaml").read_text())
    check_layout(doc, template)
    bad = json.loads(json.dumps(doc))
    bad["spec"]["components"][1]["type"] = "decoder"
    bad["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["privileged"] = True
    with pytest.raises(BadInput, match="decoder") as err:
        check_layout(bad, template)
    assert "privileged" in str(err.value)


def test_memory_covers_pools_store_and_weights(engines_root):
    recipe, _ = load_recipe("stories-fp32")
    doc = deployment(recipe, EngineDir(engines_root / "stories-fp32"), DeployOptions())
    memory = doc["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["resources"]["limits"][
        "memory"
    ]
    assert int(memory.removesuffix("Mi")) * 2**20 > recipe.kv_cache.max_bytes


def test_refusals(engines_root, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(BadInput, match="not empty"):
        write_deployment("stories-fp32", tmp_path / "full", DeployOptions(engines_root=engines_root))
    assert (tmp_path / "full" / "x").read_text() == "keep"
    with pytest.raises(BadInput, match="use a trtllm-llmapi recipe"):
        write_deployment("tiny-trtllm-fp8", tmp_path / "t", DeployOptions(engines_root=engines_root))
    with pytest.raises(BadInput, match="CPU pods .backends onnx-cpu, openvino-cpu.*serve this engine with"):
        write_deployment("tiny-onnx-gpu", tmp_path / "t", DeployOptions(engines_root=engines_root))
    with pytest.raises(BadInput, match="build the engine first"):
        write_deployment("stories-int8", tmp_path / "u", DeployOptions(engines_root=tmp_path / "none"))
    assert not (tmp_path / "t").exists() and not (tmp_path / "u").exists()


def test_cli(engines_root, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(
            [
                "deploy",
                "dynamo",
                "stories-fp32",
                "-o",
                str(tmp_path / "d"),
                "--replicas",  # another name of --workers
                "4",
                "--engines-dir",
                str(engines_root),
                "--image",
                "registry.local/llmkiln:test",
            ]
        )
    assert done.value.code == 0
    doc = yaml.safe_load((tmp_path / "d" / DGD_FILE).read_text())
    assert doc["spec"]["components"][1]["replicas"] == 4
    assert (
        doc["spec"]["components"][0]["podTemplate"]["spec"]["containers"][0]["image"]
        == "registry.local/llmkiln:test"
    )


def test_llm_api_recipe_gets_dynamo_trtllm_and_its_extra_engine_args(tmp_path):
    """trtllm-llmapi: `python -m dynamo.trtllm` with flags the wheel's parser defines, and the YAML is
    llm_api_options(recipe) (checked on CPU; not run on a GPU here)."""
    from llmkiln.dynamo.deploy import CONFIGMAP_FILE, LLM_API_FILE
    from llmkiln.trtllm.llmapi import llm_api_options

    out = tmp_path / "trt"
    path = write_deployment(
        "tiny-trtllm-llmapi", out, DeployOptions(workers=1, engines_root=tmp_path / "none")
    )
    doc = yaml.safe_load(path.read_text())
    worker = doc["spec"]["components"][1]
    main_c = worker["podTemplate"]["spec"]["containers"][0]
    assert main_c["command"] == ["python3", "-m", "dynamo.trtllm"]
    args = main_c["args"]
    parser_source = (DYNAMO_ROOT / "trtllm" / "backend_args.py").read_text()
    for flag in (a for a in args if a.startswith("--")):
        assert f'"{flag}"' in parser_source, flag
    assert args[args.index("--extra-engine-args") + 1] == f"/config/{LLM_API_FILE}"
    assert main_c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    recipe, _ = load_recipe("tiny-trtllm-llmapi")
    assert yaml.safe_load((out / LLM_API_FILE).read_text()) == llm_api_options(recipe)
    cm = yaml.safe_load((out / CONFIGMAP_FILE).read_text())
    assert cm["kind"] == "ConfigMap" and yaml.safe_load(cm["data"][LLM_API_FILE]) == llm_api_options(recipe)
    assert worker["podTemplate"]["spec"]["volumes"][1] == {
        "name": "llm-api",
        "configMap": {"name": cm["metadata"]["name"]},
    }
    assert validate_with_wheel_model(path) == {"types": ["frontend", "worker"], "same": True}


def test_disaggregated_cpu_recipe_gets_prefill_and_decode_components(engines_root, tmp_path):
    """--prefill-workers / --decode-workers: components as the wheel's disagg template (types prefill / decode),
    llmkiln workers with --role (their KV moves with NIXL); the wheel's DGD model accepts it."""
    out = tmp_path / "pd"
    opts = DeployOptions(prefill_workers=2, decode_workers=3, engines_root=engines_root)
    path = write_deployment("stories-fp32", out, opts)
    doc = yaml.safe_load(path.read_text())
    frontend, prefill, decode = doc["spec"]["components"]
    assert [c["type"] for c in (frontend, prefill, decode)] == ["frontend", "prefill", "decode"]
    assert (prefill["replicas"], decode["replicas"]) == (2, 3)
    for comp, role in ((prefill, "prefill"), (decode, "decode")):
        args = comp["podTemplate"]["spec"]["containers"][0]["args"]
        assert args[:2] == ["-m", "llmkiln.dynamo.worker"]
        assert args[args.index("--role") + 1] == role
        # the prefill tier decides which prompts the decode worker prefills itself; the decode tier caps its runs
        assert args[args.index("--max-local-prefill-tokens") + 1] == str(MAX_LOCAL_PREFILL_TOKENS)
        assert args[args.index("--kv-export-timeout") + 1] == "30"
    readme = (out / "README.md").read_text()
    assert "--prefill-workers 2 --decode-workers 3" in readme and "NIXL" in readme
    template = yaml.safe_load((DYNAMO_ROOT / "profiler/templates/dgd/trtllm/disagg.yaml").read_text())
    check_layout(doc, template)
    with pytest.raises(BadInput, match="types"):
        check_layout(doc)  # not the agg layout
    assert validate_with_wheel_model(path) == {"types": ["frontend", "prefill", "decode"], "same": True}


def test_disaggregated_llm_api_recipe_gets_role_yamls_with_cache_transceiver(tmp_path):
    """trtllm-llmapi with prefill/decode workers: `dynamo.trtllm --disaggregation-mode prefill|decode`, each with its LLM-API
    YAML (the aggregated options + cache_transceiver_config; overlap scheduler off on prefill, as Dynamo's
    examples), keys checked against the pinned TensorRT-LLM facts."""
    from llmkiln.dynamo.deploy import CONFIGMAP_FILE
    from llmkiln.trtllm.cache_transceiver import disaggregated_llm_api_options, facts
    from llmkiln.trtllm.facts import unknown_keys
    from llmkiln.trtllm.llmapi import llm_api_options

    out = tmp_path / "trt-pd"
    opts = DeployOptions(prefill_workers=1, decode_workers=1, engines_root=tmp_path / "none")
    path = write_deployment("tiny-trtllm-llmapi", out, opts)
    doc = yaml.safe_load(path.read_text())
    _, prefill, decode = doc["spec"]["components"]
    recipe, _ = load_recipe("tiny-trtllm-llmapi")
    parser_source = (DYNAMO_ROOT / "trtllm" / "backend_args.py").read_text()
    cm = yaml.safe_load((out / CONFIGMAP_FILE).read_text())
    for comp, role in ((prefill, "prefill"), (decode, "decode")):
        args = comp["podTemplate"]["spec"]["containers"][0]["args"]
        for flag in (a for a in args if a.startswith("--")):
            assert f'"{flag}"' in parser_source, flag
        assert args[args.index("--disaggregation-mode") + 1] == role
        assert args[args.index("--extra-engine-args") + 1] == f"/config/{role}.yaml"
        options = yaml.safe_load((out / f"{role}.yaml").read_text())
        assert options == disaggregated_llm_api_options(recipe, role)
        assert yaml.safe_load(cm["data"][f"{role}.yaml"]) == options
        assert options["cache_transceiver_config"]["backend"] == "DEFAULT"
        assert set(options["cache_transceiver_config"]) <= set(facts()["fields"])
        assert unknown_keys(options) == []
        rest = {
            k: v
            for k, v in options.items()
            if k not in ("cache_transceiver_config", "disable_overlap_scheduler")
        }
        agg = llm_api_options(recipe)
        assert rest == {k: v for k, v in agg.items() if k != "disable_overlap_scheduler"}
    assert "--publish-kv-events" in prefill["podTemplate"]["spec"]["containers"][0]["args"]
    assert yaml.safe_load((out / "prefill.yaml").read_text())["disable_overlap_scheduler"] is True
    assert validate_with_wheel_model(path) == {"types": ["frontend", "prefill", "decode"], "same": True}


def test_cli_prefill_and_decode_workers(engines_root, tmp_path):
    """`kiln deploy dynamo` takes `kiln serve --dynamo`'s flags of prefill/decode separation."""
    out = tmp_path / "pd-cli"
    flags = ["--prefill-workers", "1", "--decode-workers", "2", "--kv-export-timeout", "5"]
    flags += ["--max-local-prefill-tokens", "64", "--engines-dir", str(engines_root)]
    with pytest.raises(SystemExit) as done:
        main(["deploy", "dynamo", "stories-fp32", "-o", str(out), *flags])
    assert done.value.code == 0
    _, prefill, decode = yaml.safe_load((out / DGD_FILE).read_text())["spec"]["components"]
    assert (prefill["replicas"], decode["replicas"]) == (1, 2)
    for comp in (prefill, decode):
        args = comp["podTemplate"]["spec"]["containers"][0]["args"]
        assert args[args.index("--kv-export-timeout") + 1] == "5"
        assert args[args.index("--max-local-prefill-tokens") + 1] == "64"


@pytest.fixture(scope="module")
def ov_engines_root(engine_factory) -> Path:
    return engine_factory("stories-ov-fp32").parent


def test_an_openvino_recipe_gets_llmkilns_worker(ov_engines_root, tmp_path):
    """openvino-cpu runs in llmkiln's own Dynamo worker (as onnx-cpu): the same worker command, parsed back into
    the worker's options; memory sized from its IR and its block pools; the wheel's DGD model accepts it."""
    out = tmp_path / "ov"
    path = write_deployment("stories-ov-fp32", out, DeployOptions(workers=2, engines_root=ov_engines_root))
    doc = yaml.safe_load(path.read_text())
    frontend, worker = doc["spec"]["components"]
    assert (worker["name"], worker["type"], worker["replicas"]) == ("LlmkilnWorker", "worker", 2)
    main_c = worker["podTemplate"]["spec"]["containers"][0]
    assert main_c["command"] == ["python3"] and main_c["args"][:2] == ["-m", "llmkiln.dynamo.worker"]
    recipe, _ = load_recipe("stories-ov-fp32")
    parsed = WorkerOptions.from_argv(main_c["args"][2:])
    assert parsed == cpu_worker_options(recipe, DeployOptions(workers=2), WorkerRole.AGGREGATED)
    assert parsed.engine == Path("/engines/stories-ov-fp32") and parsed.threads == 2
    assert parsed.served_model_name == recipe.serve.model_name
    engine = EngineDir(ov_engines_root / "stories-ov-fp32")
    ir = engine.openvino_model()
    assert ir is not None
    memory = int(main_c["resources"]["limits"]["memory"].removesuffix("Mi")) * 2**20
    assert memory > ir.with_suffix(".bin").stat().st_size + recipe.kv_cache.max_bytes
    assert main_c["resources"]["limits"]["memory"] == f"{worker_memory_mib(recipe, engine)}Mi"
    # scheduler.prompt_graph: one more compiled copy of the (fp32) weights per graph
    assert not recipe.scheduler.prompt_graph
    twins = recipe.model_copy(
        update={"scheduler": recipe.scheduler.model_copy(update={"prompt_graph": True})}
    )
    grown = (worker_memory_mib(twins, engine) - worker_memory_mib(recipe, engine)) * 2**20
    graphs = 2 if recipe.kv_cache.cascade else 1
    assert abs(grown - graphs * ir.with_suffix(".bin").stat().st_size) <= 2**20
    assert "--no-router-track-active-blocks" in frontend["podTemplate"]["spec"]["containers"][0]["args"]
    assert "stories-ov-fp32" in (out / "README.md").read_text()
    assert validate_with_wheel_model(path) == {"types": ["frontend", "worker"], "same": True}
    # prefill/decode: its tiers too
    pd = deployment(recipe, engine, DeployOptions(prefill_workers=1, decode_workers=1))
    roles = [
        WorkerOptions.from_argv(c["podTemplate"]["spec"]["containers"][0]["args"][2:]).role
        for c in pd["spec"]["components"][1:]
    ]
    assert roles == [WorkerRole.PREFILL, WorkerRole.DECODE]
    # not built: refused with what to do (not "cannot run")
    with pytest.raises(BadInput, match="build the engine first"):
        deployment(recipe, None, DeployOptions())
