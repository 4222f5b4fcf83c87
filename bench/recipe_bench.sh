#!/usr/bin/env bash
# The recipe's extra work, simulated against measured on 4 ranks: 1F1B × DP (pp=2 dp=2 mb=4) with
# clipping (--clip-grad-norm) and validation every step (--eval-every 1). `piper-run --profile`
# measures this machine on 4 ranks, as they train; piper-check with that machine file simulates
# the step (its global norm's all-reduce included) and the forward-only validation step; piper-run
# with the same file runs them. Prints, per round and as the median over rounds with the spread:
# the step time, one validation batch's time and the ALLREDUCE_N's duration from the last rank's
# arrival (from --trace),
# simulated beside measured.
# Usage: bench/recipe_bench.sh [BUILD_DIR] [ROUNDS]
source "$(dirname "$0")/speed_setup.sh"
np=(mpirun -np 4 --oversubscribe --bind-to none)
plan=("$root/strategies/1f1b_dp.piper" --set pp=2 --set dp=2 --set mb=4)
"${np[@]}" "$build/tools/piper-run" "$tmp/m.pt" --profile "$tmp/machine.json" >/dev/null
"$build/tools/piper-check" "$tmp/m.pt" "${plan[@]}" --batch-size 16 --clip-grad-norm --machine "$tmp/machine.json" \
  --emit sim-json -o "$tmp/sim.json" >/dev/null
"$build/tools/piper-check" "$tmp/m.pt" "${plan[@]}" --batch-size 16 --clip-grad-norm --machine "$tmp/machine.json" \
  --emit trace -o "$tmp/sim_trace.json" >/dev/null
for r in $(seq 1 "$rounds"); do
  "${np[@]}" "$build/tools/piper-run" "$tmp/m.pt" "${plan[@]}" --data "$root/data/corpus.txt" --steps 12 --batch-size 16 \
    --machine "$tmp/machine.json" --clip-grad-norm 1.0 --val-data "$root/README.md" --eval-every 1 --eval-batches 2 \
    --metrics "$tmp/run.$r.jsonl" --trace "$tmp/trace.$r.json" >/dev/null
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
sim = json.load(open(f"{tmp}/sim.json"))
def events(path):
    t = json.load(open(path))
    return t["traceEvents"] if isinstance(t, dict) else t
def norm_seconds(path, unit):
    """The ALLREDUCE_N's time from the last rank's arrival: per step the shortest span over ranks (the
    others' spans also hold their wait for it, which the simulator prices as the rendezvous, not
    as the all-reduce), the median over steps."""
    by_step = {}
    for e in events(path):
        if e.get("ph") == "X" and "ALLREDUCE_N" in str(e.get("name", "")):
            step = e.get("args", {}).get("step", 0)
            by_step[step] = min(by_step.get(step, float("inf")), e["dur"] * unit)
    return statistics.median(by_step.values()) if by_step else float("nan")
sim_norm = norm_seconds(f"{tmp}/sim_trace.json", 1e-6)
rows = {"step": [], "validation batch": [], "ALLREDUCE_N": []}
for r in range(1, rounds + 1):
    steps = [json.loads(l) for l in open(f"{tmp}/run.{r}.jsonl") if '"loss"' in l][2:]  # the first two warm up
    rows["step"].append(statistics.median(s["step_s"] for s in steps))
    rows["validation batch"].append(statistics.median(s["eval_s"] for s in steps))
    rows["ALLREDUCE_N"].append(norm_seconds(f"{tmp}/trace.{r}.json", 1e-6))
    print(f"round {r}: step {rows['step'][-1]*1e3:.2f} ms, validation batch {rows['validation batch'][-1]*1e3:.2f} ms, "
          f"ALLREDUCE_N {rows['ALLREDUCE_N'][-1]*1e3:.3f} ms")
simulated = {"step": sim["step_time"], "validation batch": sim["eval_step_time"], "ALLREDUCE_N": sim_norm}
print(f"1f1b_dp pp=2 dp=2 mb=4, batch 16, 4 ranks on this machine, {rounds} rounds of 12 steps (median of steps 3-12):")
for k, v in rows.items():
    med = statistics.median(v)
    print(f"  {k:<17} simulated {simulated[k]*1e3:8.3f} ms   measured median {med*1e3:8.3f} ms "
          f"(spread {min(v)*1e3:.3f}-{max(v)*1e3:.3f})   simulated/measured {simulated[k]/med:.2f}")
PY
