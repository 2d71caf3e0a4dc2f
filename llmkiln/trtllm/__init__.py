"""The GPU backend's wing: TensorRT-LLM checkpoint, build plan, engine build, Triton repository, resume.

Everything here runs on a CPU host except the engine build itself (`trtllm-build`), which needs CUDA and
TensorRT-LLM; without them the build stops with exit 3 and a plan that `kiln build --resume` finishes on a
GPU host. The wing sits above the calibration and serve rooms (it uses ModelOpt calibration and the quality
gate) and below llmkiln.backends, which lists its stages.
"""
