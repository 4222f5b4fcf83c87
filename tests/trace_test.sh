#!/usr/bin/env bash
# piper-run --trace on two ranks: one file with a process per rank and a thread per stream, and one
# time axis for all ranks — every receive ends after its send began, and every consumer of a
# received value starts after its receive ended (so a pipeline's handoffs read right in Perfetto).
# Usage: trace_test.sh PIPER_RUN PIPER_MODEL
source "$(dirname "$0")/mpi_test_lib.sh"
for strategy in 1f1b interleaved_1f1b; do
  sets=(--set pp=2 --set mb=4)
  [ "$strategy" = interleaved_1f1b ] && sets+=(--set v=2)
  mpirun -np 2 "$run" "$tmp/m.pt" "$root/strategies/$strategy.piper" "${sets[@]}" --batch-size 8 --steps 4 \
    --threads 1 --trace "$tmp/$strategy.json" >"$tmp/$strategy.log" 2>&1 </dev/null || { fail "$strategy: $(tail -5 "$tmp/$strategy.log")"; continue; }
  # 200 µs: one host shares one clock; this only absorbs rounding and recording order.
  ${PIPER_PYTHON:-/usr/bin/python3} "$root/tests/trace_check.py" "$tmp/$strategy.json" 2 200 >/dev/null ||
    fail "$strategy: the trace's ranks do not share a time axis"
done
finish trace_test
