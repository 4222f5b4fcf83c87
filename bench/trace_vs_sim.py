"""A run's trace against its simulation, op by op: where the measured compute streams wait that the
simulated ones do not. Usage: trace_vs_sim.py RUN_TRACE SIM_TRACE [WARMUP]
RUN_TRACE is piper-run --trace; SIM_TRACE is piper-check --emit trace for the same plan and machine
file. Takes the run's median step (by span) after WARMUP steps; prints per rank each compute op's
gap before it and its duration, simulated and measured (ms), marking waits 1 ms longer than
simulated, then the totals and the idle fractions over the step's span as speed_bench counts them."""
import json
import sys


def load(path):
    ev = json.load(open(path))["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    ops = [e for e in ev if e.get("ph") == "X"]
    for e in ops:  # the simulation numbers its streams and names them in metadata; the run names them
        e["stream"] = threads.get((e["pid"], e["tid"]), e["tid"])
    return ops


def median_step(ops, warmup):
    steps = sorted({e["args"]["step"] for e in ops if e["args"]["step"] > warmup})
    span = {s: max(e["ts"] + e["dur"] for e in ops if e["args"]["step"] == s) -
            min(e["ts"] for e in ops if e["args"]["step"] == s) for s in steps}
    med = sorted(steps, key=span.get)[len(steps) // 2]
    return med, [e for e in ops if e["args"]["step"] == med]


def per_rank(ops):  # rank -> [(op, gap before it, duration)] on the compute stream, ms; and the span
    t0, end = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    out = {}
    for rank in sorted({e["pid"] for e in ops}):
        prev, rows = t0, []
        for e in sorted((e for e in ops if e["pid"] == rank and e["stream"] == "compute"), key=lambda e: e["ts"]):
            rows.append((e["name"], (e["ts"] - prev) / 1e3, e["dur"] / 1e3))
            prev = e["ts"] + e["dur"]
        rows.append(("(end)", (end - prev) / 1e3, 0.0))
        out[rank] = rows
    return out, (end - t0) / 1e3


def main():
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    step, run = median_step(load(sys.argv[1]), warmup)
    measured, run_span = per_rank(run)
    simulated, sim_span = per_rank(load(sys.argv[2]))
    print(f"step span: simulated {sim_span:.1f} ms, measured {run_span:.1f} ms (step {step}, the median)")
    for rank, rows in measured.items():
        sim = {name: (gap, dur) for name, gap, dur in simulated.get(rank, [])}
        print(f"rank {rank}: {'op':12s} {'sim gap':>8s} {'dur':>7s}   {'run gap':>8s} {'dur':>7s}")
        for name, gap, dur in rows:
            sg, sd = sim.get(name, (float("nan"), float("nan")))
            mark = "  <-- waits longer" if gap - sg > 1.0 else ""
            print(f"  {name:12s} {sg:8.2f} {sd:7.2f}   {gap:8.2f} {dur:7.2f}{mark}")
        sim_rows = simulated.get(rank, [])
        busy_s, busy_m = sum(r[2] for r in sim_rows), sum(r[2] for r in rows)
        print(f"  busy: simulated {busy_s:.1f}, measured {busy_m:.1f} ms; idle fraction: simulated "
              f"{1 - busy_s / sim_span:.3f}, measured {1 - busy_m / run_span:.3f}")


if __name__ == "__main__":
    main()
