"""Reads progress_bench.sh's metrics and traces and prints its table (see progress_bench.sh)."""
import json
import re
import statistics
import sys

tmp, rounds, caps = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
WARMUP = 3
PLANS = ["1f1b", "interleaved", "dualpipev", "zero3"]


def tokens(name, cap, r):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.{cap}.{r}.jsonl")]
    return statistics.median([x["tokens_per_s"] for x in rows if "tokens_per_s" in x][WARMUP:])


def waits(name, cap):
    """Microseconds from the later of a send's start and the receiving stream's previous op's end
    to the consumer's start, for every handoff a compute stream waited for."""
    ev = [e for e in json.load(open(f"{tmp}/{name}.{cap}.trace.json"))["traceEvents"]
          if e.get("ph") == "X" and e["args"]["step"] > WARMUP]
    sends, compute = {}, {}
    for e in ev:
        if m := re.fullmatch(r"(\d+)SEND_(\w)(\d+)", e["name"]):
            sends[(e["args"]["step"], int(m.group(1)), m.group(2), m.group(3))] = e
        if e["tid"] == "compute":
            compute.setdefault((e["pid"], e["args"]["step"]), []).append(e)
    for ops in compute.values():
        ops.sort(key=lambda e: e["ts"])
    out = []
    for e in ev:
        m = re.fullmatch(r"(\d+)RECV_(\w)(\d+)", e["name"])
        if not m:
            continue
        s, kind, i, step = int(m.group(1)), m.group(2), m.group(3), e["args"]["step"]
        send = sends.get((step, s - 1 if kind == "F" else s + 1, kind, i))
        arrived = e["ts"] + e["dur"]
        ops = compute[(e["pid"], step)]
        # The consumer: this stage's first op of microbatch i on the compute stream after the arrival.
        users = [k for k, c in enumerate(ops) if c["ts"] >= arrived - 50 and re.fullmatch(rf"{s}\D+{i}", c["name"])]
        if not send or not users or users[0] == 0:
            continue
        k = users[0]
        ready = ops[k - 1]["ts"] + ops[k - 1]["dur"]
        if arrived > ready:  # the stream waited for this handoff
            out.append(ops[k]["ts"] - max(send["ts"], ready))
    return out


print(f"progress thread poll cap (PIPER_PROGRESS_MAX_SLEEP_US), {rounds} rounds, 2 ranks; tokens/s median over rounds")
for name in PLANS:
    base = [tokens(name, caps[0], r) for r in range(1, rounds + 1)]
    for cap in caps:
        tps = [tokens(name, cap, r) for r in range(1, rounds + 1)]
        ratios = sorted(t / b for t, b in zip(tps, base))
        w = waits(name, cap)
        wtxt = f"waited handoffs {len(w)}: median {statistics.median(w):.0f} us, mean {statistics.mean(w):.0f} us" if w else ""
        print(f"  {name:12s} cap {cap:>5s} us  {statistics.median(tps):7.0f} tokens/s  x{statistics.median(ratios):.3f} "
              f"({ratios[0]:.3f}-{ratios[-1]:.3f})  {wtxt}")
