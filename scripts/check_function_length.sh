#!/usr/bin/env bash
# Functions a reader can hold in mind: no function over 100 lines and no main over 80 in the code
# (tests and generated code aside), and runtime/exec/executor.cpp under 450 lines. Counted with
# universal-ctags' `end:` field. Usage: scripts/check_function_length.sh [ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
command -v ctags >/dev/null || { echo "check_function_length: needs universal-ctags (apt-get install universal-ctags)"; exit 2; }
bad=0
while IFS=$'\t' read -r lines file name; do
  limit=100
  [ "$name" = main ] && limit=80
  if ((lines > limit)); then echo "$file: $name is $lines lines (the limit is $limit)"; bad=$((bad + 1)); fi
done < <(find grammar lang ir scheduler runtime tools -name '*.cpp' -o -name '*.h' | grep -v '_test\.cpp$' | sort |
  ctags -L - --languages=C++ --kinds-C++=f --fields=+ne -f - |
  awk -F'\t' '{ l = 0; e = 0
    for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) l = substr($i, 6); if ($i ~ /^end:/) e = substr($i, 5) }
    if (e > 0) print e - l + 1 "\t" $2 "\t" $1 }')
executor=$(wc -l <runtime/exec/executor.cpp)
if ((executor >= 450)); then echo "runtime/exec/executor.cpp is $executor lines (the limit is 450)"; bad=$((bad + 1)); fi
if ((bad)); then echo "check_function_length: $bad over the limits"; exit 1; fi
echo "check_function_length: every function within 100 lines, every main within 80, the executor $executor lines"
