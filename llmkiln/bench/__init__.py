"""`kiln bench`: workloads, streaming clients (Triton gRPC, OpenAI), statistics, reports, compare, plots, peers,
the suffix-only floor, soak and profile. The project's experiments that use it live outside the package, in
experiments/."""
