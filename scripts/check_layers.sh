#!/usr/bin/env bash
# The layout's one rule, checked: a folder includes only from folders to its left in
#   grammar → lang → ir → scheduler → runtime → tools
# and inside runtime/ a room only from rooms to its left in
#   comm → view → device → model → exec → profile → job
# (tests and benches may include anything). Usage: scripts/check_layers.sh [ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
floors=(grammar lang ir scheduler runtime tools)
rooms=(comm view device model exec profile job)
index() {  # index NAME LIST...: its position, or -1
  local name=$1 i=0; shift
  for x in "$@"; do [ "$x" = "$name" ] && { echo $i; return; }; i=$((i + 1)); done
  echo -1
}
bad=0
while IFS= read -r file; do
  case $file in *_test.cpp) continue ;; esac
  from=${file%%/*}
  fi=$(index "$from" "${floors[@]}")
  while IFS= read -r inc; do
    to=${inc%%/*}
    ti=$(index "$to" "${floors[@]}")
    ((ti < 0)) && continue  # tests/, generated grammar headers
    if ((ti > fi)); then echo "$file includes $inc: $to is right of $from"; bad=$((bad + 1)); continue; fi
    if [ "$from" = runtime ] && [ "$to" = runtime ]; then
      fr=$(index "$(echo "$file" | cut -d/ -f2)" "${rooms[@]}") tr=$(index "$(echo "$inc" | cut -d/ -f2)" "${rooms[@]}")
      if ((fr < 0 || tr < 0)); then echo "$file includes $inc: every runtime file lives in a room"; bad=$((bad + 1))
      elif ((tr > fr)); then echo "$file includes $inc: room $(echo "$inc" | cut -d/ -f2) is right of $(echo "$file" | cut -d/ -f2)"; bad=$((bad + 1)); fi
    fi
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$file")
done < <(find grammar lang ir scheduler runtime tools -name '*.cpp' -o -name '*.h' | sort)
if ((bad)); then echo "check_layers: $bad includes against the layout"; exit 1; fi
echo "check_layers: every include points left"
