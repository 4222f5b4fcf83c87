#!/usr/bin/env bash
# Faults injected under mpirun (PIPER_FAULT=RANK:STEP:TOKEN:fail|stall|drop) end the job with the
# stuck ops named, never a hang: a stalled forward and a dropped send trip the watchdog, whose
# report shows every rank's streams; failing forwards and backwards on either rank (pp=2 mb=4) and a
# failing all-reduce (pp=2 × dp=2) end the job at once. `kill -9`
# of a rank that saves a checkpoint every step ends the job, naming the rank, and leaves a
# checkpoint that resumes. Usage: watchdog_test.sh PIPER_RUN PIPER_MODEL
source "$(dirname "$0")/mpi_test_lib.sh"
common=(--data "$root/data/corpus.txt" --threads 1 --steps 4)
injected() {  # injected FAULT NP STRATEGY args... -> $tmp/out, must fail (not hang) within 60 s
  local fault=$1 np=$2 strategy=$3
  shift 3
  local t0=$SECONDS
  PIPER_FAULT=$fault timeout 60 mpirun -np "$np" --oversubscribe -x PIPER_FAULT "$run" "$tmp/m.pt" \
    "$root/strategies/$strategy" "${common[@]}" "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then fail "$fault: exit $rc (0: unnoticed; 124: hung)"; cat "$tmp/out"; fi
  echo "watchdog_test: $fault ended the job in $((SECONDS - t0)) s (exit $rc)"
}
has() { grep -qF -- "$1" "$tmp/out" || { fail "$2: '$1' not in the output:"; cat "$tmp/out"; }; }

pp2=(--set pp=2 --set mb=4 --batch-size 8 --op-timeout 3)
injected 1:2:1F2:stall 2 1f1b.piper "${pp2[@]}"
has "rank 1, step 2: watchdog: an op ran or waited longer than --op-timeout 3 s" "the stalled rank's report"
has "rank 1 | compute    | running 1F2 for" "the stalled op"
has "rank 0 | p2p_recv   | running 0RECV_B2 (from rank 1) for" "the waiting peer's row"
has "exceeded --op-timeout 3 s" "the job's error"

injected 0:1:0SEND_F1:drop 2 1f1b.piper "${pp2[@]}"
has "rank 1 | p2p_recv   | running 1RECV_F1 (from rank 0) for" "the receive of a dropped send"
has "rank 1 | compute    | 1F1 waits" "what waits on it"

# A failing op ends the job at once, whatever the peers block on: F and B on either rank (pp=2
# mb=4, where the other rank waits in a receive), and a collective under pp=2 × dp=2.
pp2_fail=(--set pp=2 --set mb=4 --batch-size 8)
for fault in 0:1:0F2:fail 1:2:1F1:fail 0:2:0B1:fail 1:1:1B3:fail; do
  injected "$fault" 2 1f1b.piper "${pp2_fail[@]}"
  IFS=: read -r rank step token _ <<<"$fault"
  has "rank $rank, step $step, op $token on stream compute: injected fault (PIPER_FAULT)" "a failing $token"
done
injected 3:1:1ALLREDUCE_G.b0:fail 4 1f1b_dp.piper --set pp=2 --set dp=2 --set mb=2 --batch-size 8
has "rank 3, step 1, op 1ALLREDUCE_G.b0 on stream comm: injected fault (PIPER_FAULT)" "a failing collective"

PIPER_FAULT=x:1:1F0:fail timeout 60 "$run" "$tmp/m.pt" "$root/strategies/single.piper" "${common[@]}" >"$tmp/out" 2>&1 &&
  fail "a malformed PIPER_FAULT is accepted"
has "expected RANK:STEP:TOKEN:fail|stall|drop" "a malformed PIPER_FAULT"

# kill -9 of one rank while it checkpoints every step.
t0=$SECONDS
timeout 60 mpirun -np 2 "$run" "$tmp/m.pt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=4 --batch-size 8 \
  --data "$root/data/corpus.txt" --threads 1 --steps 100000 --checkpoint "$tmp/ck" --save-every 1 >"$tmp/out" 2>&1 &
job=$!
for _ in $(seq 1 100); do [ -d "$tmp/ck" ] && break; sleep 0.1; done
sleep 1
victim=$(pgrep -f "^$run $tmp/m.pt" | tail -1)  # a rank, not mpirun
kill -9 "$victim"
wait "$job"
rc=$?
echo "watchdog_test: kill -9 of a rank ended the job in $((SECONDS - t0)) s (exit $rc)"
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "kill -9: exit $rc"
grep -Eq "process rank [01] .* exited on signal 9" "$tmp/out" || { fail "kill -9: the dead rank is not named"; cat "$tmp/out"; }
timeout 60 "$run" "$tmp/m.pt" "$root/strategies/single.piper" --batch-size 8 --data "$root/data/corpus.txt" --threads 1 \
  --resume "$tmp/ck" --steps 1 >"$tmp/out" 2>&1
grep -q "resumed from" "$tmp/out" || { fail "the checkpoint left by kill -9 does not resume"; cat "$tmp/out"; }

finish watchdog_test
