# Checks a piper-run --trace file of a pipeline on one time axis: a process per rank, every receive
# ends after its send began and every consumer of a received value starts after its receive ended,
# within SLACK microseconds; with MAX_OFFSET (microseconds), every rank's clock shift (the trace's
# otherData.clock_offsets_s) is within it of 0 (on a test bed of namespaces on one machine the
# clocks are one). Usage: trace_check.py TRACE RANKS SLACK_US [MAX_OFFSET_US]
import json, re, sys

trace = json.load(open(sys.argv[1]))
ranks, slack = int(sys.argv[2]), float(sys.argv[3])
ev = trace["traceEvents"]
ops = [e for e in ev if e.get("ph") == "X"]
assert {e["pid"] for e in ops} == set(range(ranks)), "a process per rank"
assert {"compute", "p2p_send", "p2p_recv"} <= {e["tid"] for e in ops}, {e["tid"] for e in ops}
assert min(e["ts"] for e in ops) >= 0
at = {(e["pid"], e["args"]["step"], e["name"]): e for e in ops}
runs = {}  # (step, token) -> the ranks that ran it, ascending: with data parallelism, a stage's replicas
for (pid, step, name) in sorted(at):
    runs.setdefault((step, name), []).append(pid)
pairs, worst = 0, float("inf")
for (pid, step, name), recv in at.items():
    m = re.fullmatch(r"(\d+)RECV_(F|B)(\d+)", name)
    if not m:
        continue
    s, kind, i = int(m.group(1)), m.group(2), m.group(3)
    token = f"{s - 1 if kind == 'F' else s + 1}SEND_{kind}{i}"
    # Rank k of one stage sends to rank k of the next (ir/p2p.cpp).
    send = at[(runs[(step, token)][runs[(step, name)].index(pid)], step, token)]
    assert send["pid"] != recv["pid"]
    recv_end = recv["ts"] + recv["dur"]
    worst = min(worst, recv_end - send["ts"])
    assert recv_end >= send["ts"] - slack, (step, name, "on rank", pid, "ends", recv_end, "before its send began", send["ts"])
    for op in ("F",) if kind == "F" else ("B", "BI"):
        user = at.get((pid, step, f"{s}{op}{i}"))
        if user:
            assert user["ts"] >= recv_end - slack, (step, user["name"], "starts before its input arrived")
    pairs += 1
steps = len({e["args"]["step"] for e in ops})
assert pairs >= 3 * 2 * steps, pairs  # every step's handoffs, both directions
if len(sys.argv) > 4:
    offsets = trace["otherData"]["clock_offsets_s"]
    off = max(abs(o) for o in offsets) * 1e6
    assert off <= float(sys.argv[4]), f"clock offsets {offsets} (true: 0) beyond {sys.argv[4]} us"
    print(f"trace: {pairs} handoffs; the earliest receive end is {worst:.0f} us after its send began; clock offsets within {off:.1f} us of 0")
