# A multi-host test bed on one machine, sourced by scripts/multihost.sh, the multi-host tests and
# bench: each "host" is a network namespace with its own hostname, wired to a switch namespace (a
# bridge) by a veth pair, addressed in 198.18.0.0/24 (RFC 2544's benchmarking range). Nothing is
# configured in the machine's own namespace; traffic stays among the bed's namespaces. Open MPI starts
# its daemon on each host through an rsh agent that enters the host's namespace (and a UTS namespace
# with the host's name), so ranks on different hosts talk TCP and ranks on one host shared memory.
#
#   bed_up HOSTS [RATE [DELAY]] # e.g. bed_up 2, or bed_up 2 1gbit (tc on each host's link)
#   bed_mpirun ARGS...          # mpirun across the hosts (a hostfile of $bed_slots slots each),
#                               # killed after $bed_timeout s (exit 124)
#   bed_slow HOST PERCENT       # HOST's processes limited to PERCENT of one core (100: unlimited)
#   bed_down                    # kill what runs inside, remove the namespaces (also on EXIT)
# Each host gets its own share of the machine's cores (a cpuset cgroup: with 2 cores and 2 hosts, a
# core each), as real hosts have their own; and a cpu cgroup, for bed_slow.
# Requires root (ip netns), iproute2 and Open MPI.

bed_prefix="pmh$$"             # namespace names: unique per bed, so two beds can run at once
bed_cgroot="/proc/$$/root/sys/fs/cgroup"  # the cgroups as this shell sees them (not a namespace's /sys)
bed_dir=""                     # the bed's files: hostfile, rsh agent, hosts map
bed_hosts=0 bed_slots=2
bed_timeout=300                # seconds bed_mpirun may run (a hung job fails instead of hanging)
bed_net=198.18.0               # host i is $bed_net.$((i + 1)); the switch has no address

bed_ns() { echo "${bed_prefix}-h$1"; }

bed_up() {
  local hosts=$1 rate=${2:-} delay=${3:-}
  [ "$(id -u)" = 0 ] || { echo "multihost: network namespaces need root" >&2; return 1; }
  command -v ip >/dev/null || { echo "multihost: iproute2 (ip) is missing" >&2; return 1; }
  bed_hosts=$hosts
  bed_reap
  bed_dir=$(mktemp -d /tmp/piper-multihost.XXXXXX)
  # Down on exit, before whatever the caller had trapped (a failing test still leaves nothing).
  local prev
  prev=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT\$//")
  trap "bed_down; $prev" EXIT
  trap 'exit 130' INT TERM
  ip netns add "$bed_prefix-sw" || return 1
  ip -n "$bed_prefix-sw" link add br0 type bridge && ip -n "$bed_prefix-sw" link set br0 up || return 1
  ip -n "$bed_prefix-sw" link set lo up
  : >"$bed_dir/hostfile"
  local i ns
  for ((i = 0; i < hosts; i++)); do
    ns=$(bed_ns "$i")
    ip netns add "$ns" || return 1
    # Created in the switch namespace, the host's end moved straight into the host's: the machine's
    # own namespace never sees either.
    ip -n "$bed_prefix-sw" link add "h$i" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$bed_prefix-sw" link set "h$i" master br0 up
    ip -n "$ns" addr add "$bed_net.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # A connection whose peer went silent fails after ~13 s of retransmits (5), not Linux's ~15 min
    # (15): a host cut off ends its Open MPI daemon, which ends its ranks. Per namespace: this host's.
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5
    if [ -n "$rate" ]; then bed_shape "$ns" "$rate" "$delay" || return 1; fi
    echo "h$i slots=$bed_slots" >>"$bed_dir/hostfile"
    echo "h$i $ns" >>"$bed_dir/namespaces"
    # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts: the hosts' names resolve
    # inside the bed only.
    mkdir -p "/etc/netns/$ns"
  done
  for ((i = 0; i < hosts; i++)); do
    local j
    for ((j = 0; j < hosts; j++)); do echo "$bed_net.$((j + 1)) h$j"; done >"/etc/netns/$(bed_ns "$i")/hosts"
    echo "127.0.0.1 localhost" >>"/etc/netns/$(bed_ns "$i")/hosts"
  done
  bed_cgroups
  # The rsh agent: `agent HOST COMMAND...` runs COMMAND (Open MPI's daemon) inside HOST's namespace
  # and cgroups under HOST's hostname. The environment passes through as it is (one machine, one
  # file system).
  cat >"$bed_dir/agent" <<EOF
#!/bin/sh
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$bed_dir/namespaces")
[ -n "\$ns" ] || { echo "multihost agent: no host '\$host' in the bed" >&2; exit 1; }
# Into the host's cgroups, through the bed's own view of /sys: mpirun runs the agent inside host 0,
# where \`ip netns exec\` mounted a /sys without cgroups.
for g in $bed_cgroot/cpuset/\$ns $bed_cgroot/cpu/\$ns; do [ -d "\$g" ] && echo \$\$ >"\$g/tasks"; done
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$*"' "\$host" "\$@"
EOF
  chmod +x "$bed_dir/agent"
}

# Host i's cgroups (cgroup v1, where mounted): a cpuset of its share of the cores, and a cpu group
# with no quota yet. Skipped (hosts share every core) where the machine has fewer cores than hosts.
bed_cgroups() {
  local cores i ns per
  cores=$(nproc)
  [ -d /sys/fs/cgroup/cpuset ] && [ -d /sys/fs/cgroup/cpu ] && ((cores >= bed_hosts)) || return 0
  per=$((cores / bed_hosts))
  for ((i = 0; i < bed_hosts; i++)); do
    ns=$(bed_ns "$i")
    mkdir -p "$bed_cgroot/cpuset/$ns" "$bed_cgroot/cpu/$ns" || return 1
    echo "$((i * per))-$((i * per + per - 1))" >"/sys/fs/cgroup/cpuset/$ns/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$ns/cpuset.mems"
  done
}

bed_slow() {
  local g="/sys/fs/cgroup/cpu/$(bed_ns "${1#h}")" percent=$2
  [ -d "$g" ] || { echo "multihost: no cpu cgroup for host $1" >&2; return 1; }
  # A short period (10 ms) slows every op alike, rather than stopping the host for most of 100 ms now and then.
  echo 10000 >"$g/cpu.cfs_period_us"
  if ((percent >= 100)); then echo -1 >"$g/cpu.cfs_quota_us"; else echo $((percent * 100)) >"$g/cpu.cfs_quota_us"; fi
}

# A host's outgoing link limited to RATE (a token bucket: tbf), delayed by DELAY where the kernel has
# netem (this machine's does not: `tc` answers "Specified qdisc kind is unknown").
bed_shape() {
  local ns=$1 rate=$2 delay=${3:-}
  if [ -n "$delay" ]; then
    tc -n "$ns" qdisc add dev eth0 root netem rate "$rate" delay "$delay" limit 100000 && return 0
    echo "multihost: cannot delay the link by $delay (no sch_netem in this kernel); rate only" >&2
  fi
  tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 50ms
}

# mpirun on host 0 (inside its namespace and under its name) across every host of the bed. Keepalives
# on Open MPI's own connections (5 s idle, 3 probes a second apart) tell mpirun a daemon is lost when
# its host's link goes down, as the default (300 s, 9 × 20 s) would after 8 minutes.
bed_mpirun() {
  local np=$((bed_hosts * bed_slots))
  # Into host 0's cgroups before entering its namespace (whose /sys has none).
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$bed_timeout" \
    sh -c 'for g in "$0"/cpuset/$1 "$0"/cpu/$1; do [ -d "$g" ] && echo $$ >"$g/tasks"; done; shift; exec "$@"' \
    "$bed_cgroot" "$(bed_ns 0)" \
    ip netns exec "$(bed_ns 0)" unshare --uts sh -c 'hostname h0 && exec "$@"' sh \
    mpirun --hostfile "$bed_dir/hostfile" -np "$np" --map-by slot --bind-to none \
    --mca plm_rsh_agent "$bed_dir/agent" \
    --mca oob_tcp_if_include "$bed_net.0/24" --mca btl_tcp_if_include "$bed_net.0/24" \
    --mca btl self,vader,tcp \
    --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 "$@"
}

# Beds left by a process that was killed (SIGKILL runs no trap): their owner's pid is gone.
bed_reap() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^pmh[0-9]+-/ { print $1 }'); do
    pid=${ns#pmh}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
    bed_rm_cgroups "$ns"
  done
  for ns in $(ls /sys/fs/cgroup/cpu /sys/fs/cgroup/cpuset 2>/dev/null | grep -E '^pmh[0-9]+-h[0-9]+$' | sort -u); do
    pid=${ns#pmh}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || bed_rm_cgroups "$ns"
  done
}

# A cgroup can be removed once its processes are gone (they were just killed: wait for them to exit).
bed_rm_cgroups() {
  local g
  for g in "/sys/fs/cgroup/cpuset/$1" "/sys/fs/cgroup/cpu/$1"; do
    [ -d "$g" ] || continue
    for _ in $(seq 1 50); do rmdir "$g" 2>/dev/null && break; xargs -r kill -9 <"$g/tasks" 2>/dev/null || true; sleep 0.1; done
  done
}

# Every process inside the bed's namespaces killed, the namespaces and their /etc/netns files removed.
bed_down() {
  [ -n "$bed_dir" ] || return 0
  local ns
  for ns in $(ip netns list 2>/dev/null | awk -v p="$bed_prefix-" 'index($1, p) == 1 { print $1 }'); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
    bed_rm_cgroups "$ns"
  done
  rmdir /etc/netns 2>/dev/null || true
  rm -rf "$bed_dir"
  bed_dir=""
}
