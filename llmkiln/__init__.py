"""llmkiln: an ahead-of-time build pipeline from an untouched LLM checkpoint to a served, low-TTFT engine."""

__version__ = "0.1.0"
