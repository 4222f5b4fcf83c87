#!/usr/bin/env bash
# The heart of Piper: a distributed strategy trains to the same losses as one device. Trains a tiny
# GPT for 20 steps with the single-device reference trainer and with `mpirun -np N piper-run`, and
# compares every step's loss (1e-5 relative) and the final parameters (sum and sum of squares).
# A strategy with `precision bf16` is compared with the reference in bf16 (fp32 master weights),
# within 2e-4: the order in which microbatches' and replicas' bf16 gradients are summed differs.
# PIPER_MODEL_ARGS adds piper-model flags (e.g. --tie-embeddings: the tied GPT); PIPER_RECIPE_ARGS
# training-recipe flags (schedule, betas, weight decay) given to both trainers alike.
# Usage: equivalence_test.sh PIPER_MODEL PIPER_TRAIN_REF PIPER_RUN NP STRATEGY [--set ...]
set -euo pipefail
model_bin=$1 ref_bin=$2 run_bin=$3 np=$4 strategy=$5
shift 5
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# Strategies that shard experts train the MoE zoo model; the rest the dense one.
arch=gpt
case "$strategy" in *_ep*|*ep2*) arch=moe ;; esac
# shellcheck disable=SC2086  # word splitting of the flags is intended
"$model_bin" "$arch" --layers 4 --d-model 32 --ffn 64 --seq 16 ${PIPER_MODEL_ARGS:-} -o "$tmp/m.pt"
common=(--data "$root/data/corpus.txt" --steps 20 --batch-size 8 --lr 1e-3 --seed 0)
# shellcheck disable=SC2206  # word splitting of the flags is intended
common+=(${PIPER_RECIPE_ARGS:-})
# A --seq-len among piper-run's extra arguments applies to the reference trainer too.
ref_extra=()
for ((i = 1; i <= $#; i++)); do
  if [ "${!i}" = --seq-len ]; then j=$((i + 1)); ref_extra+=(--seq-len "${!j}"); fi
done
tolerance=1e-5
if grep -q "^precision bf16" "$root/strategies/$strategy"; then ref_extra+=(--precision bf16); tolerance=2e-4; fi
"$ref_bin" "$tmp/m.pt" "${common[@]}" "${ref_extra[@]}" --threads 1 --metrics "$tmp/ref.jsonl" >/dev/null
if [[ "${PIPER_RECIPE_ARGS:-}" == *--weight-decay* ]]; then
  # Negative control: the decay is not silently skipped by both trainers: without it the reference
  # ends with other weights.
  # shellcheck disable=SC2206
  plain=(--data "$root/data/corpus.txt" --steps 20 --batch-size 8 --lr 1e-3 --seed 0 ${PIPER_RECIPE_ARGS/--weight-decay*/})
  "$ref_bin" "$tmp/m.pt" "${plain[@]}" "${ref_extra[@]}" --threads 1 --metrics "$tmp/nodecay.jsonl" >/dev/null
  /usr/bin/python3 - "$tmp/ref.jsonl" "$tmp/nodecay.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)][-1]["final_param_sumsq"] for p in sys.argv[1:3])
# Above the 1e-5 the trainers must agree within: dropping the decay in one would fail the comparison.
assert abs(a - b) / b > 2e-5, f"weight decay changed nothing: {a} vs {b}"
PY
fi
timeout 300 mpirun -np "$np" --oversubscribe --bind-to none "$run_bin" "$tmp/m.pt" "$root/strategies/$strategy" \
  "${common[@]}" --threads 1 --metrics "$tmp/run.jsonl" "$@" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
/usr/bin/python3 - "$tmp/ref.jsonl" "$tmp/run.jsonl" "$strategy $*" "$tolerance" <<'PY'
import json, sys
tol = float(sys.argv[4])
def read(p):
    rows = [json.loads(l) for l in open(p)]
    return [r["loss"] for r in rows if "loss" in r], [r for r in rows if "final_param_sum" in r][0]
ref, ref_p = read(sys.argv[1])
run, run_p = read(sys.argv[2])
assert len(ref) == len(run) == 20, (len(ref), len(run))
worst = max(abs(a - b) / abs(a) for a, b in zip(ref, run))
for k in ("final_param_sum", "final_param_sumsq"):
    rel = abs(ref_p[k] - run_p[k]) / max(abs(ref_p[k]), 1e-12)
    assert rel < tol, f"{k}: reference {ref_p[k]} vs {run_p[k]} (rel {rel:.2e})"
assert worst < tol, f"losses differ by up to {worst:.2e} relative:\n ref {ref}\n run {run}"
print(f"{sys.argv[3]}: 20 losses {ref[0]:.4f} -> {ref[-1]:.4f}, max relative difference {worst:.1e}; final parameters agree")
PY
