#!/usr/bin/env bash
# The heart of Piper: a distributed strategy trains to the same losses as one device. Trains a tiny
# GPT for 20 steps with the single-device reference trainer and with `mpirun -np N piper-run`, and
# compares every step's loss (1e-5 relative) and the final parameters (sum and sum of squares).
# A strategy with `precision bf16` is compared with the reference in bf16 (fp32 master weights),
# within 1e-3: the order in which microbatches' and replicas' bf16 gradients are summed differs
# (over 20 steps: up to 1.5e-4 measured on AVX-512 CPUs, 4.6e-4 on this AVX2-only EPYC, where
# `piper-run` of `precision bf16;` on one rank equals the reference to the last digit).
# PIPER_LAYERS sets the model's layers (default 4; a V over pp=4 needs 8). PIPER_MODEL_ARGS adds
# piper-model flags (e.g. --tie-embeddings: the tied GPT); PIPER_RECIPE_ARGS
# training-recipe flags (schedule, betas, weight decay, clipping) given to both trainers alike; with
# clipping the per-step global norms are compared too, and with the recipe validation losses.
# Usage: equivalence_test.sh PIPER_MODEL PIPER_TRAIN_REF PIPER_RUN NP STRATEGY [--set ...]
set -euo pipefail
set -f  # the recipe's globs (--no-decay 'embed.*') are Piper's, not the shell's
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
"$model_bin" "$arch" --layers "${PIPER_LAYERS:-4}" --d-model 32 --ffn 64 --seq 16 ${PIPER_MODEL_ARGS:-} -o "$tmp/m.pt"
steps=${PIPER_STEPS:-20}
common=(--data "$root/data/corpus.txt" --steps "$steps" --batch-size 8 --lr 1e-3 --seed 0)
# shellcheck disable=SC2206  # word splitting of the flags is intended
common+=(${PIPER_RECIPE_ARGS:-})
# With the recipe, validation too: forward-only passes through the plan every 10 steps (a held-out text).
[ -n "${PIPER_RECIPE_ARGS:-}" ] && common+=(--val-data "$root/README.md" --eval-every 10 --eval-batches 2)
# A --seq-len among piper-run's extra arguments applies to the reference trainer too.
ref_extra=()
for ((i = 1; i <= $#; i++)); do
  if [ "${!i}" = --seq-len ]; then j=$((i + 1)); ref_extra+=(--seq-len "${!j}"); fi
done
tolerance=1e-5
if grep -q "^precision bf16" "$root/strategies/$strategy"; then ref_extra+=(--precision bf16); tolerance=1e-3; fi
"$ref_bin" "$tmp/m.pt" "${common[@]}" "${ref_extra[@]}" --threads 1 --metrics "$tmp/ref.jsonl" >/dev/null
# Negative controls: neither the decay nor the clipping is silently skipped by both trainers: without
# either, the reference ends with other weights (above the tolerance the trainers must agree within).
for flag in --weight-decay --clip-grad-norm --no-decay; do
  [[ " ${PIPER_RECIPE_ARGS:-} " == *" $flag "* ]] || continue
  # shellcheck disable=SC2206  # the recipe without FLAG and its value
  recipe=(${PIPER_RECIPE_ARGS})
  plain=()
  for ((i = 0; i < ${#recipe[@]}; i++)); do
    if [ "${recipe[i]}" = "$flag" ]; then i=$((i + 1)); else plain+=("${recipe[i]}"); fi
  done
  "$ref_bin" "$tmp/m.pt" --data "$root/data/corpus.txt" --steps "$steps" --batch-size 8 --lr 1e-3 --seed 0 "${plain[@]}" \
    "${ref_extra[@]}" --threads 1 --metrics "$tmp/without.jsonl" >/dev/null
  ${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/ref.jsonl" "$tmp/without.jsonl" "$flag" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)][-1]["final_param_sumsq"] for p in sys.argv[1:3])
assert abs(a - b) / b > 2e-5, f"{sys.argv[3]} changed nothing: {a} vs {b}"
PY
done
timeout 300 mpirun -np "$np" --oversubscribe --bind-to none "$run_bin" "$tmp/m.pt" "$root/strategies/$strategy" \
  "${common[@]}" --threads 1 --metrics "$tmp/run.jsonl" "$@" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
cat >"$tmp/compare.py" <<'PY'
import json, sys
tol = float(sys.argv[4])
def read(p):
    rows = [json.loads(l) for l in open(p)]
    return [r["loss"] for r in rows if "loss" in r], [r for r in rows if "final_param_sum" in r][0]
ref, ref_p = read(sys.argv[1])
run, run_p = read(sys.argv[2])
steps = int(sys.argv[5])
assert len(ref) == len(run) == steps, (len(ref), len(run))
worst = max(abs(a - b) / abs(a) for a, b in zip(ref, run))
for k in ("final_param_sum", "final_param_sumsq"):
    rel = abs(ref_p[k] - run_p[k]) / max(abs(ref_p[k]), 1e-12)
    assert rel < tol, f"{k}: reference {ref_p[k]} vs {run_p[k]} (rel {rel:.2e})"
assert worst < tol, f"losses differ by up to {worst:.2e} relative:\n ref {ref}\n run {run}"
# `mirror` (piper-run --check-copies): each stage's two copies bit-identical after every step.
diffs = [r["copy_diff"] for r in (json.loads(l) for l in open(sys.argv[2])) if "copy_diff" in r]
if diffs:
    assert len(diffs) == steps and all(d == 0 for d in diffs), f"the stages' copies differ after steps: {diffs}"
    print(f"  the stages' two copies bit-identical after each of {len(diffs)} steps")
# Clipping: the global norm every rank reports equals PyTorch's clip_grad_norm_'s, step by step (a
# parameter counted twice or not at all, replicated, sharded, tied or an expert, changes it), and it
# was above the threshold on most steps, so clipping acted.
norms = [(a.get("grad_norm"), b.get("grad_norm")) for a, b in zip(*(
    [r for r in (json.loads(l) for l in open(p)) if "loss" in r] for p in sys.argv[1:3]))]
if norms[0][0] is not None:
    assert all(b is not None for _, b in norms), "piper-run reported no grad_norm"
    off = max(abs(a - b) / a for a, b in norms)
    assert off < tol, f"global norms differ by up to {off:.2e} relative: {norms}"
    clipped = sum(a > 1.0 for a, _ in norms)
    assert clipped >= len(norms) // 2, f"clipping acted on {clipped} of {len(norms)} steps only"
    print(f"  global norm {norms[0][0]:.3f} -> {norms[-1][0]:.3f} equal to PyTorch's within {off:.1e}, above 1.0 on {clipped} steps")
# Validation: the same forward-only losses as PyTorch's eval-mode pass on the same windows.
vals = [[r["val_loss"] for r in (json.loads(l) for l in open(p)) if "val_loss" in r] for p in sys.argv[1:3]]
if vals[0]:
    assert len(vals[0]) == len(vals[1]), f"validation ran {len(vals[1])} times, the reference {len(vals[0])}"
    off = max(abs(a - b) / a for a, b in zip(*vals))
    assert off < tol, f"validation losses differ by up to {off:.2e} relative: {vals}"
    print(f"  {len(vals[0])} validations {vals[0][0]:.4f} -> {vals[0][-1]:.4f} equal to the reference's within {off:.1e}")
print(f"{sys.argv[3]}: {steps} losses {ref[0]:.4f} -> {ref[-1]:.4f}, max relative difference {worst:.1e}; final parameters agree")
PY
${PIPER_PYTHON:-/usr/bin/python3} "$tmp/compare.py" "$tmp/ref.jsonl" "$tmp/run.jsonl" "$strategy $*" "$tolerance" "$steps"
# Negative controls (PIPER_NEGATIVE=tensor, or a comma-separated list such as tensor,sequence): the
# same run with that collective dropped (PIPER_TEST_DROP_COLLECTIVE) must fail the comparison, so the
# check above can see it missing.
# PIPER_NEGATIVE=capacity: the model without its expert capacity (same weights, dropless) trains to
# other losses on the reference trainer, so the run dropped tokens, and the same ones as the reference.
negatives=${PIPER_NEGATIVE:-}
if [[ ",$negatives," == *,capacity,* ]]; then
  negatives=${negatives//capacity/}
  # shellcheck disable=SC2086  # word splitting of the flags is intended
  "$model_bin" "$arch" --layers "${PIPER_LAYERS:-4}" --d-model 32 --ffn 64 --seq 16 \
    $(sed -E 's/--capacity-factor +[^ ]+//' <<<"${PIPER_MODEL_ARGS:-}") -o "$tmp/dropless.pt"
  "$ref_bin" "$tmp/dropless.pt" "${common[@]}" "${ref_extra[@]}" --threads 1 --metrics "$tmp/dropless.jsonl" >/dev/null
  if ${PIPER_PYTHON:-/usr/bin/python3} "$tmp/compare.py" "$tmp/dropless.jsonl" "$tmp/run.jsonl" "dropless" "$tolerance" "$steps" >/dev/null 2>&1; then
    echo "negative control: the dropless model trains to the same losses: no token was dropped" >&2
    exit 1
  fi
  echo "  negative control: the same model without its capacity trains to other losses (tokens were dropped)"
fi
for negative in ${negatives//,/ }; do
  PIPER_TEST_DROP_COLLECTIVE=$negative timeout 300 mpirun -x PIPER_TEST_DROP_COLLECTIVE -np "$np" --oversubscribe \
    --bind-to none "$run_bin" "$tmp/m.pt" "$root/strategies/$strategy" "${common[@]}" --threads 1 \
    --metrics "$tmp/dropped.jsonl" "$@" >"$tmp/dropped.log" 2>&1 || { cat "$tmp/dropped.log"; exit 1; }
  if ${PIPER_PYTHON:-/usr/bin/python3} "$tmp/compare.py" "$tmp/ref.jsonl" "$tmp/dropped.jsonl" "dropped" "$tolerance" "$steps" >/dev/null 2>&1; then
    echo "negative control: without its $negative collectives the run still matched the reference" >&2
    exit 1
  fi
  echo "  negative control: without the $negative collectives the losses differ (as they must)"
done
