#!/usr/bin/env bash
# Many hosts on one machine (scripts/multihost_lib.sh: network namespaces with their own hostnames,
# TCP between them, shared memory inside each): 1F1B × DP over 2 hosts × 2 ranks trains to the single
# device's losses within 1e-5 with dp inside the hosts and pp across, and with the opposite placement;
# piper-run prints which axes cross (learned from MPI, not typed); the trace keeps one time axis
# across hosts (each receive ends after its send began, clock offsets measured within 100 µs of the
# true 0); a hostfile naming a host that is not there ends with a clear error, not a hang; all ranks
# of one host killed mid-step end the job within 30 s with nothing left running.
# Usage: multihost_test.sh PIPER_RUN PIPER_MODEL PIPER_TRAIN_REF
source "$(dirname "$0")/mpi_test_lib.sh"
ref_bin=$3
source "$root/scripts/multihost_lib.sh"
bed_up 2 || { echo "multihost_test: cannot make the test bed"; exit 1; }
bed_timeout=120
common=(--data "$root/data/corpus.txt" --batch-size 8 --lr 1e-3 --seed 0 --threads 1)
"$ref_bin" "$tmp/m.pt" "${common[@]}" --steps 12 --metrics "$tmp/ref.jsonl" >/dev/null

# The losses and final parameters of a run against the reference's.
same_losses() {
  /usr/bin/python3 - "$tmp/ref.jsonl" "$1" "$2" <<'PY'
import json, sys
rows = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
ref, run = ([r["loss"] for r in rs if "loss" in r] for rs in rows)
assert len(ref) == len(run) == 12, (len(ref), len(run))
worst = max(abs(a - b) / abs(a) for a, b in zip(ref, run))
assert worst < 1e-5, f"losses differ by up to {worst:.2e}: {ref} vs {run}"
p = [[r for r in rs if "final_param_sum" in r][0] for rs in rows]
for k in ("final_param_sum", "final_param_sumsq"):
    assert abs(p[0][k] - p[1][k]) / abs(p[0][k]) < 1e-5, (k, p[0][k], p[1][k])
print(f"multihost_test: {sys.argv[3]}: 12 losses equal to one device's within {worst:.1e}")
PY
}

for placement in 1f1b_dp:pp 1f1b_dp_outer:dp; do
  strategy=${placement%%:*} across=${placement##*:}
  file="$root/strategies/$strategy.piper"
  [ -f "$file" ] || file="$root/tests/strategies/$strategy.piper"
  bed_mpirun "$run" "$tmp/m.pt" "$file" --set pp=2 --set dp=2 --set mb=4 "${common[@]}" --steps 12 \
    --metrics "$tmp/$strategy.jsonl" --trace "$tmp/$strategy.trace.json" >"$tmp/$strategy.log" 2>&1 </dev/null ||
    { fail "$strategy over 2 hosts: $(tail -20 "$tmp/$strategy.log")"; continue; }
  grep -qF "hosts      2 (h0: ranks 0-1; h1: ranks 2-3)" "$tmp/$strategy.log" || fail "$strategy: hosts not reported: $(head -5 "$tmp/$strategy.log")"
  grep -qF "across hosts: $across" "$tmp/$strategy.log" || fail "$strategy: '$across' should cross hosts: $(head -5 "$tmp/$strategy.log")"
  same_losses "$tmp/$strategy.jsonl" "$strategy (across hosts: $across)" || fail "$strategy: losses"
  # 20 µs: the clocks are one machine's, so only the measured offsets' error is allowed beyond rounding.
  /usr/bin/python3 "$root/tests/trace_check.py" "$tmp/$strategy.trace.json" 4 20 100 || fail "$strategy: the trace across hosts"
done

# A hostfile naming a host the bed does not have: mpirun's agent cannot reach it; a clear error in seconds.
echo "h9 slots=2" >>"$bed_dir/hostfile"
t0=$SECONDS
bed_mpirun "$run" "$tmp/m.pt" "$root/strategies/1f1b_dp.piper" "${common[@]}" --steps 2 >"$tmp/out" 2>&1 </dev/null
rc=$?
{ [ "$rc" != 0 ] && [ "$rc" != 124 ]; } || fail "an unreachable host: exit $rc (0: unnoticed; 124: hung)"
grep -qF "no host 'h9' in the bed" "$tmp/out" || { fail "an unreachable host is not named:"; cat "$tmp/out"; }
echo "multihost_test: an unreachable host ended the launch in $((SECONDS - t0)) s (exit $rc)"
sed -i '/^h9 /d' "$bed_dir/hostfile"

# Every process of host h1 killed mid-run: the job ends within 30 s and nothing of it is left.
bed_mpirun "$run" "$tmp/m.pt" "$root/strategies/1f1b_dp.piper" --set pp=2 --set dp=2 --set mb=4 \
  "${common[@]}" --steps 100000 >"$tmp/out" 2>&1 </dev/null &
job=$!
for _ in $(seq 1 200); do grep -q "^step" "$tmp/out" 2>/dev/null && break; sleep 0.1; done
t0=$SECONDS
ip netns pids "$(bed_ns 1)" | xargs -r kill -9
wait "$job"
rc=$?
echo "multihost_test: killing host h1 ended the job in $((SECONDS - t0)) s (exit $rc)"
{ [ "$rc" != 0 ] && [ "$rc" != 124 ] && ((SECONDS - t0 <= 30)); } || fail "host h1 killed: exit $rc after $((SECONDS - t0)) s"
for i in 0 1; do
  left=$(ip netns pids "$(bed_ns $i)" | wc -l)
  [ "$left" = 0 ] || fail "host h$i still runs $left processes after the job ended"
done
finish multihost_test
