# A multi-host test bed on one machine, sourced by scripts/multihost.sh, the multi-host tests and
# bench: each "host" is a network namespace with its own hostname, wired to a switch namespace (a
# bridge) by a veth pair, addressed in 198.18.0.0/24 (RFC 2544's benchmarking range). Nothing is
# configured in the machine's own namespace; traffic stays among the bed's namespaces. Open MPI starts
# its daemon on each host through an rsh agent that enters the host's namespace (and a UTS namespace
# with the host's name), so ranks on different hosts talk TCP and ranks on one host shared memory.
#
#   bed_up HOSTS [RATE DELAY]   # e.g. bed_up 2, or bed_up 2 1gbit 200us (tc on each host's link)
#   bed_mpirun ARGS...          # mpirun across the hosts (a hostfile of $bed_slots slots each),
#                               # killed after $bed_timeout s (exit 124)
#   bed_down                    # kill what runs inside, remove the namespaces (also on EXIT)
# Requires root (ip netns), iproute2 and Open MPI.

bed_prefix="pmh$$"             # namespace names: unique per bed, so two beds can run at once
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
    if [ -n "$rate" ]; then
      tc -n "$ns" qdisc add dev eth0 root netem rate "$rate" delay "$delay" limit 100000 || return 1
    fi
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
  # The rsh agent: `agent HOST COMMAND...` runs COMMAND (Open MPI's daemon) inside HOST's namespace
  # under HOST's hostname. The environment passes through as it is (one machine, one file system).
  cat >"$bed_dir/agent" <<EOF
#!/bin/sh
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$bed_dir/namespaces")
[ -n "\$ns" ] || { echo "multihost agent: no host '\$host' in the bed" >&2; exit 1; }
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$*"' "\$host" "\$@"
EOF
  chmod +x "$bed_dir/agent"
}

# mpirun on host 0 (inside its namespace and under its name) across every host of the bed.
bed_mpirun() {
  local np=$((bed_hosts * bed_slots))
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$bed_timeout" \
    ip netns exec "$(bed_ns 0)" unshare --uts sh -c 'hostname h0 && exec "$@"' sh \
    mpirun --hostfile "$bed_dir/hostfile" -np "$np" --map-by slot --bind-to none \
    --mca plm_rsh_agent "$bed_dir/agent" \
    --mca oob_tcp_if_include "$bed_net.0/24" --mca btl_tcp_if_include "$bed_net.0/24" \
    --mca btl self,vader,tcp "$@"
}

# Beds left by a process that was killed (SIGKILL runs no trap): their owner's pid is gone.
bed_reap() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^pmh[0-9]+-/ { print $1 }'); do
    pid=${ns#pmh}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
}

# Every process inside the bed's namespaces killed, the namespaces and their /etc/netns files removed.
bed_down() {
  [ -n "$bed_dir" ] || return 0
  local ns
  for ns in $(ip netns list 2>/dev/null | awk -v p="$bed_prefix-" 'index($1, p) == 1 { print $1 }'); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null
  rm -rf "$bed_dir"
  bed_dir=""
}
