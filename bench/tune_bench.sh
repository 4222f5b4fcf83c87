#!/usr/bin/env bash
# piper-tune against reality. `piper-run --profile` measures this machine (two ranks); piper-tune
# ranks the library's plans for the 8-layer GPT (batch 16) with that machine file at each N; then
# the top K plans it ranked and K more drawn at random (seeded) from the rest run for a few steps
# each (piper-run --machine, the same costs ordering the schedule). Prints each plan's predicted
# and measured step, the Spearman rank correlation between them, and how far the plan piper-tune
# picked is from the best one measured. N=4 oversubscribes the 2 cores of this machine.
# Usage: bench/tune_bench.sh [BUILD_DIR] [K=5] [N...=2 4]
source "$(dirname "$0")/speed_setup.sh"
k=${2:-5}
shift 2 || shift $# || true
nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(2 4)
common=(--data "$root/data/corpus.txt" --steps 8 --batch-size 16)
mpirun -np 2 --oversubscribe "$build/tools/piper-run" "$tmp/m.pt" --profile "$tmp/machine.json" >/dev/null
for np in "${nps[@]}"; do
  "$build/tools/piper-tune" "$tmp/m.pt" --np "$np" --batch-size 16 --machine "$tmp/machine.json" --json >"$tmp/tune$np.json"
  /usr/bin/python3 - "$tmp/tune$np.json" "$k" >"$tmp/pick$np.txt" <<'PY'
import json, random, sys
ranked = json.load(open(sys.argv[1]))["ranked"]
k = int(sys.argv[2])
rest = ranked[k:]
random.Random(1).shuffle(rest)
for c in ranked[:k] + rest[:k]:
    print(c["strategy"], int(c["recompute"]), c["step_time"], " ".join(f"{n}={str(v).lower()}" for n, v in c["params"].items()))
PY
  i=0
  while read -r file recompute predicted params; do
    sets=()
    for s in $params; do sets+=(--set "$s"); done
    printf 'use "%s";\n' "$file" >"$tmp/plan$np.$i.piper"
    [ "$recompute" = 1 ] && printf 'recompute layers[*];\n' >>"$tmp/plan$np.$i.piper"
    mpirun -np "$np" --oversubscribe "$build/tools/piper-run" "$tmp/m.pt" "$tmp/plan$np.$i.piper" -I "$root/strategies" "${sets[@]}" \
      "${common[@]}" --machine "$tmp/machine.json" --metrics "$tmp/run$np.$i.jsonl" </dev/null >/dev/null 2>"$tmp/run$np.$i.err" ||
      echo "failed" >"$tmp/run$np.$i.jsonl"
    echo "$file $recompute $predicted $params" >"$tmp/run$np.$i.plan"
    i=$((i + 1))
  done <"$tmp/pick$np.txt"
  /usr/bin/python3 - "$tmp" "$np" "$i" <<'PY'
import json, statistics, sys
tmp, np, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = []
for i in range(n):
    file, recompute, predicted, *params = open(f"{tmp}/run{np}.{i}.plan").read().split()
    steps = [json.loads(l)["step_s"] for l in open(f"{tmp}/run{np}.{i}.jsonl") if '"step_s"' in l]
    label = file.removesuffix(".piper") + " " + " ".join(params) + (" +recompute" if recompute == "1" else "")
    rows.append((label, float(predicted), statistics.median(steps[3:]) if len(steps) > 3 else None))
ok = [r for r in rows if r[2] is not None]
def ranks(xs):
    order = sorted(range(len(xs)), key=lambda j: xs[j])
    out = [0.0] * len(xs)
    for pos, j in enumerate(order): out[j] = pos
    return out
rp, rm = ranks([r[1] for r in ok]), ranks([r[2] for r in ok])
m = len(ok)
rho = 1 - 6 * sum((a - b) ** 2 for a, b in zip(rp, rm)) / (m * (m * m - 1)) if m > 1 else float("nan")
print(f"N={np}: {len(rows)} plans run ({len(rows) - m} failed)")
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
