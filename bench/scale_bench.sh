#!/usr/bin/env bash
# Plans at scale (issue 28): for Llama-3 70B (seq 8192, bf16) on N H100s (machines/h100.json, 8 per
# node, 80 GiB budget), piper-tune searches the library's 1F1B and interleaved 1F1B with ZeRO-1 dp
# and tp (bench/scale/*.piper: pp v mb balance dp tp, each with and without recomputation) and
# prints the best plan, its simulated tokens/s per GPU, model TFLOP/s per GPU and MFU (Megatron's
# accounting), and the search's wall time (median over ROUNDS and the spread). Then piper-check
# --simulate of that plan's shape at 16,384 GPUs (dp scaled up): wall time and peak RSS.
# The global batch is one 8k-token sequence per GPU (0.5M tokens at 64 GPUs, 8M at 1,024).
# Nothing here is fitted: every figure is the roofline and tiers of machines/h100.json.
# Usage: bench/scale_bench.sh [BUILD_DIR=build] [ROUNDS=3] [N...=64 256 1024]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
rounds=${2:-3}
shift 2 || shift $# || true
nps=("$@")
[ ${#nps[@]} -gt 0 ] || nps=(64 256 1024)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tools/piper-model" llama --preset llama3-70b --manifest-only -o "$tmp/llama70b.json"
machine=$root/machines/h100.json
# median and spread (min-max) of the numbers on stdin
stats() { sort -g | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "%.2f (%.2f-%.2f, %d rounds)", m, v[1], v[NR], NR}'; }
printf '%-6s %-50s %9s %11s %11s %6s %10s %s\n' GPUs "best plan" "step (s)" "tokens/s/GPU" "TFLOP/s/GPU" MFU peak "piper-tune (s)"
for np in "${nps[@]}"; do
  : >"$tmp/times"
  for ((r = 0; r < rounds; ++r)); do
    /usr/bin/time -f '%e' -o "$tmp/t" "$build/tools/piper-tune" "$tmp/llama70b.json" --np "$np" --batch-size "$np" \
      --memory-budget 80GiB --machine "$machine" -I "$root/strategies" \
      --strategy "$root/bench/scale/llama_1f1b_bf16.piper" --strategy "$root/bench/scale/llama_interleaved_bf16.piper" \
      --json >"$tmp/tune$np.json"
    cat "$tmp/t" >>"$tmp/times"
  done
  /usr/bin/python3 - "$tmp/tune$np.json" "$np" "$(stats <"$tmp/times")" "$tmp/best$np" <<'PY'
import json, sys
t = json.load(open(sys.argv[1])); np = int(sys.argv[2])
b = t["ranked"][0]
tokens = np * 8192 / b["step_time"] / np
print(f'{np:<6} {b["plan"].split("/")[-1]:<50} {b["step_time"]:9.3f} {tokens:11.0f} {b["model_tflops_per_device"]:11.1f} '
      f'{100 * b["mfu"]:5.1f}% {b["peak_bytes"] / 2**30:7.2f} GiB {sys.argv[3]}')
with open(sys.argv[4], "w") as f:  # the winner, for the 16,384-GPU check
    f.write(b["strategy"] + "\n" + ("1" if b["recompute"] else "0") + "\n")
    f.write(" ".join(f"{k}={str(v).lower()}" for k, v in b["params"].items() if k != "dp") + "\n")
PY
done
# The largest N's winner, with dp grown to fill 16,384 GPUs.
last=${nps[${#nps[@]}-1]}
{ read -r file; read -r recompute; read -r params; } <"$tmp/best$last"
printf 'use "%s";\n' "$file" >"$tmp/big.piper"
[ "$recompute" = 1 ] && printf 'recompute layers[*];\n' >>"$tmp/big.piper"
sets=()
for p in $params; do sets+=(--set "$p"); done
tp=$(tr ' ' '\n' <<<"$params" | sed -n 's/^tp=//p'); pp=$(tr ' ' '\n' <<<"$params" | sed -n 's/^pp=//p')
dp=$((16384 / tp / pp))
: >"$tmp/times"; : >"$tmp/rss"
for ((r = 0; r < rounds; ++r)); do
  /usr/bin/time -f '%e %M' -o "$tmp/t" "$build/tools/piper-check" "$tmp/llama70b.json" "$tmp/big.piper" --np 16384 \
    -I "$root/strategies" -I "$root/bench/scale" "${sets[@]}" --set dp=$dp --batch-size 16384 \
    --simulate --machine "$machine" --memory-budget 80GiB >"$tmp/check.txt"
  awk '{print $1}' "$tmp/t" >>"$tmp/times"; awk '{print $2 / 1024}' "$tmp/t" >>"$tmp/rss"
done
echo
echo "piper-check --simulate at 16,384 GPUs ($file $params dp=$dp$([ "$recompute" = 1 ] && echo ' +recompute')):"
grep -E '^  (dag|step time)' "$tmp/check.txt"
echo "  wall time (s): $(stats <"$tmp/times"); peak RSS (MiB): $(stats <"$tmp/rss")"
