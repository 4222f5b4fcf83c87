#!/usr/bin/env bash
# `order from "schedule.csv"`: torch.distributed.pipelining's schedule files read as they are.
# 1. Round trip: the four files torch 2.11 wrote (tests/torch_csv/gen_torch_csv.py: interleaved 1F1B,
#    interleaved zero bubble, ZBV, DualPipeV with OVERLAP_F_B, pp=2, 4 microbatches; csv.writer's
#    \r\n and empty idle cells) check, and --emit torch-csv gives their actions back, rank by rank.
# 2. Malformed files: located errors at the CSV's line and column, every one in one run.
#   torch_csv_test.sh PIPER_CHECK
set -uo pipefail
check=$1
root=$(cd "$(dirname "$0")/.." && pwd)
gpt=$root/tests/manifests/gpt8.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

for name in interleaved_1f1b interleaved_zb zbv dualpipev; do
  csv=$root/tests/torch_csv/${name}_pp2_mb4.csv
  [ -f "$csv" ] || csv=$root/tests/torch_csv/${name}_pp2_v2_mb4.csv  # interleaved_zb's names its v
  grep -q $'\r$' "$csv" || fail "$name: not as torch's csv.writer writes (\\r\\n)"
  if ! "$check" "$gpt" "$root/tests/torch_csv/$name.piper" --emit torch-csv -o "$tmp/$name.out" 2>"$tmp/err"; then
    fail "$name: does not check"; cat "$tmp/err"; continue
  fi
  # torch's idle steps are empty cells; Piper writes the actions alone.
  tr -d '\r' <"$csv" | sed 's/,,*/,/g; s/^,//; s/,$//' >"$tmp/$name.want"
  diff "$tmp/$name.want" "$tmp/$name.out" >"$tmp/diff" || { fail "$name: --emit torch-csv differs"; cat "$tmp/diff"; }
done
grep -q 'OVERLAP_F_B' "$tmp/dualpipev.out" || fail "dualpipev: no overlapped pair written back"
grep -q ',,' "$root/tests/torch_csv/interleaved_1f1b_pp2_mb4.csv" || fail "interleaved_1f1b: torch's idle cells are gone"

# A mirrored pipeline (full DualPipe): a rank's line holds its copies' tasks too; what dualpipe.piper
# emits, read back by `order from` under the same placement, emits the same file.
"$check" "$gpt" "$root/strategies/dualpipe.piper" --set pp=4 --set mb=8 --emit torch-csv -o "$tmp/dualpipe.csv" 2>"$tmp/err" ||
  { fail "dualpipe: does not check"; cat "$tmp/err"; }
printf 'mesh pp = 4;\nsplit batch into 8;\nplace embed on pp = 0;\nplace layers[*] over pp;\nplace head on pp = 3;\nmirror over pp;\norder from "dualpipe.csv";\n' \
  >"$tmp/dualpipe_from.piper"
"$check" "$gpt" "$tmp/dualpipe_from.piper" --emit torch-csv -o "$tmp/dualpipe.back" 2>"$tmp/err" ||
  { fail "dualpipe's CSV read back: does not check"; cat "$tmp/err"; }
diff -q "$tmp/dualpipe.csv" "$tmp/dualpipe.back" >/dev/null || fail "dualpipe's CSV read back emits another schedule"
grep -q '^0F0,0F1,0F2,3F4,' "$tmp/dualpipe.csv" || fail "dualpipe: rank 0 does not run its copy of stage 3: $(head -1 "$tmp/dualpipe.csv")"

# The library's interleaved_zb.piper is torch's ScheduleInterleavedZeroBubble, action for action, over
# pp, v and mb (gpt1b's 24 layers cut into pp × v stages).
for csv in "$root"/tests/torch_csv/interleaved_zb_pp*_v*_mb*.csv; do
  read -r pp v mb < <(basename "$csv" .csv | sed 's/interleaved_zb_pp\([0-9]*\)_v\([0-9]*\)_mb\([0-9]*\)/\1 \2 \3/')
  "$check" "$root/tests/manifests/gpt1b.json" "$root/strategies/interleaved_zb.piper" --set pp="$pp" --set v="$v" \
    --set mb="$mb" --emit torch-csv -o "$tmp/izb.out" 2>"$tmp/err" || { fail "interleaved_zb pp=$pp v=$v mb=$mb"; cat "$tmp/err"; }
  tr -d '\r' <"$csv" | sed 's/,,*/,/g; s/^,//; s/,$//' >"$tmp/izb.want"
  diff -q "$tmp/izb.want" "$tmp/izb.out" >/dev/null || fail "interleaved_zb.piper pp=$pp v=$v mb=$mb is not torch's order"
done

# A 1F1B over pp=2 (stages 0 and 1), 4 microbatches, whose schedule is FILE.
strategy() {
  printf 'mesh pp = 2;\nsplit batch into 4;\nplace embed on pp = 0;\nplace layers[*] over pp;\nplace head on pp = 1;\norder from "%s";\n' "$1" >"$tmp/s.piper"
}
good0=0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3
good1=1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3
expect_error() {  # DESCRIPTION CSV_TEXT MESSAGE...
  local what=$1 text=$2; shift 2
  printf '%b' "$text" >"$tmp/bad.csv"
  strategy bad.csv
  "$check" "$gpt" "$tmp/s.piper" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ "$rc" = 1 ] || { fail "$what: exit $rc, want 1"; cat "$tmp/err"; }
  for m in "$@"; do grep -qF -- "$m" "$tmp/err" || { fail "$what: '$m' not in:"; cat "$tmp/err"; }; done
}
printf '%s\n%s\n' "$good0" "$good1" >"$tmp/ok.csv"
strategy ok.csv
"$check" "$gpt" "$tmp/s.piper" >/dev/null 2>"$tmp/err" || { fail "a valid hand-written 1F1B file"; cat "$tmp/err"; }

expect_error "unknown action" "0F0,0X1,0B0\n$good1\n" "bad.csv:1:5: error: unknown action type 'X' in '0X1'" "note: action types are F"
expect_error "two errors in one run" "0F0,0Q1,0B0\n1F0,1B0,nonsense\n" "bad.csv:1:5: error: unknown action type 'Q'" \
  "bad.csv:2:9: error: 'nonsense' is not a schedule action"
expect_error "communication action" "0F0,0SEND_F0,0B0\n$good1\n" "bad.csv:1:5: error: '0SEND_F0' is a communication action"
expect_error "no microbatch" "0F0,0F\n$good1\n" "bad.csv:1:5: error: '0F' names no microbatch"
expect_error "overlapped pair of two forwards" "(0F0;0F1)OVERLAP_F_B\n$good1\n" "OVERLAP_F_B pairs a forward with a backward"
expect_error "a microbatch missing" "0F0,0F1,0B0,0F2,0B1,0B2\n$good1\n" \
  "bad.csv:1:1: error: line 1 (pipeline rank 0) has no forward of stage 0 for microbatch 3"
expect_error "a weight gradient missing" "0F0,0F1,0I0,0W0,0F2,0B1,0F3,0B2,0I3\n$good1\n" \
  "has no weight gradient (W) of stage 0 for microbatch 3"
expect_error "another rank's stage" "$good0,1F0\n$good1\n" "bad.csv:1:33: error: stage 1 runs on pipeline rank 1, but this is line 1, rank 0's"
expect_error "an action twice" "$good0,0F2\n$good1\n" "bad.csv:1:33: error: 0F2 appears twice" "bad.csv:1:13: note: first here"
expect_error "a line per rank" "$good0\n$good1\n$good1\n" "the schedule has 3 lines, one per pipeline rank, but the plan has 2"
expect_error "a stage that does not exist" "0F0,5F0\n$good1\n" "bad.csv:1:5: error: fwd(5, 0): stage 5 does not exist"
# Rank 1 runs microbatch 1 before 0, whose backward rank 0 waits for before sending 1: a hang.
expect_error "a deadlock" "0F0,0B0,0F1,0B1,0F2,0B2,0F3,0B3\n1F1,1B1,1F0,1B0,1F2,1B2,1F3,1B3\n" \
  "bad.csv:2:9: error: this order creates a cycle: 0B0 -> 0F1" "bad.csv:1:9: note: the cycle also uses this order"
strategy missing.csv
"$check" "$gpt" "$tmp/s.piper" >/dev/null 2>"$tmp/err"
grep -qF 'error: cannot find schedule "missing.csv"' "$tmp/err" || { fail "a missing file"; cat "$tmp/err"; }

if ((fails)); then echo "torch_csv_test: $fails failed"; exit 1; fi
echo "torch_csv_test: 4 torch files round-trip; interleaved_zb.piper is torch's order in 7 configurations; every malformed file refused where it is wrong"
