#!/usr/bin/env bash
# The CPU-engine issue's "no regression elsewhere": the unique and mixed-long-short workloads at concurrency 8
# through Triton (`kiln serve`, gRPC streaming) for each engine given, one after the other on the same machine,
# with the same seeded requests (`kiln bench`). Reports (JSON) and a table go to OUT.
#
#   bash scripts/cpu_engine_other_workloads.sh OUT [RECIPE ...]     # default: bench-optimized bench-ov-fp32 bench-ov-bf16
#
# Engines are looked up (and built when missing) under $ENGINES (default ./engines). ~8 min on 2 idle cores.
# RATE=R: open loop instead (Poisson arrivals at R requests/s, at most 8 in flight); WORKLOADS="unique": a subset.
set -euo pipefail
OUT=${1:?usage: $0 OUT [RECIPE ...]}
shift
RECIPES=("$@")
[ ${#RECIPES[@]} -gt 0 ] || RECIPES=(bench-optimized bench-ov-fp32 bench-ov-bf16)
ENGINES=${ENGINES:-engines}
KILN=${KILN:-.venv/bin/kiln}
REQUESTS=${REQUESTS:-32}
WORKLOADS=${WORKLOADS:-unique mixed-long-short}
LOOP=()
SUFFIX=""
if [ -n "${RATE:-}" ]; then LOOP=(--request-rate "$RATE"); SUFFIX="-open$RATE"; fi
mkdir -p "$OUT"
for r in "${RECIPES[@]}"; do
  "$KILN" build "$r" --engines-dir "$ENGINES" --quiet
done
for r in "${RECIPES[@]}"; do
  read -r http grpc metrics < <(.venv/bin/python -c "from llmkiln.serve.ports import free_ports; print(*free_ports(3))")
  log="$OUT/serve-$r.log"
  "$KILN" serve "$ENGINES/$r" --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" >"$log" 2>&1 &
  pid=$!
  trap 'kill -INT $pid 2>/dev/null || true' EXIT
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$http/v2/health/ready" >/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "kiln serve $r died: see $log" >&2; exit 1; }
    sleep 1
  done
  for wl in $WORKLOADS; do
    echo "== $r $wl (load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$KILN" bench --url "127.0.0.1:$grpc" --tokenizer "$ENGINES/$r" --workload "$wl" --concurrency 8 \
      --requests "$REQUESTS" --warmup-requests 2 "${LOOP[@]}" --out "$OUT/$r-$wl$SUFFIX.json"
  done
  kill -INT $pid
  wait $pid || true
  trap - EXIT
done
