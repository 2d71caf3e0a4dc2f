"""OpenVINO GenAI served as a Dynamo worker (experiments/ovgenai_dynamo_worker.py) without openvino-genai: its
command line read from llmkiln's worker arguments and the engine's recipe, and its requests through a stand-in
driver process that speaks the driver's JSON lines (the real driver needs the venv of
scripts/openvino_genai_env.sh; bench/results/cpu-speed-xeon/genai-served ran it). Nothing is timed."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from dynamo.llm.exceptions import EngineShutdown, InvalidArgument

from experiments import ovgenai_dynamo_worker as w

# The stand-in driver: "ready", then for every "add" its max tokens one line each (token = position), the last
# with reason "length" (more than 8: the first 8, and the request stays unfinished); a prompt of token 0 alone makes it exit (a driver that dies); every line it read is
# appended to the file named by argv[1].
FAKE_DRIVER = textwrap.dedent(
    """
    import json, sys
    log = open(sys.argv[1], "a")
    print(json.dumps({"ready": {"compiled": {"INFERENCE_PRECISION_HINT": "bf16"}}}), flush=True)
    for line in sys.stdin:
        log.write(line); log.flush()
        msg = json.loads(line)
        if msg["op"] != "add":
            continue
        if msg["ids"] == [0]:
            sys.exit(3)
        n = msg["max"]
        for k in range(min(n, 8)):  # a request of more than 8 tokens stays unfinished (a long generation)
            print(json.dumps({"id": msg["id"], "t": [k], "r": "length" if k == n - 1 else None}), flush=True)
    """
)


class Ctx:
    def __init__(self, rid: str) -> None:
        self._id = rid

    def id(self) -> str:
        return self._id


def engine(tmp_path: Path) -> Path:
    folder = tmp_path / "bench-ov-bf16"
    folder.mkdir()
    recipe = {
        "precision": "bf16",
        "scheduler": {"max_batch_size": 8, "max_num_tokens": 512},
        "limits": {"max_seq_len": 2048},
        "serve": {"model_name": "llmkiln"},
    }
    (folder / "recipe.resolved.yaml").write_text(yaml.safe_dump(recipe))
    return folder


def test_the_worker_reads_llmkilns_worker_arguments_and_the_recipe(tmp_path):
    folder = engine(tmp_path)
    argv = ["--engine", str(folder), "--threads", "2", "--overrides", '{"scheduler": {"max_batch_size": 32}}']
    worker, cfg = asyncio.run(w.GenAIWorker.from_args([*argv, "--no-kv-events", "--drain-timeout", "5"]))
    assert worker.settings.max_num_seqs == 32  # --overrides over the recipe
    assert worker.settings.max_num_batched_tokens == 512 and worker.settings.threads == 2
    assert worker.precision == "bf16" and worker.ctx == 2048
    assert cfg.served_model_name == "llmkiln" and cfg.model_name == str(folder.resolve())
    assert cfg.namespace == "llmkiln" and cfg.component == "backend" and cfg.endpoint == "generate"
    with pytest.raises(SystemExit, match="recipe.resolved.yaml"):
        asyncio.run(w.GenAIWorker.from_args(["--engine", str(tmp_path)]))


def test_requests_stream_through_the_driver_process(tmp_path):
    folder = engine(tmp_path)
    script = tmp_path / "driver.py"
    script.write_text(FAKE_DRIVER)
    seen = tmp_path / "seen.jsonl"

    async def scenario() -> None:
        worker, _ = await w.GenAIWorker.from_args(["--engine", str(folder)])
        worker.driver = w.DriverClient([sys.executable, str(script), str(seen)])
        assert (await asyncio.to_thread(worker.driver.start, 30))["compiled"][
            "INFERENCE_PRECISION_HINT"
        ] == "bf16"
        request = {
            "token_ids": [1, 5, 9],
            "stop_conditions": {"max_tokens": 4, "stop_token_ids_hidden": [2]},
            "sampling_options": {"temperature": 0.0},
        }
        chunks = [c async for c in worker.generate(request, Ctx("a"))]
        assert [c["token_ids"] for c in chunks] == [[0], [1], [2], [3]]
        assert chunks[-1]["finish_reason"] == "length" and "finish_reason" not in chunks[0]
        assert chunks[-1]["completion_usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
        }

        # a client that leaves after its first token: the driver is told to drop the request
        gen = worker.generate({**request, "stop_conditions": {"max_tokens": 50}}, Ctx("b"))
        assert (await gen.__anext__())["token_ids"] == [0]
        await gen.aclose()

        with pytest.raises(InvalidArgument, match="greedy"):
            await worker.generate({**request, "sampling_options": {"temperature": 0.7}}, Ctx("c")).__anext__()

        # the driver dies: the request in flight ends with an error, not a hang
        with pytest.raises(EngineShutdown, match="driver exited"):
            async for _ in worker.generate({**request, "token_ids": [0]}, Ctx("d")):
                pass
        await asyncio.to_thread(worker.driver.proc.wait, 10)
        with pytest.raises(EngineShutdown, match="driver exited"):  # a request after the driver died
            await worker.generate(request, Ctx("e")).__anext__()
        await worker.cleanup()
        assert worker.driver is None

    asyncio.run(asyncio.wait_for(scenario(), 60))
    sent = [json.loads(line) for line in seen.read_text().splitlines()]
    assert sent[0] == {"op": "add", "id": 1, "ids": [1, 5, 9], "max": 4, "ignore_eos": False, "stops": [2]}
    assert {"op": "drop", "id": 2} in sent
    assert not [m for m in sent if m.get("id") == 3]  # the sampled request never reached the driver
