#!/usr/bin/env bash
# Tied weights (the head's projection is the token embedding): PyTorch itself trains the tied GPT,
# on the batches piper-run and the reference trainer read, to the reference trainer's losses — so
# the tied equivalence cases (equivalence/tied_*) compare against a reference that is right. A
# model whose manifest does not declare a tie it has is refused, never trained apart; piper-check
# counts the tensor once for the model and once in each stage that holds a copy.
# Usage: tied_test.sh PIPER_RUN PIPER_MODEL PIPER_TRAIN_REF PIPER_CHECK
source "$(dirname "$0")/mpi_test_lib.sh"
ref_bin=$3 check_bin=$4
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
"$model_bin" gpt --layers 4 --d-model 32 --ffn 64 --seq 16 --tie-embeddings -o "$tmp/tied.pt" >/dev/null
"$model_bin" verify "$tmp/tied.pt" >"$tmp/verify.log" || fail "piper-model verify: $(cat "$tmp/verify.log")"
grep -q "52 parameters" "$tmp/verify.log" || fail "verify should count the tied tensor once (53 untied, 52 tied): $(cat "$tmp/verify.log")"

"$ref_bin" "$tmp/tied.pt" --data "$root/data/corpus.txt" --steps 10 --batch-size 8 --lr 1e-3 --seed 0 --threads 1 \
  --metrics "$tmp/ref.jsonl" >/dev/null || fail "piper-train-ref on the tied model"
# PyTorch: the same TorchScript file and windows of the corpus, AdamW over model.parameters() (the
# tied tensor once), cross-entropy on the next tokens (python/torch_reference.py).
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/tied.pt" "$root/data/corpus.txt" "$tmp/ref.jsonl" "$root/python" <<'PY' || fail "PyTorch and piper-train-ref disagree on the tied model"
import json, sys
import torch
model_path, data_path, ref_path, here = sys.argv[1:5]
sys.path.insert(0, here)
from torch_reference import pytorch_losses
torch.set_num_threads(1)
m = torch.jit.load(model_path)
assert m.embed.wte is m.head.lm_head_weight, "the saved model lost its tie"
losses = pytorch_losses(model_path, data_path, 16, 8, 10)
ref = [json.loads(l)["loss"] for l in open(ref_path) if '"loss"' in l]
worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
print(f"PyTorch {losses[0]:.5f} -> {losses[-1]:.5f}; piper-train-ref {ref[0]:.5f} -> {ref[-1]:.5f}; max relative difference {worst:.1e}")
assert len(ref) == 10 and worst < 1e-5, (losses, ref)
PY

# Checkpoints know the tensor by its first name (embed.wte): saved by 1F1B pp=2 (a copy per stage),
# resumed on one device, the losses continue as the uninterrupted run's.
common=(--data "$root/data/corpus.txt" --batch-size 8 --lr 1e-3 --seed 0 --threads 1)
timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/tied.pt" "$root/strategies/1f1b.piper" --set pp=2 \
  --set mb=4 "${common[@]}" --steps 3 --checkpoint "$tmp/ck" --save-every 3 >"$tmp/save.log" 2>&1 || fail "save: $(tail -3 "$tmp/save.log")"
timeout 120 mpirun -np 1 "$run" "$tmp/tied.pt" "$root/strategies/single.piper" "${common[@]}" --steps 6 --resume "$tmp/ck" \
  --metrics "$tmp/resumed.jsonl" >"$tmp/resume.log" 2>&1 || fail "resume: $(tail -3 "$tmp/resume.log")"
timeout 120 mpirun -np 1 "$run" "$tmp/tied.pt" "$root/strategies/single.piper" "${common[@]}" --steps 6 \
  --metrics "$tmp/whole.jsonl" >/dev/null 2>&1 || fail "uninterrupted run"
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/whole.jsonl" "$tmp/resumed.jsonl" <<'PY' || fail "resumed losses differ"
import json, sys
whole, resumed = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
a, b = [r["loss"] for r in whole][3:], [r["loss"] for r in resumed]
assert len(b) == 3 and max(abs(x - y) / x for x, y in zip(a, b)) < 1e-5, (a, b)
PY

# A tie the manifest does not declare: refused by name, before any step.
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/tied.pt" "$tmp/undeclared.pt" <<'PY'
import json, sys
import torch
extra = {"piper/manifest.json": ""}
m = torch.jit.load(sys.argv[1], _extra_files=extra)
manifest = json.loads(extra["piper/manifest.json"])
del manifest["ties"]
torch.jit.save(m, sys.argv[2], _extra_files={"piper/manifest.json": json.dumps(manifest)})
PY
if timeout 60 mpirun -np 1 "$run" "$tmp/undeclared.pt" "$root/strategies/single.piper" --data "$root/data/corpus.txt" \
  --steps 1 --batch-size 2 >"$tmp/undeclared.log" 2>&1; then
  fail "a model with an undeclared tie trained"
fi
grep -q "parameters 'embed.wte' and 'head.lm_head_weight' are one tensor (tied weights) that the manifest does not declare" \
  "$tmp/undeclared.log" || fail "undeclared tie: $(cat "$tmp/undeclared.log")"

# piper-check: the model counts the tensor once; under pp=2 each stage holds its copy.
"$model_bin" gpt --layers 4 --d-model 32 --ffn 64 --seq 16 -o "$tmp/untied.pt" >/dev/null
"$check_bin" "$tmp/tied.pt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=4 --batch-size 8 >"$tmp/check.log" 2>&1 ||
  fail "piper-check on the tied model: $(cat "$tmp/check.log")"
"$check_bin" "$tmp/untied.pt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=4 --batch-size 8 >"$tmp/check_untied.log" 2>&1
# The tied model has exactly one [vocab 256, d 32] matrix fewer than the untied one.
tied_params=$(grep -o "regions, [0-9]* parameters" "$tmp/check.log" | grep -o "[0-9]* parameters" | grep -o "[0-9]*")
untied_params=$(grep -o "regions, [0-9]* parameters" "$tmp/check_untied.log" | grep -o "[0-9]* parameters" | grep -o "[0-9]*")
[ "$tied_params" = $((untied_params - 256 * 32)) ] ||
  fail "piper-check should count the tied tensor once: $tied_params tied, $untied_params untied"
finish tied_test
