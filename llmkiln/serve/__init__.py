"""Serving: a Triton model repository for an engine, and the tritonserver that hosts it (CPU runtime)."""
