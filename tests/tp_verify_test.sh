#!/usr/bin/env bash
# `piper-model verify --tp 2`: the zoo's GPT and MoE regions run as two slices summed equal them
# whole (forward and gradients); a region that writes its head count in its code is refused, the
# message naming the region and the line that breaks.
# Usage: tp_verify_test.sh PIPER_MODEL
set -euo pipefail
model_bin=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for arch in gpt moe; do
  "$model_bin" "$arch" --layers 2 --d-model 32 --ffn 64 --seq 16 -o "$tmp/$arch.pt"
  "$model_bin" verify "$tmp/$arch.pt" --tp 2 | tee "$tmp/$arch.log"
  grep -q "regions as 2 slices summed vs whole: .*: ok" "$tmp/$arch.log"
done
${PIPER_PYTHON:-/usr/bin/python3} "$root/tests/hardcoded_heads_model.py" "$tmp/bad.pt"
if "$model_bin" verify "$tmp/bad.pt" --tp 2 >"$tmp/bad.log" 2>&1; then
  cat "$tmp/bad.log"; echo "verify --tp 2 accepted a region with a hard-coded head count" >&2; exit 1
fi
cat "$tmp/bad.log"
grep -q "region 'attn' does not run on a slice of 2" "$tmp/bad.log"
grep -q "reshape(B, T, 4, 8)" "$tmp/bad.log"
echo "verify --tp 2: the zoo passes; the hard-coded head count is refused at its line"
