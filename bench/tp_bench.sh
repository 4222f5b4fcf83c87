#!/usr/bin/env bash
# Tensor parallelism measured: on the issue's model (gpt 8 layers, d 384, ffn 1536, seq 64),
# 1. memory at batch 2 (3 steps, --metrics): the fullest rank's parameters + gradients + optimizer
#    state and its activations at its peak, one rank against tp=2, beside the memory model's
#    prediction (piper-check --emit sim-json) for the same plans; with sequence parallelism, the
#    activations against tp=2 alone beside Megatron's formula (Korthikanti et al. 2022);
# 2. speed at batch 16: tokens/s of one rank, dp=2 and tp=2 (2 ranks on this machine's 2 cores), each
#    round running all of them (and tp=2 with sequence parallelism); the ratios to one rank;
# 3. the simulator against the measured step for tp=2 and pp=2 × tp=2: `piper-run --profile` on as
#    many ranks measures this machine; piper-check with that file simulates the step.
# Prints every round and the median over rounds with the spread.
# Usage: bench/tp_bench.sh [BUILD_DIR] [ROUNDS]   (ROUNDS 0: memory only)
source "$(dirname "$0")/speed_setup.sh"
source "$(dirname "$0")/layer_bench_lib.sh"
export OMP_NUM_THREADS=1
"$build/tools/piper-model" gpt --layers 8 --d-model 384 --ffn 1536 --seq 64 -o "$tmp/m.pt" >/dev/null  # the issue's model
# 1. Memory.
run 1 "$tmp/mem1.jsonl" single.piper 2 3
run 2 "$tmp/mem2.jsonl" tp.piper 2 3 --set tp=2
run 2 "$tmp/mem3.jsonl" tp.piper 2 3 --set tp=2 --set sp=true
sim "$tmp/memsim1.json" single.piper 2
sim "$tmp/memsim2.json" tp.piper 2 --set tp=2
sim "$tmp/memsim3.json" tp.piper 2 --set tp=2 --set sp=true
# 2. Speed, and 3. the simulator (ROUNDS 0: the memory part alone).
if ((rounds > 0)); then
mpirun -np 2 --oversubscribe --bind-to none "$build/tools/piper-run" "$tmp/m.pt" --threads 1 --profile "$tmp/machine2.json" >/dev/null
mpirun -np 4 --oversubscribe --bind-to none "$build/tools/piper-run" "$tmp/m.pt" --threads 1 --profile "$tmp/machine4.json" >/dev/null
sim "$tmp/sim_tp.json" tp.piper 16 --set tp=2 --machine "$tmp/machine2.json"
sim "$tmp/sim_sp.json" tp.piper 16 --set tp=2 --set sp=true --machine "$tmp/machine2.json"
sim "$tmp/sim_pptp.json" 1f1b_tp.piper 16 --set pp=2 --set tp=2 --set mb=4 --machine "$tmp/machine4.json"
for r in $(seq 1 "$rounds"); do
  run 1 "$tmp/one.$r.jsonl" single.piper 16 12
  run 2 "$tmp/dp.$r.jsonl" dp.piper 16 12 --set dp=2
  run 2 "$tmp/tp.$r.jsonl" tp.piper 16 12 --set tp=2 --machine "$tmp/machine2.json"
  run 2 "$tmp/sp.$r.jsonl" tp.piper 16 12 --set tp=2 --set sp=true --machine "$tmp/machine2.json"
  run 4 "$tmp/pptp.$r.jsonl" 1f1b_tp.piper 16 12 --set pp=2 --set tp=2 --set mb=4 --machine "$tmp/machine4.json"
done
fi
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def steps(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l]
def states(row):
    c = row["peak_tensor_bytes_by_category"]
    return sum(c.get(k, 0) for k in ("params", "grads", "optimizer"))
one, tp, sp = (steps(f"{tmp}/mem{k}.jsonl")[-1] for k in (1, 2, 3))
sim1, sim2, sim3 = (json.load(open(f"{tmp}/memsim{k}.json")) for k in (1, 2, 3))
def sim_peak(s):
    return max(r["peak_bytes"] for r in s["ranks"])
print("memory, gpt 8L d384 ffn1536 seq 64, batch 2 (fullest rank, step 3):")
print(f"  parameters+gradients+optimizer: one rank {states(one)/2**20:.2f} MiB, tp=2 {states(tp)/2**20:.2f} MiB, "
      f"ratio {states(tp)/states(one):.3f}")
a1, a2 = one["peak_tensor_bytes_by_category"].get("activations", 0), tp["peak_tensor_bytes_by_category"].get("activations", 0)
print(f"  activations at the peak: one rank {a1/2**20:.2f} MiB, tp=2 {a2/2**20:.2f} MiB, ratio {a2/max(a1,1):.3f}")
a3 = sp["peak_tensor_bytes_by_category"].get("activations", 0)
# Korthikanti et al. 2022, activations per layer in units of s*b*h: with sequence parallelism
# 34/t + 5as/(ht), tensor parallelism alone 10 + 24/t + 5as/(ht) (a heads, s sequence, h width).
a_, s_, h_, t_ = 4, 64, 384, 2
formula = (34 / t_ + 5 * a_ * s_ / (h_ * t_)) / (10 + 24 / t_ + 5 * a_ * s_ / (h_ * t_))
print(f"  activations with sequence parallelism: tp=2 {a2/2**20:.2f} MiB, tp=2 + sp {a3/2**20:.2f} MiB, ratio {a3/max(a2,1):.3f} "
      f"(Megatron's formula for this model: {formula:.3f}); peak measured {sp['peak_tensor_bytes']/2**20:.2f} MiB, "
      f"model {sim_peak(sim3)/2**20:.2f} MiB ({sim_peak(sim3)/sp['peak_tensor_bytes']:.3f})")
print(f"  peak tensor bytes: one rank measured {one['peak_tensor_bytes']/2**20:.2f} MiB, model {sim_peak(sim1)/2**20:.2f} MiB; "
      f"tp=2 measured {tp['peak_tensor_bytes']/2**20:.2f} MiB, model {sim_peak(sim2)/2**20:.2f} MiB "
      f"({sim_peak(sim2)/tp['peak_tensor_bytes']:.3f})")
if rounds == 0:
    sys.exit(0)
tps = {k: [] for k in ("one rank", "dp=2", "tp=2", "tp=2 sp")}
step = {k: [] for k in ("tp=2", "tp=2 sp", "pp=2 x tp=2")}
for r in range(1, rounds + 1):
    rows = {k: steps(f"{tmp}/{f}.{r}.jsonl")[2:] for k, f in (("one rank", "one"), ("dp=2", "dp"), ("tp=2", "tp"), ("tp=2 sp", "sp"),
                                                            ("pp=2 x tp=2", "pptp"))}
    for k in tps:
        tps[k].append(statistics.median(x["tokens_per_s"] for x in rows[k]))
    for k in step:
        step[k].append(statistics.median(x["step_s"] for x in rows[k]))
    print(f"round {r}: tokens/s " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in tps.items()) +
          "; step " + ", ".join(f"{k} {v[-1]*1e3:.1f} ms" for k, v in step.items()))
print(f"speed, batch 16, {rounds} rounds of 12 steps (median of steps 3-12), 2 cores:")
base = statistics.median(tps["one rank"])
for k, v in tps.items():
    print(f"  {k:<9} {statistics.median(v):8.0f} tokens/s (spread {min(v):.0f}-{max(v):.0f})   x{statistics.median(v)/base:.2f} one rank")
for k, f in (("tp=2", "sim_tp"), ("tp=2 sp", "sim_sp"), ("pp=2 x tp=2", "sim_pptp")):
    s = json.load(open(f"{tmp}/{f}.json"))["step_time"]
    m = statistics.median(step[k])
    print(f"  {k:<12} step simulated {s*1e3:7.1f} ms, measured median {m*1e3:7.1f} ms "
          f"(spread {min(step[k])*1e3:.1f}-{max(step[k])*1e3:.1f})   simulated/measured {s/m:.2f}")
PY
