"""Reads speed_bench.sh's metrics and traces and prints its three tables (see speed_bench.sh)."""
import collections
import json
import re
import statistics
import sys

tmp, rounds = sys.argv[1], int(sys.argv[2])
WARMUP = 3


def tokens_per_s(name, runs=None):
    per_round = []
    for r in range(1, (runs or rounds) + 1):
        rows = [json.loads(l) for l in open(f"{tmp}/{name}.{r}.jsonl")]
        steps = [x["tokens_per_s"] for x in rows if "tokens_per_s" in x][WARMUP:]
        per_round.append(statistics.median(steps))
    return statistics.median(per_round), per_round


def spans(name, r=None):  # a round's trace (the last round's by default)
    ev = json.load(open(f"{tmp}/{name}.{r or rounds}.trace.json"))["traceEvents"]
    return [e for e in ev if e.get("ph") == "X" and e["args"]["step"] > WARMUP]


def op_times(name):
    d = collections.defaultdict(list)
    for e in spans(name):
        m = re.match(r"(\d+)(BI|BW|B|F)\d", e["name"])
        if m:
            d[(int(m.group(1)), m.group(2))].append(e["dur"] / 1e3)
    return {k: statistics.median(v) for k, v in d.items()}


print("1. tokens/s (median over rounds; the rounds in brackets); against one rank as piper-run starts it (its"
      " threads: the node's cores) and against one rank on one core (--threads 1, as each pipeline rank runs)")
base, _ = tokens_per_s("single")
core, _ = tokens_per_s("alone")
rows = {}
for name, label in [("single", "one rank, 8 microbatches"), ("1f1b", "1F1B pp=2 mb=8"), ("gpipe", "GPipe pp=2 mb=8"),
                    ("interleaved", "interleaved v=2 pp=2 mb=8"), ("zb1p", "ZB1P pp=2 mb=8"),
                    ("dualpipev", "DualPipeV pp=2 mb=8"), ("dualpipe", "DualPipe pp=2 mb=8"), ("zbv", "ZBV pp=2 mb=8"),
                    ("vmin", "V-Min pp=2 mb=8"), ("vhalf", "V-Half pp=2 mb=8"),
                    ("interleaved_zb", "interleaved ZB v=2 pp=2 mb=8")]:
    t, per = tokens_per_s(name)
    rows[name] = t
    print(f"   {label:28s} {t:8.0f}  ({', '.join(f'{x:.0f}' for x in per)})  {t / base:5.2f}x one rank  "
          f"{t / core:5.2f}x one core")
paired = {n: [a / b for a, b in zip(tokens_per_s(n)[1], tokens_per_s("1f1b")[1])]
          for n in ("zb1p", "dualpipev", "dualpipe", "zbv", "vmin", "vhalf", "interleaved", "interleaved_zb")}
print(f"   ZB1P / 1F1B {rows['zb1p'] / rows['1f1b']:.3f}x   DualPipeV / 1F1B {rows['dualpipev'] / rows['1f1b']:.3f}x   "
      f"ZBV / 1F1B {rows['zbv'] / rows['1f1b']:.3f}x   (round by round, the median: {statistics.median(paired['zb1p']):.3f}x, "
      f"{statistics.median(paired['dualpipev']):.3f}x and {statistics.median(paired['zbv']):.3f}x; the machine drifts "
      f"between rounds, less within one)")
print(f"   V-Min / 1F1B, round by round, the median: {statistics.median(paired['vmin']):.3f}x "
      f"({min(paired['vmin']):.3f}-{max(paired['vmin']):.3f})")
print(f"   V-Half / 1F1B, round by round, the median: {statistics.median(paired['vhalf']):.3f}x "
      f"({min(paired['vhalf']):.3f}-{max(paired['vhalf']):.3f})")
print(f"   DualPipe / 1F1B, round by round, the median: {statistics.median(paired['dualpipe']):.3f}x "
      f"({min(paired['dualpipe']):.3f}-{max(paired['dualpipe']):.3f})")
print(f"   interleaved ZB / interleaved 1F1B, round by round, the median: "
      f"{statistics.median(a / b for a, b in zip(paired['interleaved_zb'], paired['interleaved'])):.3f}x")
busy, per = tokens_per_s("1f1b_busy")
print(f"   1F1B with the progress thread never idle-priority (PIPER_PROGRESS_IDLE=0): {busy:.0f}  "
      f"({', '.join(f'{x:.0f}' for x in per)});  SCHED_IDLE while only receives wait: {rows['1f1b'] / busy:.3f}x")

print("2. the split backward")
for line in open(f"{tmp}/split.txt").read().strip().splitlines():
    print("   in one process: " + line)
print("   from the pipelines' traces (median op times, ms):")
b, z = op_times("1f1b"), op_times("zb1p")
for stage in sorted({k[0] for k in b}):
    if (stage, "B") in b and (stage, "BW") in z:
        bi, bw = z.get((stage, "BI"), 0.0), z[(stage, "BW")]
        print(f"   stage {stage}: B {b[(stage, 'B')]:.1f}   BI {bi:.1f} + BW {bw:.1f} = {bi + bw:.1f}   "
              f"{(bi + bw) / b[(stage, 'B')]:.3f}x B")

print("3. idle fraction of the compute streams (mean over ranks; measured: each round's median step, over the step's"
      " span on all ranks, as simulated; the median over rounds and their min-max); simulated on the profile, and"
      " each step simulated again on its own op times (piper-check --op-times: the gap left is the schedule"
      " model's, not the costs')")


def union(iv):  # total length of the union of intervals
    total, end = 0.0, float("-inf")
    for s0, e0 in sorted(iv):
        if e0 > end:
            total += e0 - max(s0, end)
            end = e0
    return total


def per_step(name, r):
    """Per step of round r: each rank's idle fraction, 1 - its compute time over the step, as the
    simulator counts it (step time - busy), the step running from the first op of any rank to the
    last of any (the trace's one time axis), so a rank that finishes early idles until the step
    ends; and each rank's compute time (seconds)."""
    ev = spans(name, r)
    out = {}
    for step in sorted({e["args"]["step"] for e in ev}):
        ops = [e for e in ev if e["args"]["step"] == step]
        span = max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)
        idle, busy = [], []
        for rank in sorted({e["pid"] for e in ev}):
            comp = union([(e["ts"], e["ts"] + e["dur"]) for e in ops if e["pid"] == rank and e["tid"] == "compute"])
            idle.append(1 - comp / span)
            busy.append(comp / 1e6)
        out[step] = (idle, busy)
    return out


def step_measured(name, r):
    """The mean over ranks of each rank's median idle fraction over the steps of round r, and each
    rank's median compute time."""
    steps = per_step(name, r).values()
    ranks = range(len(next(iter(steps))[0]))
    return (statistics.mean(statistics.median(s[0][k] for s in steps) for k in ranks),
            [statistics.median(s[1][k] for s in steps) for k in ranks])


def idle_measured(name, r):
    return step_measured(name, r)[0]


def idle_simulated(name, path=None):  # on the profile's costs, or as `path` simulated it
    ranks = json.load(open(path or f"{tmp}/{name}.sim.json"))["ranks"]
    return statistics.mean(x["idle"] / (x["busy"] + x["idle"]) for x in ranks)


def step_gaps(name):  # per step of every round: measured idle - the step simulated on its own op times
    gaps = []
    for r in range(1, rounds + 1):
        for step, (idle, _) in per_step(name, r).items():
            gaps.append(statistics.mean(idle) - idle_simulated(name, f"{tmp}/{name}.{r}.s{step}.replay.json"))
    return sorted(gaps)


def cost_drift(name):
    """Per rank, its measured compute time per step over the simulated one (the profile's costs):
    the median over rounds. Where the gap exceeds what the schedule explains, this says whether the
    run's costs moved away from the profile's, and on which rank (a zero-bubble order fills the
    gaps the profiled costs leave; a rank that runs slower or faster opens others)."""
    sim = [r["busy"] for r in json.load(open(f"{tmp}/{name}.sim.json"))["ranks"]]
    runs = [step_measured(name, r)[1] for r in range(1, rounds + 1)]
    return [statistics.median(run[k] for run in runs) / sim[k] for k in range(len(sim))]


def round_gaps(name):  # per round: measured idle - the round simulated on its own op times (steps 4-12)
    return sorted(idle_measured(name, r) - idle_simulated(name, f"{tmp}/{name}.{r}.run.json") for r in range(1, rounds + 1))


for name, label in [("1f1b", "1F1B"), ("gpipe", "GPipe"), ("interleaved", "interleaved v=2"), ("zb1p", "ZB1P"),
                    ("dualpipev", "DualPipeV"), ("dualpipe", "DualPipe"), ("zbv", "ZBV"), ("vmin", "V-Min"), ("vhalf", "V-Half"),
                    ("interleaved_zb", "interleaved ZB v=2")]:
    idle = [idle_measured(name, r) for r in range(1, rounds + 1)]
    med, sim = statistics.median(idle), idle_simulated(name)
    drift = "/".join(f"{x:.2f}" for x in cost_drift(name))
    gaps = step_gaps(name)
    within = sum(abs(g) <= 0.03 for g in gaps) / len(gaps)
    run = round_gaps(name)
    print(f"   {label:18s} measured {med:.3f} ({min(idle):.3f}-{max(idle):.3f})   simulated {sim:.3f}   "
          f"gap {med - sim:+.3f}   compute run/sim per rank {drift}   each round on its op times: gap "
          f"{statistics.median(run):+.3f} ({run[0]:+.3f} to {run[-1]:+.3f})   each step on its own op times: gap "
          f"{statistics.median(gaps):+.3f} ({gaps[0]:+.3f} to {gaps[-1]:+.3f}; {within:.0%} of steps within 0.03)")
p, m = 2, 8
print(f"   (1F1B's formula (p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.3f})")

print("4. the machine: two independent one-rank jobs at once")
alone, _ = tokens_per_s("alone")
a, _ = tokens_per_s("pair_a")
b, _ = tokens_per_s("pair_b")
print(f"   one alone {alone:.0f} tokens/s; two at once {a:.0f} + {b:.0f} = {a + b:.0f}: {(a + b) / alone:.2f}x "
      f"(a pipeline of 2 can reach at most this x (1 - 1/9) = {(a + b) / alone * 8 / 9:.2f}x)")

print("5. dp=2, 1 MiB buckets: all-reduce time overlapping compute")


def overlap(a, b):  # total length of a's intervals covered by b's (b's disjoint: one stream)
    total = 0.0
    for s0, e0 in a:
        for s1, e1 in b:
            total += max(0.0, min(e0, e1) - max(s0, s1))
    return total


def hidden(name, token, r=None):  # (overlapped, total) microseconds of ops named with `token`
    ev = spans(name, r)
    total = covered = 0.0
    for rank in sorted({e["pid"] for e in ev}):
        mine = [e for e in ev if e["pid"] == rank]
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in mine if token in e["name"]]
        comp = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["tid"] == "compute"]
        total += sum(e - s for s, e in comm)
        covered += overlap(comm, comp)
    return covered, total


covered, total = hidden("dp", "ALLREDUCE")
t, _ = tokens_per_s("dp")
print(f"   {covered / max(total, 1e-9):.3f} of {total / 1e3:.1f} ms of all-reduce overlaps compute; {t:.0f} tokens/s")

print("6. DualPipeV x EP pp=2 ep=2 (4 ranks on this node's cores): all-to-all time overlapping compute")
for name, label in [("ep", "MoE d128 ffn256 seq64, mb=4"), ("ep_big", "MoE d256 ffn1024 seq128, mb=16")]:
    covered, total = hidden(name, "A2A", r=1)  # one run each
    t, _ = tokens_per_s(name, runs=1)  # one run: four ranks on two cores are slow
    print(f"   {label:32s} {covered / max(total, 1e-9):.3f} of {total / 1e3:.1f} ms of all-to-all overlaps compute; "
          f"{t:.0f} tokens/s")
