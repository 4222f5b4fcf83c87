#!/usr/bin/env bash
# piper-tune against reality. At each N, `piper-run --profile` measures this machine as the plans
# will run (under mpirun -np N: with N=4 on 2 cores each rank has half a core, and the collectives
# span 4 ranks); piper-tune ranks the library's plans for the 8-layer GPT (batch 16) with that
# machine file; then
# the top K plans it ranked and K more drawn at random (seeded) from the rest run for a few steps
# each (piper-run --machine, the same costs ordering the schedule), in ROUNDS rounds that go
# through the plans in turn (a slow spell of the machine then touches every plan alike, not the
# ones that happened to run during it); a plan's step is the median over rounds of each run's
# median. Prints each plan's predicted
# and measured step, the Spearman rank correlation between them, and how far the plan piper-tune
# picked is from the best one measured. N=4 oversubscribes the 2 cores of this machine.
# Usage: bench/tune_bench.sh [BUILD_DIR] [ROUNDS=3] [K=5] [N...=2 4]
source "$(dirname "$0")/speed_setup.sh"
k=${3:-5}
shift 3 || shift $# || true
nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(2 4)
common=(--data "$root/data/corpus.txt" --steps 8 --batch-size 16)
for np in "${nps[@]}"; do
  mpirun -np "$np" --oversubscribe "$build/tools/piper-run" "$tmp/m.pt" --profile "$tmp/machine$np.json" </dev/null >/dev/null
  "$build/tools/piper-tune" "$tmp/m.pt" --np "$np" --batch-size 16 --machine "$tmp/machine$np.json" --json >"$tmp/tune$np.json"
  /usr/bin/python3 - "$tmp/tune$np.json" "$k" >"$tmp/pick$np.txt" <<'PY'
import json, random, sys
ranked = json.load(open(sys.argv[1]))["ranked"]
k = int(sys.argv[2])
rest = ranked[k:]
random.Random(1).shuffle(rest)
for c in ranked[:k] + rest[:k]:
    sets = " ".join(f"{n}={str(v).lower()}" for n, v in c["params"].items())
    print(c["strategy"], c["step_time"], sets, "|", c["plan"])
PY
  i=0
  while read -r file predicted rest; do
    params=${rest%%|*}
    label=${rest#*| }
    printf 'use "%s";\n' "$file" >"$tmp/plan$np.$i.piper"
    [[ "$label" == *+recompute ]] && printf 'recompute layers[*];\n' >>"$tmp/plan$np.$i.piper"
    echo "$params" >"$tmp/run$np.$i.sets"
    echo "$predicted $label" >"$tmp/run$np.$i.plan"
    i=$((i + 1))
  done <"$tmp/pick$np.txt"
  for r in $(seq 1 "$rounds"); do
    for j in $(seq 0 $((i - 1))); do
      sets=()
      for s in $(cat "$tmp/run$np.$j.sets"); do sets+=(--set "$s"); done
      mpirun -np "$np" --oversubscribe "$build/tools/piper-run" "$tmp/m.pt" "$tmp/plan$np.$j.piper" -I "$root/strategies" \
        "${sets[@]}" "${common[@]}" --machine "$tmp/machine$np.json" --metrics "$tmp/run$np.$j.$r.jsonl" </dev/null \
        >/dev/null 2>"$tmp/run$np.$j.$r.err" || echo "failed" >"$tmp/run$np.$j.$r.jsonl"
    done
  done
  /usr/bin/python3 - "$tmp" "$np" "$i" "$rounds" <<'PY'
import json, statistics, sys
tmp, np, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def measured(i):  # median over rounds of each run's median step after 3 warm-up steps; None if any failed
    runs = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l)["step_s"] for l in open(f"{tmp}/run{np}.{i}.{r}.jsonl") if '"step_s"' in l]
        if len(steps) <= 3: return None
        runs.append(statistics.median(steps[3:]))
    return statistics.median(runs)
rows = []
for i in range(n):
    predicted, label = open(f"{tmp}/run{np}.{i}.plan").read().strip().split(" ", 1)
    rows.append((label, float(predicted), measured(i)))
ok = [r for r in rows if r[2] is not None]
def ranks(xs):
    order = sorted(range(len(xs)), key=lambda j: xs[j])
    out = [0.0] * len(xs)
    for pos, j in enumerate(order): out[j] = pos
    return out
rp, rm = ranks([r[1] for r in ok]), ranks([r[2] for r in ok])
m = len(ok)
rho = 1 - 6 * sum((a - b) ** 2 for a, b in zip(rp, rm)) / (m * (m * m - 1)) if m > 1 else float("nan")
print(f"N={np}: {len(rows)} plans run, {rounds} rounds ({len(rows) - m} failed)")
print(f"  {'plan':<46} {'predicted':>10} {'measured':>10}")
for label, p, r in rows:
    print(f"  {label:<46} {p * 1e3:>8.1f}ms {'failed' if r is None else f'{r * 1e3:8.1f}ms':>10}")
best = min(ok, key=lambda r: r[2])
picked = ok[0] if ok and ok[0] == rows[0] else None
print(f"  Spearman rank correlation, predicted vs measured: {rho:.2f}")
if picked:
    print(f"  picked {picked[0]} measured {picked[2] * 1e3:.1f} ms; best measured {best[0]} {best[2] * 1e3:.1f} ms: "
          f"picked / best = {picked[2] / best[2]:.2f}")
PY
done
