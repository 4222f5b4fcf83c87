#!/usr/bin/env bash
# Placement across hosts, measured and simulated: on the test bed (scripts/multihost_lib.sh, 2 hosts
# × 2 ranks, a core per host) with each host's link shaped to 1 Gbit/s (tc tbf; this kernel has no
# netem for a delay), 1F1B × DP pp=2 × dp=2 mb=4 on the speed benches' model (gpt 8L d128, batch 16)
# with dp inside the hosts and pp across (strategies/1f1b_dp.piper) against the opposite
# (tests/strategies/1f1b_dp_outer.piper: dp across). `piper-run --profile` across the bed measures
# both tiers (the link inside a host and the network between, every pair at once); piper-check with
# that file and its ranks_per_host simulates each step; piper-tune ranks the two.
# Prints every round, then the median over rounds with the spread, simulated/measured per placement,
# the ratio of the two measured and simulated, and piper-tune's order. Needs root.
# Usage: bench/multihost_bench.sh [BUILD_DIR] [ROUNDS] [RATE]
source "$(dirname "$0")/speed_setup.sh"
rate=${3:-1gbit}
source "$root/scripts/multihost_lib.sh"
bed_up 2 "$rate" || exit 1
bed_timeout=600
common=(--data "$root/data/corpus.txt" --batch-size 16 --threads 1)
plan=(--set pp=2 --set dp=2 --set mb=4)
placements=("$root/strategies/1f1b_dp.piper" "$root/tests/strategies/1f1b_dp_outer.piper")

bed_mpirun "$build/tools/piper-run" "$tmp/m.pt" "${common[@]}" --profile "$tmp/machine.json" >"$tmp/profile.log" 2>&1 </dev/null ||
  { echo "multihost_bench: the profile failed:"; tail -20 "$tmp/profile.log"; exit 1; }
for s in "${placements[@]}"; do
  "$build/tools/piper-check" "$tmp/m.pt" "$s" "${plan[@]}" --np 4 --batch-size 16 --machine "$tmp/machine.json" \
    --emit sim-json -o "$tmp/$(basename "$s" .piper).sim.json" >/dev/null
done
"$build/tools/piper-tune" "$tmp/m.pt" --np 4 --batch-size 16 --machine "$tmp/machine.json" --no-recompute --top 100 \
  -I "$root/tests/strategies" --strategy 1f1b_dp.piper --strategy 1f1b_dp_outer.piper >"$tmp/tune.txt"
for r in $(seq 1 "$rounds"); do
  for s in "${placements[@]}"; do
    n=$(basename "$s" .piper)
    bed_mpirun "$build/tools/piper-run" "$tmp/m.pt" "$s" "${plan[@]}" "${common[@]}" --steps 12 \
      --metrics "$tmp/$n.$r.jsonl" >"$tmp/$n.log" 2>&1 </dev/null || { echo "multihost_bench: $n failed:"; tail -20 "$tmp/$n.log"; exit 1; }
  done
done
/usr/bin/python3 - "$tmp" "$rounds" "$rate" <<'PY'
import json, re, statistics, sys
tmp, rounds, rate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
m = json.load(open(f"{tmp}/machine.json"))
print(f"profiled across the bed: inside a host {m['link']['bandwidth']/1e6:.0f} MB/s {m['link']['latency']*1e6:.0f} us "
      f"(collectives {m['collectives']['bandwidth']/1e6:.0f} MB/s); between hosts {m['network']['bandwidth']/1e6:.0f} MB/s "
      f"per rank {m['network']['latency']*1e6:.0f} us; {m['ranks_per_host']} ranks a host")
names = {"1f1b_dp": "dp inside, pp across", "1f1b_dp_outer": "pp inside, dp across"}
step = {n: [] for n in names}
for r in range(1, rounds + 1):
    for n in names:
        rows = [json.loads(l) for l in open(f"{tmp}/{n}.{r}.jsonl") if '"loss"' in l][2:]
        step[n].append(statistics.median(x["step_s"] for x in rows))
    print(f"round {r}: step " + ", ".join(f"{names[n]} {v[-1]*1e3:.1f} ms" for n, v in step.items()))
print(f"1F1B x DP pp=2 dp=2 mb=4, batch 16, 2 hosts x 2 ranks, links {rate}; {rounds} rounds of 12 steps (median of steps 3-12):")
sim = {n: json.load(open(f"{tmp}/{n}.sim.json"))["step_time"] for n in names}
for n, label in names.items():
    v = step[n]
    med = statistics.median(v)
    print(f"  {label:<21} measured {med*1e3:7.1f} ms (spread {min(v)*1e3:.1f}-{max(v)*1e3:.1f}), simulated {sim[n]*1e3:7.1f} ms"
          f"   simulated/measured {sim[n]/med:.2f}")
a, b = (statistics.median(step[n]) for n in names)
print(f"  dp across / dp inside: measured {b/a:.2f}, simulated {sim['1f1b_dp_outer']/sim['1f1b_dp']:.2f}")
order = [l.split()[1] for l in open(f"{tmp}/tune.txt") if re.search(r"\spp=2 mb=4 dp=2|\sdp=2 pp=2 mb=4", l)]
print(f"  piper-tune ranks (pp=2 dp=2 mb=4): {' before '.join(order)}")
PY
