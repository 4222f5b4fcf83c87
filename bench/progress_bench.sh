#!/usr/bin/env bash
# The progress thread's poll cap (runtime/comm/mpi_communicator.cpp), compared in one invocation:
# each round runs every plan under every cap (PIPER_PROGRESS_MAX_SLEEP_US) one after another, so
# the machine's drift hits all alike. Plans on 2 ranks (the small GPT of speed_setup.sh): 1F1B,
# interleaved 1F1B v=2 and DualPipeV at pp=2 mb=8 (handoffs), ZeRO-3 dp=2 (a collective per layer
# and microbatch). Prints, per plan and cap, tokens/s (median over rounds of the per-round median
# step) and its ratio to the first cap (median of per-round ratios, with their spread); and, from
# the last round's traces, the handoffs a compute stream waited for: how long from the later of
# the send's start and the stream's previous op's end until the consumer started (median, mean).
# Usage: bench/progress_bench.sh [BUILD_DIR] [ROUNDS] [CAPS_US...]   (caps default: 1000 20)
source "$(dirname "$0")/speed_setup.sh"
caps=("${@:3}")
[ ${#caps[@]} -gt 0 ] || caps=(1000 20)
common=(--data "$root/data/corpus.txt" --steps 12 --batch-size 16)
plans=("1f1b 1f1b.piper pp=2 mb=8" "interleaved interleaved_1f1b.piper pp=2 v=2 mb=8"
  "dualpipev dualpipev.piper pp=2 mb=8" "zero3 zero3.piper dp=2")
for r in $(seq 1 "$rounds"); do
  for p in "${plans[@]}"; do
    read -r name file sets <<<"$p"
    args=()
    for s in $sets; do args+=(--set "$s"); done
    for c in "${caps[@]}"; do
      PIPER_PROGRESS_MAX_SLEEP_US=$c mpirun -x PIPER_PROGRESS_MAX_SLEEP_US -np 2 "$build/tools/piper-run" "$tmp/m.pt" \
        "$root/strategies/$file" "${args[@]}" "${common[@]}" --metrics "$tmp/$name.$c.$r.jsonl" \
        --trace "$tmp/$name.$c.trace.json" >/dev/null
    done
  done
done
"${PIPER_PYTHON:-/usr/bin/python3}" "$root/bench/progress_report.py" "$tmp" "$rounds" "${caps[@]}"
