#!/usr/bin/env bash
# Memory the plan promises, measured in one invocation (issue: ZeRO saves what it claims, the memory
# model predicts it). Three parts:
#  1. ZeRO-1/2/3 against plain DP (gpt 8 layers, d=384, batch 2, dp=2) and 1F1B x ZeRO-3 against
#     1F1B x DP (pp=2 x dp=2): measured peak tensor bytes per rank and their ratios.
#  2. Every library strategy at 2-4 ranks on that model: predicted (piper-check --emit sim-json)
#     against measured (piper-run --metrics) per rank.
#  3. The paper's experiment (gpt 8 layers, d=768, 227 MB of fp32 parameters, pp=2 x dp=2): the
#     memory model finds each strategy's largest microbatch under a limit where 1F1B x DP fits 2
#     samples; piper-run --memory-limit confirms both sizes run and one sample more runs out.
# Usage: bench/memory_bench.sh [BUILD_DIR]   (a few minutes on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
check=$build/tools/piper-check run=$build/tools/piper-run model=$build/tools/piper-model
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
S=$root/strategies

# run NP STRATEGY BATCH NAME [ARGS...]: measured metrics in $tmp/NAME.jsonl, predicted in $tmp/NAME.sim.json
run() {
  local np=$1 strategy=$2 batch=$3 name=$4 m=$5; shift 5
  "$check" "$m" "$strategy" --np "$np" --batch-size "$batch" "$@" --emit sim-json -o "$tmp/$name.sim.json"
  mpirun -np "$np" --oversubscribe --bind-to none "$run" "$m" "$strategy" --batch-size "$batch" --steps 3 \
    --threads 1 --metrics "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; exit 1; }
}
report() {  # report NAME... : one line per run, predicted vs measured per rank
  /usr/bin/python3 - "$tmp" "$@" <<'PY'
import json, sys
tmp, names = sys.argv[1], sys.argv[2:]
worst_all = 0
for n in names:
    sim = json.load(open(f"{tmp}/{n}.sim.json"))
    rows = [json.loads(l) for l in open(f"{tmp}/{n}.jsonl") if '"step"' in l]
    meas = rows[-1]["peak_tensor_bytes_by_rank"]
    errs = [(r["peak_bytes"] - m) / m for r, m in zip(sim["ranks"], meas)]
    worst = max(abs(e) for e in errs); worst_all = max(worst_all, worst)
    cells = " ".join(f"{r['peak_bytes']/2**20:7.1f}/{m/2**20:7.1f}" for r, m in zip(sim["ranks"], meas))
    print(f"  {n:<34} {cells}   worst {worst*100:4.1f}%")
print(f"  worst of all: {worst_all*100:.1f}% (predicted/measured MiB per rank)")
PY
}
peak() { /usr/bin/python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"step\"' in l][-1]; print(r['peak_tensor_bytes'])" "$1"; }
ratio() { /usr/bin/python3 -c "import sys; print(f'{int(sys.argv[1])/int(sys.argv[2]):.3f}')" "$1" "$2"; }

echo "== 1. ZeRO saves what it claims (gpt 8 layers d=384 heads 6 ffn 1536 seq 64, batch 2)"
"$model" gpt --layers 8 --d-model 384 --heads 6 --ffn 1536 --seq 64 -o "$tmp/m384.pt"
for z in dp zero1 zero2 zero3; do run 2 "$S/$z.piper" 2 "$z" "$tmp/m384.pt"; done
base=$(peak "$tmp/dp.jsonl")
printf '  %-8s %10s %8s   (theory for fp32 AdamW model states at dp=2: 1, 0.75, 0.625, 0.5)\n' strategy "peak MiB" "vs DP"
for z in dp zero1 zero2 zero3; do
  p=$(peak "$tmp/$z.jsonl"); printf '  %-8s %10.1f %8s\n' "$z" "$(/usr/bin/python3 -c "print($p/2**20)")" "$(ratio "$p" "$base")"
done
run 4 "$S/1f1b_dp.piper" 2 pp_dp "$tmp/m384.pt" --set pp=2 --set dp=2 --set mb=1
run 4 "$S/1f1b_zero3.piper" 2 pp_zero3 "$tmp/m384.pt" --set pp=2 --set dp=2 --set mb=1
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
def byrank(n): return [json.loads(l) for l in open(f"{t}/{n}.jsonl") if '"step"' in l][-1]["peak_tensor_bytes_by_rank"]
a, b = byrank("pp_dp"), byrank("pp_zero3")
print("  1f1b_zero3 / 1f1b_dp per rank (pp=2 x dp=2):", " ".join(f"{z/d:.3f}" for z, d in zip(b, a)))
PY

echo "== 2. predicted vs measured per rank, every library strategy (same model; batch 8)"
names=()
add() { names+=("$1"); run "$2" "$S/$3" 8 "$1" "$tmp/m384.pt" "${@:4}"; }
add single 1 single.piper --set mb=2
add dp 2 dp.piper
add zero1 2 zero1.piper
add zero2 2 zero2.piper
add zero3 2 zero3.piper
add gpipe_pp2 2 gpipe.piper --set pp=2 --set mb=4
add 1f1b_pp2 2 1f1b.piper --set pp=2 --set mb=4
add 1f1b_pp4 4 1f1b.piper --set pp=4 --set mb=8
add interleaved_pp2_v2 2 interleaved_1f1b.piper --set pp=2 --set v=2 --set mb=4
add zb1p_pp2 2 zb1p.piper --set pp=2 --set mb=4
add dualpipev_pp2 2 dualpipev.piper --set pp=2 --set mb=4
add 1f1b_dp 4 1f1b_dp.piper --set pp=2 --set dp=2 --set mb=2
add 1f1b_zero2 4 1f1b_zero2.piper --set pp=2 --set dp=2 --set mb=2
add 1f1b_zero3 4 1f1b_zero3.piper --set pp=2 --set dp=2 --set mb=2
"$model" moe --layers 8 --d-model 384 --heads 6 --ffn 768 --seq 64 --experts 4 -o "$tmp/moe.pt"
names+=(dualpipev_ep); run 4 "$S/dualpipev_ep.piper" 8 dualpipev_ep "$tmp/moe.pt" --set pp=2 --set ep=2 --set mb=4
report "${names[@]}"

echo "== 3. bf16 mixed precision: activations halve (single device, batch 8, same model)"
printf 'use "single.piper";\nprecision bf16;\n' >"$tmp/bf16.piper"
run 1 "$S/single.piper" 8 fp32_single "$tmp/m384.pt"
run 1 "$tmp/bf16.piper" 8 bf16_single "$tmp/m384.pt" -I "$S"
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
t = sys.argv[1]
def cats(n): return [json.loads(l) for l in open(f"{t}/{n}.jsonl") if '"step"' in l][-1]["peak_tensor_bytes_by_category"]
a, b = cats("fp32_single"), cats("bf16_single")
for k in ("activations", "params", "grads", "optimizer"):
    print(f"  {k:<12} fp32 {a[k]/2**20:8.1f} MiB   bf16 {b[k]/2**20:8.1f} MiB   ratio {b[k]/a[k]:.3f}")
PY
report fp32_single bf16_single

echo "== 4. the paper's experiment: gpt 8 layers d=768 heads 12 ffn 3072 seq 32, pp=2 x dp=2 (mb=8)"
"$model" gpt --layers 8 --d-model 768 --heads 12 --ffn 3072 --seq 32 -o "$tmp/m768.pt"
limit=480MiB
for s in 1f1b_dp 1f1b_zero3; do
  "$check" "$tmp/m768.pt" "$S/$s.piper" --np 4 --set pp=2 --set dp=2 --memory-budget "$limit" --fit | tee "$tmp/$s.fit"
done
for s in 1f1b_dp 1f1b_zero3; do
  n=$(grep -o 'is [0-9]* sample' "$tmp/$s.fit" | grep -o '[0-9]*')
  for k in "$n" $((n + 1)); do
    set +e
    mpirun -np 4 --oversubscribe --bind-to none "$run" "$tmp/m768.pt" "$S/$s.piper" --set pp=2 --set dp=2 \
      --batch-size $((k * 2 * 8)) --steps 1 --threads 1 --memory-limit "$limit" >"$tmp/fit.log" 2>&1
    rc=$?
    set -e
    if [ $rc = 0 ]; then echo "  $s, $k samples per microbatch under $limit: ran, $(grep -o 'tensors [0-9.]* MiB' "$tmp/fit.log" | head -1)"
    else echo "  $s, $k samples per microbatch under $limit: $(grep -o 'out of memory.*' "$tmp/fit.log" | head -1)"; fi
  done
done
