#!/usr/bin/env bash
# Many hosts on one machine (scripts/multihost_lib.sh: network namespaces with their own hostnames,
# TCP between them, shared memory inside each): 1F1B × DP over 2 hosts × 2 ranks trains to the single
# device's losses within 1e-5 with dp inside the hosts and pp across, and with the opposite placement;
# piper-run prints which axes cross (learned from MPI, not typed); the trace keeps one time axis
# across hosts (each receive ends after its send began, clock offsets measured within 100 µs of the
# true 0); a checkpoint saved on 2 hosts resumes on 1 with another strategy; a slowed host is named
# as a straggler (and is not stuck); a host's link taken down is named by the watchdog and the job
# ends, nothing left, the last checkpoint intact; a malformed hostfile, or one naming a host that is
# not there, ends with a clear error, not a hang; all ranks of one host killed mid-step end the job
# within 30 s, the host named, with nothing left running.
# Usage: multihost_test.sh PIPER_RUN PIPER_MODEL PIPER_TRAIN_REF
source "$(dirname "$0")/mpi_test_lib.sh"
ref_bin=$3
source "$root/scripts/multihost_lib.sh"
bed_up 2 || { echo "multihost_test: cannot make the test bed"; exit 1; }
bed_timeout=120
common=(--data "$root/data/corpus.txt" --batch-size 8 --lr 1e-3 --seed 0 --threads 1)
"$ref_bin" "$tmp/m.pt" "${common[@]}" --steps 12 --metrics "$tmp/ref.jsonl" >/dev/null

# The losses (steps FIRST..12, by step) of a run against the reference's; its final parameters too
# when it ran all 12.
same_losses() {  # same_losses METRICS WHAT [FIRST]
  ${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/ref.jsonl" "$1" "$2" "${3:-1}" <<'PY'
import json, sys
rows = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
first = int(sys.argv[4])
ref, run = ({r["step"]: r["loss"] for r in rs if "loss" in r} for rs in rows)
steps = range(first, 13)
assert sorted(run) == list(steps), (sorted(ref), sorted(run))
worst = max(abs(ref[s] - run[s]) / abs(ref[s]) for s in steps)
assert worst < 1e-5, f"losses differ by up to {worst:.2e}: {ref} vs {run}"
if first == 1:
    p = [[r for r in rs if "final_param_sum" in r][0] for rs in rows]
    for k in ("final_param_sum", "final_param_sumsq"):
        assert abs(p[0][k] - p[1][k]) / abs(p[0][k]) < 1e-5, (k, p[0][k], p[1][k])
print(f"multihost_test: {sys.argv[3]}: losses of steps {first}-12 equal to one device's within {worst:.1e}")
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
  # The groups each axis's collectives run over, with their hosts: the crossing axis's span both.
  inside=dp; [ "$across" = dp ] && inside=pp
  grep -qF "groups: $across 0,2 (h0, h1) 1,3 (h0, h1); $inside 0-1 (h0) 2-3 (h1)" "$tmp/$strategy.log" ||
    fail "$strategy: the groups on hosts: $(head -6 "$tmp/$strategy.log")"
  same_losses "$tmp/$strategy.jsonl" "$strategy (across hosts: $across)" || fail "$strategy: losses"
  # 20 µs: the clocks are one machine's, so only the measured offsets' error is allowed beyond rounding.
  ${PIPER_PYTHON:-/usr/bin/python3} "$root/tests/trace_check.py" "$tmp/$strategy.trace.json" 4 20 100 || fail "$strategy: the trace across hosts"
done

# The users' front end makes a bed of its own beside this one: each rank on its own host. (Only
# the command's lines are compared: Open MPI's rsh launcher may warn on the same stream, as in
# "plm:rsh: Warning: setpgid(...) failed", which once failed this test.)
"$root/scripts/multihost.sh" --hosts 2 --slots 1 -- hostname >"$tmp/front.log" 2>&1 </dev/null &&
  [ "$(grep -E '^h[0-9]+$' "$tmp/front.log" | sort | tr '\n' ' ')" = "h0 h1 " ] || fail "scripts/multihost.sh: $(cat "$tmp/front.log")"

# A checkpoint saved on 2 hosts (each rank writes its own shard: one file system here, a shared one
# on a cluster) resumes on 1 host with another strategy: ZeRO-1 over 2 ranks, losses within 1e-5.
bed_mpirun "$run" "$tmp/m.pt" "$root/strategies/1f1b_dp.piper" --set pp=2 --set dp=2 --set mb=4 "${common[@]}" \
  --steps 6 --checkpoint "$tmp/ck2" >"$tmp/save.log" 2>&1 </dev/null || fail "a checkpoint on 2 hosts: $(tail -5 "$tmp/save.log")"
timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/m.pt" "$root/strategies/zero1.piper" --set dp=2 \
  "${common[@]}" --steps 12 --resume "$tmp/ck2" --metrics "$tmp/resumed.jsonl" >"$tmp/resume.log" 2>&1 ||
  fail "resumed on 1 host: $(tail -5 "$tmp/resume.log")"
same_losses "$tmp/resumed.jsonl" "saved on 2 hosts by 1F1B x DP, resumed on 1 host by ZeRO-1" 7 || fail "resumed losses"

# Host h1 slowed mid-run to a fifth of its core (a CPU quota): the straggler line names it and its
# ranks, and, once the quota is lifted, says it keeps pace again. Slow is not stuck: its ops finish,
# so the watchdog (5 s) stays quiet and the run completes.
bed_mpirun "$run" "$tmp/m.pt" "$root/strategies/1f1b_dp.piper" --set pp=2 --set dp=2 --set mb=4 "${common[@]}" \
  --steps 150 --op-timeout 5 --metrics "$tmp/slow.jsonl" >"$tmp/slow.log" 2>&1 </dev/null &
job=$!
wait_for() {  # wait_for PATTERN FILE: up to 30 s
  for _ in $(seq 1 300); do grep -q "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
wait_for "^step   10/" "$tmp/slow.log" && bed_slow h1 20
wait_for "straggler: host h1 (ranks 2-3) computes" "$tmp/slow.log" || fail "no straggler line for the slowed host h1"
bed_slow h1 100
wait "$job" || fail "the slowed run did not complete: $(grep -v '^step' "$tmp/slow.log" | tail -20)"
grep -q "straggler: host h1 keeps pace again" "$tmp/slow.log" || fail "h1 never kept pace again: $(grep -v '^step' "$tmp/slow.log" | tail)"
! grep -q "watchdog" "$tmp/slow.log" || fail "the watchdog took a slow host for a stuck one: $(grep -A5 watchdog "$tmp/slow.log")"
grep -q '"step_s_by_rank":\[[0-9.]*,[0-9.]*,[0-9.]*,[0-9.]*\],"compute_s_by_rank":\[' "$tmp/slow.jsonl" || fail "per-rank times not in the metrics"
echo "multihost_test: $(grep -m1 'straggler: host h1 (' "$tmp/slow.log" | sed 's/^piper-run: //')"

# Host h1's link taken down mid-run: TCP says nothing, so the watchdog (2 s) names the stuck receive
# or collective and its peer host; mpirun loses h1's daemon (keepalives, ~8 s: multihost_lib.sh), or
# TCP gives up on its abort (~13 s), and ends the job; h1's daemon, cut off, ends its ranks itself. The
# last complete checkpoint loads.
bed_mpirun "$run" "$tmp/m.pt" "$root/strategies/1f1b_dp.piper" --set pp=2 --set dp=2 --set mb=4 "${common[@]}" \
  --steps 100000 --op-timeout 2 --checkpoint "$tmp/ck3" --save-every 5 >"$tmp/down.log" 2>&1 </dev/null &
job=$!
wait_for "^step   12/" "$tmp/down.log"
t0=$SECONDS
ip -n "$(bed_ns 1)" link set eth0 down
wait "$job"
rc=$?
echo "multihost_test: h1's link down ended the job in $((SECONDS - t0)) s (exit $rc)"
{ [ "$rc" != 0 ] && [ "$rc" != 124 ] && ((SECONDS - t0 <= 30)); } || fail "h1's link down: exit $rc after $((SECONDS - t0)) s"
# The streams' watchdog names the op and its peer's host; between steps, the call watch names the
# all-reduce of the step's metrics and the hosts it spans.
grep -qE "running 0[A-Z_]+[^ ]* \((from|to) rank [23] on host h1\)|running .* \(with ranks .* on hosts? [h0, ]*h1\)|watchdog: .* on hosts h0, h1\)" \
  "$tmp/down.log" || fail "the watchdog does not name the op waiting on h1: $(grep -v '^step' "$tmp/down.log" | grep -v '^\[h0')"
for _ in $(seq 1 300); do [ -z "$(ip netns pids "$(bed_ns 1)")" ] && break; sleep 0.1; done
echo "multihost_test: host h1, cut off, was empty $((SECONDS - t0)) s after its link went down"
for i in 0 1; do
  left=$(ip netns pids "$(bed_ns $i)" | wc -l)
  [ "$left" = 0 ] || fail "host h$i still runs $left processes 30 s after its link went down: $(ip netns pids "$(bed_ns $i)" | xargs -r ps -o pid=,stat=,etime=,args= -p)"
done
ip -n "$(bed_ns 1)" link set eth0 up
last=$(ls -d "$tmp/ck3"/step-* | tail -1)
timeout 60 "$run" "$tmp/m.pt" "$root/strategies/single.piper" "${common[@]}" --steps 13 --resume "$tmp/ck3" >"$tmp/after.log" 2>&1 ||
  fail "the last checkpoint before the link went down does not load: $(tail -5 "$tmp/after.log")"
grep -q "resumed from .*$(basename "$last")" "$tmp/after.log" || fail "not resumed from $last: $(head -5 "$tmp/after.log")"

# A hostfile naming a host the bed does not have: mpirun's agent cannot reach it; a clear error in seconds.
echo "h9 slots=2" >>"$bed_dir/hostfile"
t0=$SECONDS
bed_mpirun "$run" "$tmp/m.pt" "$root/strategies/1f1b_dp.piper" "${common[@]}" --steps 2 >"$tmp/out" 2>&1 </dev/null
rc=$?
{ [ "$rc" != 0 ] && [ "$rc" != 124 ]; } || fail "an unreachable host: exit $rc (0: unnoticed; 124: hung)"
grep -qF "no host 'h9' in the bed" "$tmp/out" || { fail "an unreachable host is not named:"; cat "$tmp/out"; }
echo "multihost_test: an unreachable host ended the launch in $((SECONDS - t0)) s (exit $rc)"
sed -i '/^h9 /d' "$bed_dir/hostfile"

# A malformed hostfile: mpirun says what and where before any rank starts.
cp "$bed_dir/hostfile" "$tmp/hostfile.good"
sed -i 's/^h1 slots=.*/h1 slots=two/' "$bed_dir/hostfile"
t0=$SECONDS
bed_mpirun "$run" "$tmp/m.pt" "$root/strategies/1f1b_dp.piper" "${common[@]}" --steps 2 >"$tmp/out" 2>&1 </dev/null
rc=$?
{ [ "$rc" != 0 ] && [ "$rc" != 124 ]; } || fail "a malformed hostfile: exit $rc"
grep -q "bad parameter in the hostfile" "$tmp/out" && ! grep -q "^step" "$tmp/out" || { fail "a malformed hostfile:"; cat "$tmp/out"; }
echo "multihost_test: a malformed hostfile ended the launch in $((SECONDS - t0)) s (exit $rc)"
cp "$tmp/hostfile.good" "$bed_dir/hostfile"

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
# mpirun stops h0's ranks (SIGTERM): each says where it was, naming the host it waited on (a receive
# from rank 2 on host h1; between steps, the all-reduce over hosts h0, h1; at a step's end, the
# loss's all-reduce over them); its ranks are in the host map piper-run printed at the start. (Open
# MPI's own message blames daemons that failed to start.)
for r in 0 1; do
  grep -qE "rank $r on host h0: stopped by the launcher \(SIGTERM\) (during step|after step|in step [0-9]+, the loss's all-reduce)" "$tmp/out" ||
    fail "rank $r does not say where it was stopped: $(grep -v '^step' "$tmp/out" | grep -v '^\[h0')"
done
grep -qE "on host h1\)|on hosts h0, h1\)" "$tmp/out" && grep -qF "h1: ranks 2-3" "$tmp/out" ||
  fail "the killed host is not named: $(grep -v '^step' "$tmp/out" | grep -v '^\[h0')"
for i in 0 1; do
  left=$(ip netns pids "$(bed_ns $i)" | wc -l)
  [ "$left" = 0 ] || fail "host h$i still runs $left processes after the job ended"
done
finish multihost_test
