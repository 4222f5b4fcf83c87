#!/usr/bin/env bash
# piper-check as a user meets it: exit statuses, model.pt input, -o, --emit, usage errors.
set -uo pipefail
check=$1
root=$(cd "$(dirname "$0")/.." && pwd)
gpt=$root/tests/manifests/gpt8.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect() {  # expect STATUS DESCRIPTION -- command...
  local want=$1 what=$2; shift 3
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [ "$got" != "$want" ]; then
    echo "FAIL: $what: exit $got, want $want"; cat "$tmp/out" "$tmp/err"; fails=$((fails + 1))
  fi
}
contains() {  # contains FILE TEXT DESCRIPTION
  grep -qF -- "$2" "$tmp/$1" || { echo "FAIL: $3: '$2' not in $1:"; cat "$tmp/$1"; fails=$((fails + 1)); }
}

expect 0 "valid strategy" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=4
contains out "1f1b.piper: ok" "report header"
contains out "stages     2 over pp" "report stages"

printf 'mesh pp = 3;\nplace layrs[*] over pp;\n' >"$tmp/bad.piper"
expect 1 "invalid strategy" -- "$check" "$gpt" "$tmp/bad.piper"
contains err "bad.piper:2:7: error: unknown region 'layrs'; did you mean 'layers'?" "located error"
contains err "      ^~~~~" "caret"

expect 2 "missing strategy file" -- "$check" "$gpt" "$tmp/none.piper"
contains err "cannot open" "I/O message"
expect 2 "missing model file" -- "$check" "$tmp/none.pt" "$root/strategies/dp.piper"
expect 2 "no arguments" -- "$check"
expect 2 "unknown emit mode" -- "$check" "$gpt" "$root/strategies/dp.piper" --emit nonsense
# --op-times: a run's trace prices the chunks it names; a file that is not one is a usage error.
printf '{"traceEvents": [{"ph": "X", "pid": 0, "tid": "compute", "name": "1F0", "ts": 0, "dur": 900000, "args": {"step": 4}}]}' \
  >"$tmp/run.trace.json"
expect 0 "--op-times" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=4 --op-times "$tmp/run.trace.json" \
  --emit sim-json
contains out '"step_time": 14.9' "a measured chunk sets its cost (1F1B pp=2 mb=4: 15 units; 1F0, on the critical path, 0.9 for 1)"
echo '{"traceEvents": [' >"$tmp/broken.json"
expect 2 "--op-times on a broken trace" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --op-times "$tmp/broken.json"
contains err "--op-times $tmp/broken.json: not a trace" "names the file and why"
expect 2 "--op-times on a missing file" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --op-times "$tmp/none.json"
contains err "cannot read it" "missing trace"
expect 0 "--version" -- "$check" --version
contains out "piper-check" "version text"

# A model.pt is a zip; the manifest rides along as an extra file (built here with Debian's python3 zipfile).
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/model.pt" "$gpt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("model/data.pkl", b"\x80\x02}q\x00.")
    z.write(sys.argv[2], "model/extra/piper/manifest.json")
PY
expect 0 "model.pt input" -- "$check" "$tmp/model.pt" "$root/strategies/zero3.piper"
contains out "gpt-8L" "model name from the archive"
printf 'PK\003\004garbage' >"$tmp/corrupt.pt"
expect 1 "corrupt model.pt" -- "$check" "$tmp/corrupt.pt" "$root/strategies/dp.piper"
contains err "cannot read as a model.pt archive" "corrupt archive message"

expect 0 "--emit ast -o" -- "$check" "$gpt" "$root/strategies/gpipe.piper" --emit ast -o "$tmp/ast.piper"
grep -q "^for i in 0..3 { order fwd(i, 7) -> bwd(i, 0); }" "$tmp/ast.piper" || { echo "FAIL: ast output"; fails=$((fails + 1)); }
expect 0 "the emitted ast checks again" -- "$check" "$gpt" "$tmp/ast.piper"

# The DAG: JSON with the documented fields, Graphviz, the pass list, printing after a pass.
expect 0 "--emit dag-json" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=2 --emit dag-json
${PIPER_PYTHON:-/usr/bin/python3} - "$tmp/out" <<'PY' || { echo "FAIL: dag-json content"; fails=$((fails + 1)); }
import json, sys
d = json.load(open(sys.argv[1]))
n = d["nodes"][0]
assert all(k in n for k in ("id", "kind", "op", "ranks", "stream", "stage", "microbatch", "chunk", "bytes")), n
assert {x["op"] for x in d["nodes"]} >= {"F", "B", "U", "send", "recv"}
assert {e["kind"] for e in d["edges"]} == {"data", "temporal"}
PY
expect 0 "--emit dot" -- "$check" "$gpt" "$root/strategies/dp.piper" --emit dot
contains out "digraph piper" "dot header"
expect 0 "--list-passes" -- "$check" --list-passes
contains out "replicate" "pass list"
expect 0 "--print-after p2p" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=1 --print-after p2p
contains err "# after p2p" "print-after header"
contains err "0SEND_F0 r0 p2p_send" "print-after content"
expect 2 "--print-after unknown pass" -- "$check" "$gpt" "$root/strategies/dp.piper" --print-after nosuchpass

# The schedule: programs, torch's CSV, a Perfetto trace, an SVG, the simulation table.
expect 0 "--emit schedule" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=2 --emit schedule
contains out "  compute:  0F0 0F1 0B0[wait 0RECV_B0] 0B1[wait 0RECV_B1] 0U" "stage 0 program"
expect 0 "--emit torch-csv" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=2 --emit torch-csv
contains out "1F0,1B0,1F1,1B1" "last stage CSV line"
expect 0 "--emit trace" -- "$check" "$gpt" "$root/strategies/dp.piper" --emit trace
${PIPER_PYTHON:-/usr/bin/python3} -c "import json,sys; e=json.load(open(sys.argv[1]))['traceEvents']; assert any(x['ph']=='X' and x['name']=='0F0' for x in e)" "$tmp/out" ||
  { echo "FAIL: trace content"; fails=$((fails + 1)); }
expect 0 "--emit svg" -- "$check" "$gpt" "$root/strategies/dualpipev.piper" --emit svg
contains out "<svg" "svg header"
expect 0 "--simulate with a machine" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --simulate --machine "$root/machines/h100.json" --memory-budget 80GiB
contains out "step time" "simulation totals"
contains out "budget" "budget column"
# --hosts: which axes and how much of each step cross hosts; a world the hosts do not hold is refused.
expect 0 "--hosts 2x4" -- "$check" "$gpt" "$root/strategies/1f1b_dp.piper" --np 8 --set pp=4 --set dp=2 --hosts 2x4
contains out "hosts      2 (host 0: ranks 0-3; host 1: ranks 4-7)" "the hosts' ranks"
contains out "axes inside a host: dp; across hosts: pp" "what crosses"
contains out "per step across hosts: 32 sends" "the sends that cross"
expect 1 "--hosts holding another world" -- "$check" "$gpt" "$root/strategies/1f1b_dp.piper" --np 8 --set pp=4 --set dp=2 --hosts 3x4
contains err "the hosts hold 12 ranks, but the mesh has 8" "the mismatch"
expect 2 "--hosts malformed" -- "$check" "$gpt" "$root/strategies/1f1b_dp.piper" --np 8 --hosts 2by4
contains err "expected HOSTSxRANKS" "the usage error"
# A machine format stays that format with --simulate: the simulation's text goes elsewhere (stdout
# with -o, else stderr), never into the JSON.
expect 0 "--simulate --emit sim-json -o" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --simulate --emit sim-json -o "$tmp/sim.json"
${PIPER_PYTHON:-/usr/bin/python3} -c "import json,sys; assert 'step_time' in json.load(open(sys.argv[1]))" "$tmp/sim.json" ||
  { echo "FAIL: --simulate --emit sim-json -o F: F is not the JSON:"; head -5 "$tmp/sim.json"; fails=$((fails + 1)); }
contains out "step time" "the simulation's text on stdout beside -o"
expect 0 "--simulate --emit sim-json" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --simulate --emit sim-json
${PIPER_PYTHON:-/usr/bin/python3} -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/out" ||
  { echo "FAIL: --simulate --emit sim-json: stdout is not the JSON"; fails=$((fails + 1)); }
contains err "step time" "the simulation's text on stderr when the JSON is on stdout"
expect 2 "bad --cost" -- "$check" "$gpt" "$root/strategies/dp.piper" --cost F=x
expect 2 "bad --memory-budget" -- "$check" "$gpt" "$root/strategies/dp.piper" --simulate --memory-budget lots
expect 2 "bad --memory-budget without --simulate" -- "$check" "$gpt" "$root/strategies/dp.piper" --report "$tmp/r.html" --memory-budget lots
# --report writes the page beside whatever --emit prints; a folder that is not there is a usage error.
expect 0 "--report" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --set pp=2 --set mb=4 --report "$tmp/plan.html"
contains out "1f1b.piper: ok" "the report still on stdout"
grep -q '<script type="application/json" id="plan-data">{' "$tmp/plan.html" ||
  { echo "FAIL: --report: no plan data in the page"; fails=$((fails + 1)); }
expect 2 "--report into a missing folder" -- "$check" "$gpt" "$root/strategies/1f1b.piper" --report "$tmp/no/such/plan.html"
contains err "cannot write $tmp/no/such/plan.html" "the write error"

if ((fails)); then echo "cli_test: $fails failed"; exit 1; fi
echo "cli_test: all passed"
