#!/usr/bin/env bash
# Try Piper on many hosts by hand, on this one machine: brings up the test bed (network namespaces
# as hosts, scripts/multihost_lib.sh), runs one command across it under mpirun, tears the bed down.
#
#   scripts/multihost.sh [--hosts N] [--slots K] [--rate RATE] [--slow HOST:PERCENT] [--print] -- PROGRAM ARGS...
#
#   scripts/multihost.sh -- build/tools/piper-run model.pt strategies/1f1b_dp.piper --set pp=2 --set dp=2 --set mb=4 \
#     --data data/corpus.txt --steps 20
#
# --hosts 2 and --slots 2 by default (N × K ranks, rank r on host r / K); --rate shapes every host's
# link (tc tbf, e.g. 1gbit; this kernel has no netem for delays); --slow h1:30 limits a host to 30%
# of a core; --print shows the hostfile and rsh agent the run uses (what a cluster's would look like).
# Needs root. Nothing is left behind, also when the command fails or is interrupted.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/multihost_lib.sh"
hosts=2 rate="" slow="" print=0
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --slots) bed_slots=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --print) print=1; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "multihost: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "multihost: no command after -- (--help)" >&2; exit 2; }
[[ $hosts =~ ^[1-9][0-9]*$ && $bed_slots =~ ^[1-9][0-9]*$ ]] || { echo "multihost: --hosts and --slots take positive numbers" >&2; exit 2; }
bed_up "$hosts" $rate || { echo "multihost: cannot make the test bed" >&2; exit 1; }
if [ -n "$slow" ]; then bed_slow "${slow%%:*}" "${slow##*:}" || exit 1; fi
if ((print)); then
  echo "== hostfile ($bed_dir/hostfile)"; cat "$bed_dir/hostfile"
  echo "== rsh agent ($bed_dir/agent)"; cat "$bed_dir/agent"
fi
bed_timeout=${PIPER_MULTIHOST_TIMEOUT:-3600}
bed_mpirun "$@" </dev/null
