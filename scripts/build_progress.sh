#!/usr/bin/env bash
# Reads ninja's output (NINJA_STATUS="[%f/%t] ") on stdin, keeps all of it in the log file named by
# $1, and prints a line now and then: when the build starts, at every tenth of its steps and when it
# ends. A build with nothing to do prints nothing. Usage: ninja | scripts/build_progress.sh LOG
set -uo pipefail
log=$1
: >"$log"
awk -v logfile="$log" '
  { print > logfile; fflush(logfile) }
  match($0, /^\[[0-9]+\/[0-9]+\] /) {
    split(substr($0, 2, RLENGTH - 3), n, "/")
    done = n[1] + 0; total = n[2] + 0
    if (!started) { printf "setup: building (a first build takes several minutes; log: %s)\n", logfile; started = 1 }
    tenth = int(10 * done / total)
    if (tenth > shown && done < total) { printf "setup: %d%% (%d/%d) %s\n", 10 * tenth, done, total, substr($0, RLENGTH + 1); shown = tenth }
    if (done == total && !finished) { printf "setup: built (%d steps)\n", total; finished = 1 }
    fflush()
  }
'
