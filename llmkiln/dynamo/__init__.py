"""Scale-out serving on NVIDIA Dynamo: an OpenAI-compatible frontend with a KV-aware router in front of N llmkiln
workers (each one runs the CPU runtime in-process), plus the Kubernetes deployment written from a recipe.

- `worker`: the Dynamo engine class (`python -m llmkiln.dynamo.worker`); `prefill_standin`: the prefill tier's
  stand-in while no prefill worker is up; `registration`: what both register. These three import `dynamo`, so
  only worker processes load them.
- `kv_events`: the prefix block store's stored/removed blocks → Dynamo KV events (for the KV router).
- `options`: what a launch is asked for (`LaunchOptions`, shared by `kiln serve --dynamo` and `kiln deploy dynamo`;
  `DynamoOptions` for a local launch), checked in one place; `worker_options`: one worker's command line
  (`WorkerOptions`: written by the launcher and the deployment, parsed back by the worker).
- `cluster`: the process layout of one launch (frontend + N workers, environment, discovery folder);
  `launcher`: starts, supervises and stops it (`kiln serve ENGINE --dynamo`).
- `deploy`: `kiln deploy dynamo RECIPE -o DIR` (DynamoGraphDeployment, TensorRT-LLM LLM-API arguments).

Facts about Dynamo 1.6.1 on a CPU host that this package relies on: ../shared/reference/dynamo.md and
docs/serve.md ("Scale out with Dynamo").
"""
