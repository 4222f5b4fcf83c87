#!/usr/bin/env bash
# Context parallelism measured: gpt 8 layers, d 128, ffn 512, at a sequence of 512 tokens,
# 1. memory at batch 2 (3 steps, --metrics): the fullest rank's activations at its peak, one rank
#    against cp=2, beside the memory model's prediction (piper-check --emit sim-json);
# 2. the ring's bytes per step, measured (rank 0's sends on its context channel, metrics
#    `ring_bytes`) beside the cost model's (the plan report's "ring exchange (in pieces)" row);
# 3. speed at batch 4: tokens/s of one rank, dp=2 and cp=2 (2 ranks on this machine's 2 cores),
#    each round running all three; the ratios to one rank; and cp=2's step simulated (with a
#    `piper-run --profile` of this machine) beside measured.
# Prints every round and the median over rounds with the spread.
# Usage: bench/cp_bench.sh [BUILD_DIR] [ROUNDS]   (ROUNDS 0: memory and bytes only)
source "$(dirname "$0")/speed_setup.sh"
source "$(dirname "$0")/layer_bench_lib.sh"
export OMP_NUM_THREADS=1
"$build/tools/piper-model" gpt --layers 8 --d-model 128 --ffn 512 --heads 4 --seq 512 -o "$tmp/m.pt" >/dev/null
run 1 "$tmp/mem1.jsonl" single.piper 2 3
run 2 "$tmp/mem2.jsonl" cp.piper 2 3 --set cp=2
sim "$tmp/memsim1.json" single.piper 2
sim "$tmp/memsim2.json" cp.piper 2 --set cp=2
mpirun -np 2 --oversubscribe --bind-to none "$build/tools/piper-run" "$tmp/m.pt" --threads 1 --profile "$tmp/machine2.json" >/dev/null
"$build/tools/piper-check" "$tmp/m.pt" "$root/strategies/cp.piper" --set cp=2 --batch-size 2 --machine "$tmp/machine2.json" \
  --report "$tmp/plan2.html" >/dev/null
if ((rounds > 0)); then
  sim "$tmp/sim_cp.json" cp.piper 4 --set cp=2 --machine "$tmp/machine2.json"
  for r in $(seq 1 "$rounds"); do
    run 1 "$tmp/one.$r.jsonl" single.piper 4 8
    run 2 "$tmp/dp.$r.jsonl" dp.piper 4 8 --set dp=2
    run 2 "$tmp/cp.$r.jsonl" cp.piper 4 8 --set cp=2 --machine "$tmp/machine2.json"
  done
fi
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, re, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def steps(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l]
one, cp = (steps(f"{tmp}/mem{k}.jsonl")[-1] for k in (1, 2))
sim1, sim2 = (json.load(open(f"{tmp}/memsim{k}.json")) for k in (1, 2))
def act(row): return row["peak_tensor_bytes_by_category"].get("activations", 0)
def sim_peak(s): return max(r["peak_bytes"] for r in s["ranks"])
print("memory, gpt 8L d128 ffn512 seq 512, batch 2 (fullest rank, step 3):")
print(f"  activations at the peak: one rank {act(one)/2**20:.2f} MiB, cp=2 {act(cp)/2**20:.2f} MiB, ratio {act(cp)/max(act(one),1):.3f}")
print(f"  peak tensor bytes: one rank measured {one['peak_tensor_bytes']/2**20:.2f} MiB, model {sim_peak(sim1)/2**20:.2f} MiB "
      f"({sim_peak(sim1)/one['peak_tensor_bytes']:.3f}); cp=2 measured {cp['peak_tensor_bytes']/2**20:.2f} MiB, "
      f"model {sim_peak(sim2)/2**20:.2f} MiB ({sim_peak(sim2)/cp['peak_tensor_bytes']:.3f})")
page = open(f"{tmp}/plan2.html").read()
plan = json.loads(re.search(r'<script type="application/json" id="plan-data">(.*?)</script>', page, re.S).group(1))
ring = sum(row["bytes"] for c in plan["classes"][:1] for row in c["comm"] if row["op"].startswith("ring exchange"))
print(f"  ring bytes per step, rank 0: measured {cp['ring_bytes']}, cost model {ring:.0f} ({ring/cp['ring_bytes']:.3f})")
if rounds == 0:
    sys.exit(0)
tps = {k: [] for k in ("one rank", "dp=2", "cp=2")}
step = []
for r in range(1, rounds + 1):
    rows = {k: steps(f"{tmp}/{f}.{r}.jsonl")[2:] for k, f in (("one rank", "one"), ("dp=2", "dp"), ("cp=2", "cp"))}
    for k in tps:
        tps[k].append(statistics.median(x["tokens_per_s"] for x in rows[k]))
    step.append(statistics.median(x["step_s"] for x in rows["cp=2"]))
    print(f"round {r}: tokens/s " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in tps.items()) + f"; cp=2 step {step[-1]*1e3:.1f} ms")
print(f"speed, batch 4, {rounds} rounds of 8 steps (median of steps 3-8), 2 cores:")
base = statistics.median(tps["one rank"])
for k, v in tps.items():
    print(f"  {k:<9} {statistics.median(v):8.0f} tokens/s (spread {min(v):.0f}-{max(v):.0f})   x{statistics.median(v)/base:.2f} one rank")
s = json.load(open(f"{tmp}/sim_cp.json"))["step_time"]
m = statistics.median(step)
print(f"  cp=2 step simulated {s*1e3:.1f} ms, measured median {m*1e3:.1f} ms (spread {min(step)*1e3:.1f}-{max(step)*1e3:.1f})"
      f"   simulated/measured {s/m:.2f}")
PY
