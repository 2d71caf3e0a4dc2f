"""Build pipeline: a recipe plus an untouched checkpoint in, an engine folder out (see pipeline.py)."""
