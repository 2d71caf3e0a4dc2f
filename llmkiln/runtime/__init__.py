"""CPU runtime: the scheduler, the KV cache manager and the step plan, the onnxruntime and OpenVINO runners that execute it, behind a thread-safe engine."""
