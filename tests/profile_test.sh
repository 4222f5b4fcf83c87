#!/usr/bin/env bash
# piper-run --profile on two ranks: regions, links and collectives measured, the calibration
# completed (compute factors from a data-parallel step, the seconds a collective takes beyond the
# link's formula from a ZeRO-3 step, a handoff's from a 1F1B step), no temporary files left;
# piper-check prices a plan with it.
# Usage: profile_test.sh PIPER_RUN PIPER_MODEL PIPER_CHECK
source "$(dirname "$0")/mpi_test_lib.sh"
check=$3
mpirun -np 2 --oversubscribe --bind-to none "$run" "$tmp/m.pt" --profile "$tmp/machine.json" </dev/null >"$tmp/out" 2>&1 ||
  fail "--profile on two ranks: $(tail -3 "$tmp/out")"
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/machine.json" <<'PY' || fail "the two-rank machine file"
import json, sys
m = json.load(open(sys.argv[1]))
c = m["calibration"]
assert all(c[k] > 0 for k in "FBU"), c
assert c["collective"] >= 0 and "ZeRO-3 over 2 ranks" in c["collective_measured_on"], c
# The handoffs a 1F1B pipeline over both ranks waited for: at least the fill's (the last stage's
# first forward) and the drain's (the first stage's last backward) in each of the 3 timed steps.
assert c["p2p"] >= 0 and c["p2p_measured_on"].startswith("1F1B over 2 ranks"), c
assert int(c["p2p_measured_on"].split(": ")[1].split()[0]) >= 3 * 2, c
assert m["profile"]["ranks"] == 2 and m["collectives"]["bandwidth"] > 0 and m["link"]["bandwidth"] > 0, m
PY
ls "$tmp" | grep -q tmp && fail "--profile left temporary files: $(ls "$tmp")"
"$check" "$tmp/m.pt" "$root/strategies/zero3.piper" --set dp=2 --batch-size 8 --machine "$tmp/machine.json" --simulate \
  >"$tmp/sim" 2>&1 || fail "piper-check with the profiled machine: $(tail -3 "$tmp/sim")"
grep -q "step time" "$tmp/sim" || fail "no simulated step time: $(cat "$tmp/sim")"
finish profile_test
