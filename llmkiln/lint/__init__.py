"""`kiln lint-prompts`: will these requests hit the prefix cache, and if not, why not and what fixes it.

Requests are tokenized exactly as the runtime tokenizes them (the engine's tokenizer and chat template), the
prefix store is simulated with the runtime's own block keys, and every cause that breaks sharing is reported
with the requests it hits, a concrete fix and the hit rate after that fix (computed, not estimated).
"""
