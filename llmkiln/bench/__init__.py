"""`kiln bench`: workloads, a streaming Triton client, statistics, reports, plots, peers and the TTFT experiment."""
