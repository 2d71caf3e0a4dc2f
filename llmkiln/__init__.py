"""llmkiln: an ahead-of-time build pipeline from an untouched LLM checkpoint to a served, low-TTFT engine."""

import os

__version__ = "0.1.0"

# onnxruntime 1.32 turns on Microsoft's usage telemetry (1DS) at import: it writes a session file into $TMPDIR and a
# database under ~/.cache/Microsoft/DeveloperTools, unless ORT_DISABLE_TELEMETRY is set (or CI is). llmkiln's
# processes, and the servers and workers they start (they inherit the environment), run with it off; a user who
# wants it sets ORT_DISABLE_TELEMETRY=0.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
