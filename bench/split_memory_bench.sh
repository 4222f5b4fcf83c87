#!/usr/bin/env bash
# What the split backward holds between BI and BW, measured both ways in one invocation: as it runs
# now (each node of the input half lets go of its saved tensors once it has run) and as it ran
# before (PIPER_SPLIT_KEEP_SAVED=1: the whole graph kept until BW). For each schedule that splits
# the backward, and 1F1B beside them (which does not): each rank's measured peak tensor bytes
# (piper-run --metrics, step 3) and the memory model's, on a model whose manifest was measured the
# same way; then the fullest rank's activations (the measured peak less the model's parameters,
# gradients and optimizer state, which memory_model_test checks exact) over 1F1B's, beside the
# published multiple (sail-sg zero-bubble's table: ZBV 1, V-Half (pp+2)/2 / pp, V-Min (pp+4)/3 / pp).
# Usage: bench/split_memory_bench.sh [BUILD_DIR] [PP...]   (default pp 2 4; about 3 minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
pps=${*:-2 4}
check=$build/tools/piper-check run=$build/tools/piper-run model=$build/tools/piper-model
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
S=$root/strategies
shape=(--layers 8 --d-model 256 --heads 4 --ffn 1024 --seq 128)
"$model" gpt "${shape[@]}" -o "$tmp/now.pt" >/dev/null
PIPER_SPLIT_KEEP_SAVED=1 "$model" gpt "${shape[@]}" -o "$tmp/kept.pt" >/dev/null

# one WAY PP STRATEGY: predicted in $tmp/WAY_PP_STRATEGY.sim.json, measured in .jsonl
one() {
  local way=$1 pp=$2 s=$3 n="$1_$2_$3" keep=0
  [ "$way" = kept ] && keep=1
  local sets=(--set pp="$pp" --set mb=$((4 * pp)) --batch-size $((8 * pp)))
  "$check" "$tmp/$way.pt" "$S/$s.piper" --np "$pp" "${sets[@]}" --emit sim-json -o "$tmp/$n.sim.json"
  PIPER_SPLIT_KEEP_SAVED=$keep mpirun -np "$pp" --oversubscribe --bind-to none "$run" "$tmp/$way.pt" "$S/$s.piper" \
    "${sets[@]}" --steps 3 --threads 1 --metrics "$tmp/$n.jsonl" >"$tmp/$n.log" 2>&1 || { cat "$tmp/$n.log"; exit 1; }
}
for pp in $pps; do
  for s in 1f1b zb1p zbv vhalf vmin dualpipev; do
    for way in kept now; do one "$way" "$pp" "$s"; done
  done
done

/usr/bin/python3 - "$tmp" $pps <<'PY'
import json, sys
tmp, pps = sys.argv[1], [int(p) for p in sys.argv[2:]]
table = {"zbv": lambda p: 1.0, "vhalf": lambda p: ((p + 2) // 2) / p, "vmin": lambda p: ((p + 4) // 3) / p}
def load(n):
    sim = json.load(open(f"{tmp}/{n}.sim.json"))
    step = [json.loads(l) for l in open(f"{tmp}/{n}.jsonl") if '"step"' in l][-1]
    return sim, step["peak_tensor_bytes_by_rank"]
def activations(n):  # the fullest rank's: measured peak less the model's resident states; and simulated
    sim, meas = load(n)
    states = [sum(r["by_category"][k] for k in ("params", "grads", "optimizer")) for r in sim["ranks"]]
    return max(m - s for m, s in zip(meas, states)), max(r["by_category"]["activations"] for r in sim["ranks"])
MiB = 2 ** 20
for pp in pps:
    print(f"== pp={pp}, mb={4 * pp} (gpt 8 layers d=256 seq 128, {pp} ranks): MiB, measured/simulated")
    print(f"  {'schedule':<10} {'peak per rank, before':<34} {'peak per rank, now':<34} {'now/before':>10}")
    for s in ("1f1b", "zb1p", "zbv", "vhalf", "vmin", "dualpipev"):
        (sk, mk), (sn, mn) = load(f"kept_{pp}_{s}"), load(f"now_{pp}_{s}")
        cell = lambda sim, meas: " ".join(f"{m / MiB:.1f}/{r['peak_bytes'] / MiB:.1f}" for r, m in zip(sim["ranks"], meas))
        print(f"  {s:<10} {cell(sk, mk):<34} {cell(sn, mn):<34} {max(mn) / max(mk):10.3f}")
    base = activations(f"now_{pp}_1f1b")
    print(f"  fullest rank's activations over 1F1B's, measured (simulated), now; the published multiple")
    for s, f in table.items():
        a = activations(f"now_{pp}_{s}")
        print(f"  {s:<10} {a[0] / base[0]:.3f} ({a[1] / base[1]:.3f})   {f(pp):.3f}")
PY
