#!/usr/bin/env bash
# Checkpoints under mpirun. Saved by 1F1B × ZeRO-3 (pp=2 × dp=2, 4 ranks) after 3 of 6 steps:
# resumed by the same strategy the losses are bit-identical to the uninterrupted run's; resumed by
# single (1 rank), ZeRO-1 (dp=2), DualPipeV and DualPipe (pp=2, its copies equal; and saved by it,
# back to single) they are within 1e-5. A checkpoint saved by
# plain DP loads into ZeRO-3 shards. Corrupt, partial and mismatched checkpoints are refused with
# a clear message; a save that died half-way is ignored. --save-model writes a model.pt that
# PyTorch loads (trainable parameters, the trained values) and piper-run trains from. Tensor-parallel
# checkpoints (slices) resume under other plans and back; a tp=2 run's saved model is single's.
source "$(dirname "$0")/mpi_test_lib.sh"
"$model_bin" gpt --layers 2 --d-model 32 --ffn 64 --seq 16 -o "$tmp/other.pt" >/dev/null
common=(--data "$root/data/corpus.txt" --batch-size 8 --lr 1e-2 --threads 1)
piper() {  # piper NP OUT STRATEGY args... (OUT: its output, for messages)
  local np=$1 out=$2 strategy=$3
  shift 3
  [[ $strategy = /* ]] || strategy=$root/strategies/$strategy
  timeout 120 mpirun -np "$np" --oversubscribe "$run" "$tmp/m.pt" "$strategy" -I "$root/strategies" "${common[@]}" "$@" >"$tmp/$out" 2>&1
}
# Losses of steps FROM..6 of two metrics files: the same (tolerance 0) or within TOL.
same_losses() {  # same_losses A B FROM TOL WHAT
  ${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/$1" "$tmp/$2" "$3" "$4" <<'PY' || fail "$5"
import json, sys
a, b, first, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
la = {j["step"]: j["loss"] for j in map(json.loads, open(a)) if "step" in j}
lb = {j["step"]: j["loss"] for j in map(json.loads, open(b)) if "step" in j}
steps = range(first, 7)
assert all(s in la and s in lb for s in steps), (sorted(la), sorted(lb))
worst = max(abs(la[s] - lb[s]) for s in steps)
assert worst <= tol, f"largest difference {worst:.3g} > {tol}: {[(s, la[s], lb[s]) for s in steps]}"
PY
}
zero3=(--set pp=2 --set dp=2 --set mb=4)
piper 4 full.txt 1f1b_zero3.piper "${zero3[@]}" --steps 6 --metrics "$tmp/full.jsonl" || fail "uninterrupted run: $(cat "$tmp/full.txt")"
piper 4 save.txt 1f1b_zero3.piper "${zero3[@]}" --steps 3 --checkpoint "$tmp/ck" --save-every 2 || fail "checkpointed run: $(cat "$tmp/save.txt")"
[ -f "$tmp/ck/step-00000003/manifest.json" ] && [ ! -e "$tmp/ck/step-00000002" ] ||
  fail "the checkpoint after step 3 replaces the one after step 2: $(ls -R "$tmp/ck")"

piper 4 same.txt 1f1b_zero3.piper "${zero3[@]}" --steps 6 --resume "$tmp/ck" --metrics "$tmp/same.jsonl" ||
  fail "resume, same strategy: $(cat "$tmp/same.txt")"
grep -q "resumed from .*step-00000003 (step 3" "$tmp/same.txt" || fail "resume says what it loaded: $(cat "$tmp/same.txt")"
same_losses full.jsonl same.jsonl 4 0 "resumed by the same strategy: bit-identical losses"
piper 1 single.txt single.piper --steps 6 --resume "$tmp/ck" --metrics "$tmp/single.jsonl" || fail "reshard to single: $(cat "$tmp/single.txt")"
same_losses full.jsonl single.jsonl 4 1e-5 "resharded to single on 1 rank"
piper 2 zero1.txt zero1.piper --set dp=2 --steps 6 --resume "$tmp/ck" --metrics "$tmp/zero1.jsonl" || fail "reshard to zero1: $(cat "$tmp/zero1.txt")"
same_losses full.jsonl zero1.jsonl 4 1e-5 "resharded to ZeRO-1 dp=2"
piper 2 dpv.txt dualpipev.piper --set pp=2 --set mb=4 --steps 6 --resume "$tmp/ck" --metrics "$tmp/dpv.jsonl" ||
  fail "reshard to dualpipev: $(cat "$tmp/dpv.txt")"
same_losses full.jsonl dpv.jsonl 4 1e-5 "resharded to DualPipeV pp=2"
# Into full DualPipe (each stage held twice: both copies load it) and, saved by it, back to single.
piper 2 dp2.txt dualpipe.piper --set pp=2 --set mb=4 --steps 5 --resume "$tmp/ck" --checkpoint "$tmp/ck_mirror" \
  --check-copies --metrics "$tmp/dp2.jsonl" || fail "reshard to dualpipe: $(cat "$tmp/dp2.txt")"
grep -q '"copy_diff":0,' "$tmp/dp2.jsonl" && ! grep -q '"copy_diff":[1-9]' "$tmp/dp2.jsonl" ||
  fail "dualpipe's copies equal after resuming: $(cat "$tmp/dp2.jsonl")"
piper 1 back.txt single.piper --steps 6 --resume "$tmp/ck_mirror" --metrics "$tmp/back.jsonl" || fail "dualpipe -> single: $(cat "$tmp/back.txt")"
same_losses full.jsonl back.jsonl 6 1e-5 "saved by DualPipe (mirrored stages), resumed by single"

# Saved by plain DP (each replica whole, replica 0 writes), loaded into ZeRO-3 shards.
piper 2 dp.txt dp.piper --set dp=2 --steps 3 --checkpoint "$tmp/ck_dp" || fail "dp checkpoint: $(cat "$tmp/dp.txt")"
piper 2 z3.txt zero3.piper --set dp=2 --steps 6 --resume "$tmp/ck_dp" --metrics "$tmp/z3.jsonl" || fail "dp -> zero3: $(cat "$tmp/z3.txt")"
same_losses full.jsonl z3.jsonl 4 1e-5 "saved by DP, resumed by ZeRO-3"

# A save that died half-way (its temporary folder) is ignored: the complete one is used.
mkdir -p "$tmp/ck/.step-00000005.tmp" && echo garbage >"$tmp/ck/.step-00000005.tmp/manifest.json"
piper 1 partial.txt single.piper --steps 4 --resume "$tmp/ck" || fail "a half-written save is ignored: $(cat "$tmp/partial.txt")"

expect_error() {  # expect_error TEXT WHAT -- piper args...
  local text=$1 what=$2
  shift 3
  if piper "$@"; then fail "$what: succeeded"; fi
  grep -qF -- "$text" "$tmp/$2" || fail "$what: '$text' not in: $(cat "$tmp/$2")"
}
cp -r "$tmp/ck" "$tmp/bad"
bin=$tmp/bad/step-00000003/rank-00002.bin
printf '\xff\xff\xff\xff' | dd of="$bin" bs=1 seek=8 conv=notrunc 2>/dev/null
expect_error "rank-00002.bin is corrupt" "a corrupt checkpoint" -- 1 err1.txt single.piper --steps 4 --resume "$tmp/bad"
rm "$bin"
expect_error "rank-00002.bin is missing or truncated" "a partial checkpoint" -- 1 err2.txt single.piper --steps 4 --resume "$tmp/bad"
expect_error "no complete checkpoint" "an empty folder" -- 1 err3.txt single.piper --steps 4 --resume "$tmp/none"
expect_error "saved with optimizer adamw, this run uses sgd" "another optimizer" -- 1 err4.txt single.piper --steps 4 \
  --resume "$tmp/ck" --optimizer sgd
# Tensor-parallel slices are saved by name, element range of the slice and where the slice lies in
# the whole parameter: a tp=2 checkpoint resumes under tp=2 (bit-identical), single, ZeRO-3 dp=2 and
# 1F1B pp=2; ZeRO-1 dp=2 × tp=2 (ZeRO shards of slices) into single and 1F1B pp=2 × tp=2; and single's
# into tp=2 and ZeRO-1 dp=2 × tp=2.
piper 2 tp_full.txt tp.piper --steps 6 --metrics "$tmp/tp_full.jsonl" || fail "tp=2 uninterrupted: $(cat "$tmp/tp_full.txt")"
piper 2 tp_save.txt tp.piper --steps 3 --checkpoint "$tmp/ck_tp" || fail "tp=2 checkpoint: $(cat "$tmp/tp_save.txt")"
grep -q '"slice"' "$tmp/ck_tp/step-00000003/manifest.json" || fail "a tp=2 checkpoint records its slices"
piper 2 tp_same.txt tp.piper --steps 6 --resume "$tmp/ck_tp" --metrics "$tmp/tp_same.jsonl" || fail "tp -> tp: $(cat "$tmp/tp_same.txt")"
same_losses tp_full.jsonl tp_same.jsonl 4 0 "tp=2 resumed by tp=2: bit-identical losses"
resumes() {  # resumes CHECKPOINT WHAT -- NP STRATEGY args...: resumed, within 1e-5 of the uninterrupted run
  local ck=$1 what=$2 np=$4 strategy=$5
  shift 5
  piper "$np" res.txt "$strategy" "$@" --steps 6 --resume "$tmp/$ck" --metrics "$tmp/res.jsonl" || fail "$what: $(cat "$tmp/res.txt")"
  same_losses full.jsonl res.jsonl 4 1e-5 "$what"
}
resumes ck_tp "tp=2 into single" -- 1 single.piper
resumes ck_tp "tp=2 into ZeRO-3 dp=2" -- 2 zero3.piper --set dp=2
resumes ck_tp "tp=2 into 1F1B pp=2" -- 2 1f1b.piper --set pp=2 --set mb=4
zero1_tp=("$root/tests/strategies/zero1_tp.piper" --set dp=2 --set tp=2)
piper 4 ztp_save.txt "${zero1_tp[@]}" --steps 3 --checkpoint "$tmp/ck_ztp" || fail "zero1 x tp checkpoint: $(cat "$tmp/ztp_save.txt")"
resumes ck_ztp "ZeRO-1 dp=2 x tp=2 into single" -- 1 single.piper
resumes ck_ztp "ZeRO-1 dp=2 x tp=2 into 1F1B pp=2 x tp=2" -- 4 1f1b_tp.piper --set pp=2 --set tp=2 --set mb=4
piper 1 single_save.txt single.piper --steps 3 --checkpoint "$tmp/ck_single" || fail "single checkpoint: $(cat "$tmp/single_save.txt")"
resumes ck_single "single into tp=2" -- 2 tp.piper
resumes ck_single "single into ZeRO-1 dp=2 x tp=2" -- 4 "${zero1_tp[@]}"
# Negative control: the MLPs' row-parallel slices swapped in the manifest (all slices swapped would
# permute heads and hidden units alike, which the network does not notice) put each half where the
# other belongs — the reader places slices by what the manifest says, so the 1e-5 check fails.
cp -r "$tmp/ck_tp" "$tmp/ck_swap"
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/ck_swap/step-00000003/manifest.json" <<'PY' || fail "editing the manifest"
import json, sys
m = json.load(open(sys.argv[1]))
rows = [e for e in m["entries"] if "slice" in e and e["region"].endswith(".mlp") and e["slice"]["dim"] == 1]
assert rows, "no row-parallel MLP slices"
for e in rows:
    e["slice"]["coord"] = 1 - e["slice"]["coord"]
json.dump(m, open(sys.argv[1], "w"))
PY
piper 1 swap.txt single.piper --steps 6 --resume "$tmp/ck_swap" --metrics "$tmp/swap.jsonl" || fail "swapped slices: $(cat "$tmp/swap.txt")"
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/full.jsonl" "$tmp/swap.jsonl" <<'PY' || fail "slices placed by swapped coordinates still train alike"
import json, sys
a, b = ({j["step"]: j["loss"] for j in map(json.loads, open(f)) if "step" in j} for f in sys.argv[1:])
assert max(abs(a[s] - b[s]) for s in (4, 5, 6)) > 1e-5, [(a[s], b[s]) for s in (4, 5, 6)]
PY
sed -i -E 's/"coord": ?0/"coord":7/' "$tmp/ck_swap/step-00000003/manifest.json"
expect_error "does not fit its parameter's shape" "a malformed slice entry" -- 1 err_slice.txt single.piper --steps 4 \
  --resume "$tmp/ck_swap"
# --save-model of a tp=2 run: the whole parameters, element for element those of single's run. SGD,
# because AdamW divides by the gradient's own size: the key bias's gradient is zero but for rounding
# (softmax ignores a shift), so its update is rounding noise scaled to ~lr and differs by 1e-5.
piper 2 tp_model.txt tp.piper --steps 2 --optimizer sgd --save-model "$tmp/tp_trained.pt" ||
  fail "tp=2 --save-model: $(cat "$tmp/tp_model.txt")"
piper 1 single_model.txt single.piper --steps 2 --optimizer sgd --save-model "$tmp/single_trained.pt" ||
  fail "single --save-model: $(cat "$tmp/single_model.txt")"
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/tp_trained.pt" "$tmp/single_trained.pt" <<'PY' || fail "tp=2's saved model against single's"
import sys, torch
a, b = (dict(torch.jit.load(f).named_parameters()) for f in sys.argv[1:])
assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a), "names and shapes"
worst = max(float((a[k] - b[k]).abs().max()) for k in a)
assert worst <= 1e-6, f"largest difference {worst:.3g}"
PY

if timeout 60 "$run" "$tmp/other.pt" "$root/strategies/single.piper" "${common[@]}" --steps 4 --resume "$tmp/ck" >"$tmp/err5.txt" 2>&1; then
  fail "another model's checkpoint: succeeded"
fi
grep -qE "which this model does not" "$tmp/err5.txt" || fail "another model's checkpoint: $(cat "$tmp/err5.txt")"

# --save-model: PyTorch loads it with trainable parameters holding the trained values.
piper 4 model.txt 1f1b_zero3.piper "${zero3[@]}" --steps 2 --save-model "$tmp/trained.pt" --metrics "$tmp/model.jsonl" ||
  fail "--save-model: $(cat "$tmp/model.txt")"
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/trained.pt" "$tmp/model.jsonl" <<'PY' || fail "the saved model in PyTorch"
import json, sys, torch
m = torch.jit.load(sys.argv[1])
params = list(m.parameters())
assert params and all(p.requires_grad for p in params), "parameters must be trainable"
final = [json.loads(l) for l in open(sys.argv[2]) if "final_param_sum" in l][0]
s = sum(float(p.double().sum()) for p in params)
assert abs(s - final["final_param_sum"]) <= 1e-6 * max(1.0, abs(s)), (s, final)
PY
timeout 60 "$run" "$tmp/trained.pt" "$root/strategies/single.piper" "${common[@]}" --steps 1 >"$tmp/again.txt" 2>&1 ||
  fail "piper-run trains the saved model: $(cat "$tmp/again.txt")"

finish checkpoint_test
