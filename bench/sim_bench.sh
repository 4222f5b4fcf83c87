#!/usr/bin/env bash
# The calibrated simulator against the executor. `piper-run --profile` measures this machine (two
# ranks, as they will train); then every two-rank library strategy is simulated with that machine
# file (piper-check --machine ... --emit sim-json) and run with it (piper-run --machine: the same
# costs order the schedule), and the simulated step time is set beside the measured median step.
# Also: ZB1P and 1F1B scheduled by unit costs (F=1, B=2, W=1) against the same scheduled by the
# measured costs, in alternating rounds.
# Usage: bench/sim_bench.sh [BUILD_DIR] [ROUNDS]
source "$(dirname "$0")/speed_setup.sh"
common=(--data "$root/data/corpus.txt" --steps 12 --batch-size 16)
mpirun -np 2 "$build/tools/piper-run" "$tmp/m.pt" --profile "$tmp/machine.json" >/dev/null
plans=(
  "1f1b 1f1b.piper pp=2 mb=8"
  "gpipe gpipe.piper pp=2 mb=8"
  "interleaved interleaved_1f1b.piper pp=2 v=2 mb=8"
  "zb1p zb1p.piper pp=2 mb=8"
  "dualpipev dualpipev.piper pp=2 mb=8"
  "dp dp.piper dp=2"
  "zero1 zero1.piper dp=2"
  "zero2 zero2.piper dp=2"
  "zero3 zero3.piper dp=2"
)
for r in $(seq 1 "$rounds"); do
  for p in "${plans[@]}"; do
    read -r name file params <<<"$p"
    sets=()
    for s in $params; do sets+=(--set "$s"); done
    [ "$r" = 1 ] && "$build/tools/piper-check" "$tmp/m.pt" "$root/strategies/$file" "${sets[@]}" --batch-size 16 \
      --machine "$tmp/machine.json" --emit sim-json >"$tmp/$name.sim.json"
    mpirun -np 2 "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/$file" "${sets[@]}" "${common[@]}" \
      --machine "$tmp/machine.json" --metrics "$tmp/$name.$r.jsonl" >/dev/null
    case $name in 1f1b | zb1p)
      mpirun -np 2 "$build/tools/piper-run" "$tmp/m.pt" "$root/strategies/$file" "${sets[@]}" "${common[@]}" \
        --metrics "$tmp/$name.unit.$r.jsonl" >/dev/null ;;
    esac
  done
done
/usr/bin/python3 - "$tmp" "$rounds" "${plans[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, plans = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def measured(name):  # median over rounds of each run's median step after 3 warm-up steps
    runs = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l)["step_s"] for l in open(f"{tmp}/{name}.{r}.jsonl") if '"step"' in l]
        runs.append(statistics.median(steps[3:]))
    return statistics.median(runs)
m = json.load(open(f"{tmp}/machine.json"))
cal = ", ".join("%s %.3f" % (k, m["calibration"][k]) for k in "FBU")
print(f"machine: {m['name']}; calibration {cal}")
print(f"{'plan':<40} {'simulated':>10} {'measured':>10} {'error':>8}")
errors = []
for p in plans:
    name, file, *params = p.split()
    sim = json.load(open(f"{tmp}/{name}.sim.json"))["step_time"]
    real = measured(name)
    errors.append((real - sim) / real)
    print(f"{file + ' ' + ' '.join(params):<40} {sim * 1e3:>8.1f}ms {real * 1e3:>8.1f}ms {100 * errors[-1]:>+7.1f}%")
print(f"largest error {100 * max(abs(e) for e in errors):.1f}% (simulated below measured is positive)")
for name in ("1f1b", "zb1p"):
    print(f"{name}: scheduled by unit costs {measured(name + '.unit') * 1e3:.1f} ms, by measured costs {measured(name) * 1e3:.1f} ms")
print(f"zb1p / 1f1b step time: unit costs {measured('zb1p.unit') / measured('1f1b.unit'):.3f}, measured costs "
      f"{measured('zb1p') / measured('1f1b'):.3f}")
PY
