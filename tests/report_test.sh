#!/usr/bin/env bash
# piper-check --report in headless Chromium: a 3-D plan over 2 hosts (1F1B × ZeRO-1 × TP, pp=2 dp=2
# tp=2 on the H100 file) renders without errors, its numbers are --emit sim-json's, and a screenshot
# shows the timeline (tests/report_check.py). A report of another plan must fail the same check.
#   report_test.sh PIPER_CHECK
set -euo pipefail
check=$1
root=$(cd "$(dirname "$0")/.." && pwd)
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "report_test: Debian's chromium is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

plan() {  # MB OUT_PREFIX
  "$check" "$root/tests/manifests/gpt8.json" "$root/strategies/1f1b_dp_tp.piper" --set pp=2 --set dp=2 --set tp=2 \
    --set mb="$1" --batch-size 16 --machine "$root/machines/h100.json" --hosts 2x4 --memory-budget 80GiB --simulate \
    --emit sim-json -o "$2.sim.json" --report "$2.html" >/dev/null
}
# Headless, no sandbox (CI runs as root), its own profile; the DOM after the page's script ran.
render() {  # HTML OUT_PREFIX
  local flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/profile" --no-first-run)
  timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$1" >"$2.dom.html" 2>"$2.log"
  timeout 120 "$browser" "${flags[@]}" --window-size=1300,900 --screenshot="$2.png" "file://$1" >>"$2.log" 2>&1
  [ -s "$2.png" ] || { cat "$2.log" >&2; echo "report_test: no screenshot" >&2; exit 1; }
}
plan 4 "$tmp/a"
plan 8 "$tmp/b"
render "$tmp/a.html" "$tmp/a"
/usr/bin/python3 "$root/tests/report_check.py" "$tmp/a.dom.html" "$tmp/a.sim.json" "$tmp/a.png"
# pp is the outer axis over hosts of 4 (dp × tp inside): stage 0's handoff to stage 1 crosses.
grep -q 'Pipeline handoffs between hosts (stage → stage): 0→1;' "$tmp/a.dom.html" ||
  { echo "report_test: the mesh does not say the pp handoff crosses hosts" >&2; exit 1; }
# Negative control: the page of mb=4 against the simulation of mb=8 differs, and the check says so.
if /usr/bin/python3 "$root/tests/report_check.py" "$tmp/a.dom.html" "$tmp/b.sim.json" "$tmp/a.png" 2>"$tmp/neg.txt"; then
  echo "report_test: the check passed a page against another plan's simulation" >&2
  exit 1
fi
grep -q "step_time" "$tmp/neg.txt"
# And a page whose script fails (its data mangled) is reported as not rendered.
sed 's/"classes":\[/"classes":7,"unused":[/' "$tmp/a.html" >"$tmp/c.html"
render "$tmp/c.html" "$tmp/c"
if /usr/bin/python3 "$root/tests/report_check.py" "$tmp/c.dom.html" "$tmp/a.sim.json" "$tmp/c.png" 2>"$tmp/neg2.txt"; then
  echo "report_test: the check passed a page whose script failed" >&2
  exit 1
fi
grep -q "did not render" "$tmp/neg2.txt"
echo "report_test: ok (and the page against another plan's simulation fails: $(wc -l <"$tmp/neg.txt") differences)"
