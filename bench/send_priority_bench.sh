#!/usr/bin/env bash
# How a point-to-point send is posted and holds its stream (runtime/exec/ops.cpp,
# runtime/comm/mpi_communicator.cpp, runtime/device/stream_threads.cpp), compared in one invocation,
# four ways: 0, started and posted by the thread whose op made it ready (the default: the stream runs
# on, the send tested at idle priority until its peer has read it); 1, blocking, its completion polled
# at normal priority (every <= 20 us while it waits for its peer's receive; PIPER_BLOCKING_SENDS=1,
# the runtime until 2026-12-07); 2, blocking, tested at idle priority (PIPER_BLOCKING_SENDS=1
# PIPER_PROGRESS_SEND_IDLE=1); 3, started as 0 but posted by its own stream's thread once the
# scheduler gives it the core the compute holds (PIPER_INLINE_SENDS=0, the runtime until 2026-12-08).
# Each round runs every pipeline every way one after the other (pp=2 mb=8 on the small GPT of
# speed_setup.sh, scheduled by this machine's profile, taken the default way). Prints per pipeline and
# way: the compute streams' time per step over the simulated (how much the polls slow compute), their
# idle fraction (as speed_bench.sh counts it) against the simulated, and tokens/s, medians over rounds
# with min-max; each send's lag from its producer's end to its start (median and p90 over rounds,
# and how many of them 1 ms or more); and each other way's tokens/s over the default's, the median of
# per-round ratios.
# Usage: bench/send_priority_bench.sh [BUILD_DIR] [ROUNDS]
source "$(dirname "$0")/speed_setup.sh"
common=(--data "$root/data/corpus.txt" --steps 12 --batch-size 16)
mpirun -np 2 "$build/tools/piper-run" "$tmp/m.pt" --profile "$tmp/machine.json" >/dev/null
pipes=("1f1b 1f1b.piper" "zb1p zb1p.piper" "dualpipev dualpipev.piper" "zbv zbv.piper" "interleaved_zb interleaved_zb.piper v=2"
  "dualpipe dualpipe.piper")
for p in "${pipes[@]}"; do
  read -r name file extra <<<"$p"
  "$build/tools/piper-check" "$tmp/m.pt" "$root/strategies/$file" --set pp=2 --set mb=8 ${extra:+--set $extra} \
    --batch-size 16 --machine "$tmp/machine.json" --emit sim-json >"$tmp/$name.sim.json"
done
for r in $(seq 1 "$rounds"); do
  for p in "${pipes[@]}"; do
    read -r name file extra <<<"$p"
    for way in 0 1 2 3; do
      blocking=$([ "$way" = 1 ] || [ "$way" = 2 ] && echo 1 || echo 0)
      idle=$([ "$way" = 2 ] && echo 1 || echo 0)
      inline=$([ "$way" = 3 ] && echo 0 || echo 1)
      PIPER_BLOCKING_SENDS=$blocking PIPER_PROGRESS_SEND_IDLE=$idle PIPER_INLINE_SENDS=$inline \
        mpirun -x PIPER_BLOCKING_SENDS -x PIPER_PROGRESS_SEND_IDLE -x PIPER_INLINE_SENDS \
        -np 2 "$build/tools/piper-run" "$tmp/m.pt" \
        "$root/strategies/$file" --set pp=2 --set mb=8 ${extra:+--set $extra} "${common[@]}" --machine "$tmp/machine.json" \
        --metrics "$tmp/$name.$way.$r.jsonl" --trace "$tmp/$name.$way.$r.trace.json" >/dev/null
    done
  done
done
"${PIPER_PYTHON:-/usr/bin/python3}" - "$tmp" "$rounds" "${pipes[@]%% *}" <<'PY'
import json, statistics, sys
tmp, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
WARMUP = 3
def union(iv):
    total, end = 0.0, float("-inf")
    for a, b in sorted(iv):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
def steps(path):  # per rank: each step's (compute seconds, idle fraction over the step's span)
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e["args"]["step"] > WARMUP]
    out = {}
    for s in sorted({e["args"]["step"] for e in ev}):
        ops = [e for e in ev if e["args"]["step"] == s]
        span = max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)
        for k in sorted({e["pid"] for e in ops}):
            busy = union([(e["ts"], e["ts"] + e["dur"]) for e in ops if e["pid"] == k and e["tid"] == "compute"])
            out.setdefault(k, []).append((busy / 1e6, 1 - busy / span))
    return out
def measured(name, way, r):  # mean over ranks of each rank's median step: compute seconds, idle
    per = steps(f"{tmp}/{name}.{way}.{r}.trace.json").values()
    return (statistics.mean(statistics.median(x[0] for x in v) for v in per),
            statistics.mean(statistics.median(x[1] for x in v) for v in per))
def send_lags(name, way, r):  # ms from each send's producer's end to the send's start, steps after warm-up
    ev = [e for e in json.load(open(f"{tmp}/{name}.{way}.{r}.trace.json"))["traceEvents"]
          if e.get("ph") == "X" and e["args"]["step"] > WARMUP]
    ends = {(e["pid"], e["args"]["step"], e["name"]): e["ts"] + e["dur"] for e in ev if e["tid"] == "compute"}
    out = []
    for e in ev:
        if e["tid"] != "p2p_send":
            continue
        producer = ends.get((e["pid"], e["args"]["step"], e["name"].replace("SEND_", "")))
        if producer is None:  # a split backward's send follows its BI
            producer = ends.get((e["pid"], e["args"]["step"], e["name"].replace("SEND_B", "BI")))
        if producer is not None:
            out.append((e["ts"] - producer) / 1e3)
    return out
def tokens(name, way, r):
    rows = [json.loads(l) for l in open(f"{tmp}/{name}.{way}.{r}.jsonl")]
    return statistics.median([x["tokens_per_s"] for x in rows if "tokens_per_s" in x][WARMUP:])
def show(xs, f):
    return f"{f.format(statistics.median(xs))} ({f.format(min(xs))}-{f.format(max(xs))})"
print(f"sends started and posted inline (0, the default), blocking polled at normal priority (1) or at idle (2), "
      f"started but posted by their stream's thread (3); pp=2 mb=8, "
      f"medians of {rounds} rounds (min-max)")
for name in names:
    sim = json.load(open(f"{tmp}/{name}.sim.json"))["ranks"]
    sim_busy = statistics.mean(x["busy"] for x in sim)
    sim_idle = statistics.mean(x["idle"] / (x["busy"] + x["idle"]) for x in sim)
    for way in (0, 1, 2, 3):
        m = [measured(name, way, r) for r in range(1, rounds + 1)]
        t = [tokens(name, way, r) for r in range(1, rounds + 1)]
        lag = sorted(x for r in range(1, rounds + 1) for x in send_lags(name, way, r))
        lags = (f"send lag median {lag[len(lag) // 2]:.3f} p90 {lag[int(0.9 * len(lag))]:.3f} ms, "
                f"{sum(x >= 1 for x in lag)} of {len(lag)} >= 1 ms") if lag else "no sends matched"
        print(f"  {name:15s} {way}: compute/simulated {show([x[0] / sim_busy for x in m], '{:.3f}')}  idle "
              f"{show([x[1] for x in m], '{:.3f}')} (simulated {sim_idle:.3f})  tokens/s {show(t, '{:.0f}')}  {lags}")
    for way in (1, 2, 3):
        ratio = [tokens(name, way, r) / tokens(name, 0, r) for r in range(1, rounds + 1)]
        print(f"  {name:15s} way {way} / started: {show(ratio, '{:.3f}')}")
PY
