#!/usr/bin/env bash
# Runtime benchmarks, as ratios against a baseline run in the same invocation:
#  1. step time of `piper-run` (one rank, strategies/single.piper) vs the plain LibTorch loop
#     (piper-train-ref) on the same model, data and batch: the executor's overhead;
#  2. the idle fraction of 1F1B pp=2 m=8 under mpirun, measured from piper-run's trace (gaps in each
#     rank's compute stream), against the formula (p-1)/(m+p-1);
#  3. the same in one process (threads as ranks, the in-process communicator: no MPI progress
#     threads), to separate the executor from the transport.
# Usage: bench/runtime_bench.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE OPENBLAS_NUM_THREADS=1
"$build/tools/piper-model" gpt --layers 4 --d-model 128 --heads 4 --ffn 512 --seq 128 -o "$tmp/m.pt"
common=(--data "$root/data/corpus.txt" --steps 25 --batch-size 16 --threads 1)
"$build/tools/piper-train-ref" "$tmp/m.pt" "${common[@]}" --metrics "$tmp/ref.jsonl" >/dev/null
"$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/single.piper" "${common[@]}" --metrics "$tmp/run.jsonl" >/dev/null
mpirun -np 2 --oversubscribe --bind-to none "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/1f1b.piper" \
  --set pp=2 --set mb=8 "${common[@]}" --trace "$tmp/trace.json" >/dev/null
/usr/bin/python3 - "$tmp" <<'PY'
import json, statistics, sys
tmp = sys.argv[1]
def step_times(p):
    rows = [json.loads(l) for l in open(p)]
    return [r["step_s"] for r in rows if "step_s" in r][5:]  # after warm-up
ref, run = statistics.median(step_times(f"{tmp}/ref.jsonl")), statistics.median(step_times(f"{tmp}/run.jsonl"))
print(f"1. step time, one device, 16 x 128 tokens: reference loop {ref*1e3:.1f} ms, piper-run {run*1e3:.1f} ms: "
      f"ratio {run/ref:.3f}")
ev = [e for e in json.load(open(f"{tmp}/trace.json"))["traceEvents"] if e.get("ph") == "X"]
p, m = 2, 8
fracs = []
for rank in sorted({e["pid"] for e in ev}):
    for step in range(6, 26):  # after warm-up
        ops = [e for e in ev if e["pid"] == rank and e["args"]["step"] == step]
        comp = [e for e in ops if e["tid"] == "compute"]
        if not comp:
            continue
        span_start = min(e["ts"] for e in ops)
        span_end = max(e["ts"] + e["dur"] for e in ops)
        busy = sum(e["dur"] for e in comp)
        fracs.append(1 - busy / (span_end - span_start))
formula = (p - 1) / (m + p - 1)
meas = statistics.median(fracs)
print(f"2. 1F1B pp=2 m=8, idle fraction of the compute streams: measured {meas:.3f}, formula (p-1)/(m+p-1) = "
      f"{formula:.3f}: ratio {meas/formula:.2f}")
PY
echo -n "3. "
"$build/bench/piper-bench-pipeline-idle" "$tmp/m.pt" "$root/strategies/1f1b.piper" 2 8 25
