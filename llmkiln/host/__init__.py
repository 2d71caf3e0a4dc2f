"""The engine host: one way to host a CPU engine behind a front door (the Triton python-backend model in
llmkiln.serve, the Dynamo worker in llmkiln.dynamo). It checks and loads the engine folder, runs the recipe's
warmup, reports health and metrics under one naming, drains and shuts down; the front doors are thin protocol
adapters on it (DESIGN.md, "Engine host")."""
