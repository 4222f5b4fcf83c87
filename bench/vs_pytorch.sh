#!/usr/bin/env bash
# piper-run against PyTorch itself (Debian's python3-torch), in one invocation: the same TorchScript
# model.pt, byte-token data, global batch 16, AdamW, cross-entropy.
#  - one process: PyTorch's plain loop vs piper-run single.piper, both with 1 and with 2 intra-op
#    threads;
#  - two processes: DistributedDataParallel on gloo (1 thread each) vs piper-run dp.piper dp=2 (its
#    default: cores / ranks = 1 thread each).
# Rounds alternate the contenders; each figure is the median over rounds of each run's median step
# (after 3 warm-up steps). No MCA flags or thread variables: piper-run configures its process itself.
# Usage: bench/vs_pytorch.sh [BUILD_DIR] [ROUNDS]
source "$(dirname "$0")/speed_setup.sh"
py=/usr/bin/python3  # Debian's, with python3-torch
data=$root/data/corpus.txt
steps=12
common=(--data "$data" --steps "$steps" --batch-size 16)
# PyTorch gets the thread settings piper-run gives itself: without them its OpenBLAS runs its own
# pool beside the intra-op threads (a "1 thread" loop used both cores) and idle OpenMP threads spin.
torch_env() {
  local t=$1
  shift
  OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t MKL_NUM_THREADS=$t OMP_WAIT_POLICY=PASSIVE "$@"
}
for r in $(seq 1 "$rounds"); do
  for t in 1 2; do
    torch_env "$t" "$py" "$root/bench/torch_baseline.py" loop "$tmp/m.pt" "$data" 128 16 "$steps" "$t" "$tmp/torch_loop_t$t.$r.json"
    "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/single.piper" "${common[@]}" --threads "$t" \
      --metrics "$tmp/piper_single_t$t.$r.jsonl" >/dev/null
  done
  torch_env 1 "$py" "$root/bench/torch_baseline.py" ddp "$tmp/m.pt" "$data" 128 16 "$steps" 1 "$tmp/torch_ddp.$r.json"
  mpirun -np 2 "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/dp.piper" "${common[@]}" \
    --metrics "$tmp/piper_dp2.$r.jsonl" >/dev/null
done
"$py" - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def rate(name, piper):
    per = []
    for r in range(1, rounds + 1):
        if piper:
            xs = [json.loads(l).get("tokens_per_s") for l in open(f"{tmp}/{name}.{r}.jsonl")]
            xs = [x for x in xs if x is not None]
        else:
            xs = json.load(open(f"{tmp}/{name}.{r}.json"))
        per.append(statistics.median(xs[3:]))
    return statistics.median(per), per
for label, torch_name, piper_name in [("one process, 1 thread", "torch_loop_t1", "piper_single_t1"),
                                      ("one process, 2 threads", "torch_loop_t2", "piper_single_t2"),
                                      ("dp=2 (DDP gloo vs dp.piper)", "torch_ddp", "piper_dp2")]:
    t, tp = rate(torch_name, False)
    p, pp = rate(piper_name, True)
    print(f"{label:30s} PyTorch {t:7.0f} tokens/s ({', '.join(f'{x:.0f}' for x in tp)})   "
          f"piper-run {p:7.0f} ({', '.join(f'{x:.0f}' for x in pp)})   ratio {p / t:.3f}")
PY
