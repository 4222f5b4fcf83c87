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
  /usr/bin/python3 - "$tmp/$strategy.json" <<'PY' || fail "$strategy: the trace's ranks do not share a time axis"
import json, re, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
ops = [e for e in ev if e.get("ph") == "X"]
assert {e["pid"] for e in ops} == {0, 1}, "a process per rank"
assert {"compute", "p2p_send", "p2p_recv"} <= {e["tid"] for e in ops}, {e["tid"] for e in ops}
assert min(e["ts"] for e in ops) >= 0
at = {(e["args"]["step"], e["name"]): e for e in ops}
slack = 200  # microseconds: one host shares one clock; this only absorbs rounding and recording order
pairs = 0
for (step, name), recv in at.items():
    m = re.fullmatch(r"(\d+)RECV_(F|B)(\d+)", name)
    if not m:
        continue
    s, kind, i = int(m.group(1)), m.group(2), m.group(3)
    send = at[(step, f"{s - 1 if kind == 'F' else s + 1}SEND_{kind}{i}")]
    assert send["pid"] != recv["pid"]
    recv_end = recv["ts"] + recv["dur"]
    assert recv_end >= send["ts"] - slack, (step, name, "ends", recv_end, "before its send began", send["ts"])
    for op in ("F",) if kind == "F" else ("B", "BI"):
        user = at.get((step, f"{s}{op}{i}"))
        if user:
            assert user["ts"] >= recv_end - slack, (step, user["name"], "starts before its input arrived")
    pairs += 1
assert pairs >= 3 * 2 * 4, pairs  # every step's handoffs, both directions
PY
done
finish trace_test
