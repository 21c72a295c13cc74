#!/usr/bin/env bash
# shellcheck disable=SC2046,SC2086,SC2206,SC2207  # pid lists split on purpose
# A throwaway single-node Slurm cluster on localhost, so tests can run the
# real `srun -n N` launcher instead of trusting a mock of its environment.
#   slurm-local.sh start DIR   # prints one line: export SLURM_CONF=DIR/slurm.conf
#   slurm-local.sh stop DIR    # idempotent; safe after a failed start
# Everything (munge key and socket, state, spool, logs, pid files) lives
# under DIR and both ports are picked at start, so nothing outside DIR is
# touched and clusters in different DIRs can run side by side.
# Exit 77 is ctest's skip code: a missing package or a daemon that cannot run
# here means "cannot test on this machine", not "the project is broken".
set -euo pipefail

SKIP=77
PACKAGES=(slurmd slurmctld slurm-client munge)
DAEMONS=(slurmd slurmctld munged)   # stop order: munge's clients first
READY_TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
skip() { echo "slurm-local: skipped: $*" >&2; exit "$SKIP"; }

# Sets STAT to the fields after "(comm) ": state, ppid, ... Without a fork:
# stop scans every process, and a fork for each would make that slow.
read_stat() { local l; read -r l 2>/dev/null <"/proc/$1/stat" || return 1; STAT=${l##*) }; }

# Not just `kill -0`: an orphaned daemon lingers as a zombie until init reaps
# it, and a stale pid file may point at an unrelated process by now (COMM is
# left out just after launch, while the child may still be `setsid`).
alive() { # PID [COMM]
  local c; read_stat "$1" && [ "${STAT%% *}" != Z ] || return 1
  [ -z "${2:-}" ] || { read -r c <"/proc/$1/comm" && [ "$c" = "$2" ]; } 2>/dev/null
}

pid_of() { cat "$dir/pids/$1.pid" 2>/dev/null || true; }

# Every process of *this* cluster, also those we did not start (slurmstepd,
# slurmscriptd): recognised by a file it holds open under DIR.
ours() { # [COMM]
  local p c f
  for p in /proc/[0-9]*; do
    read -r c 2>/dev/null <"$p/comm" || continue
    case $c in slurm*|munged) ;; *) continue ;; esac
    [ -z "${1:-}" ] || [ "$c" = "$1" ] || continue
    for f in "$p"/fd/*; do
      case $(readlink "$f" 2>/dev/null) in "$dir"/*) echo "${p#/proc/}"; break ;; esac
    done
  done
}

# The given pids and all their descendants: the tasks of a slurmstepd that
# is killed outright would otherwise be orphaned and run on.
tree() { # PID...
  [ $# -gt 0 ] || return 0
  local -A want=(); local p s more=1
  for p in "$@"; do want[$p]=1; done
  while [ "$more" ]; do
    more=
    for p in /proc/[0-9]*; do
      p=${p#/proc/}; [ -z "${want[$p]:-}" ] || continue
      read_stat "$p" || continue; s=${STAT#* }
      [ -z "${want[${s%% *}]:-}" ] || { want[$p]=1; more=1; }
    done
  done
  echo "${!want[@]}"
}

wait_gone() { # SECONDS PID... ; prints those still alive at the deadline
  local end=$((SECONDS + $1)) p left; shift
  while :; do
    left=; for p in "$@"; do ! alive "$p" || left+=" $p"; done
    [ -n "$left" ] || return 0
    [ "$SECONDS" -lt "$end" ] || { echo "$left"; return 1; }
    sleep 0.2
  done
}

stop_cluster() {
  [ -d "$dir/pids" ] || return 0
  local name pid pids=() left jobs end p
  # Cancelling jobs first lets slurmd end steps and their tasks cleanly;
  # killing slurmd alone would leave slurmstepd and user tasks running.
  if alive "$(pid_of slurmctld)" slurmctld; then
    jobs=$(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      SLURM_CONF=$dir/slurm.conf timeout 5 scancel $jobs 2>/dev/null || true
      end=$((SECONDS + 15))
      while [ -n "$(ours slurmstepd)" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
    fi
  fi
  # Steps that outlived that (or a dead slurmctld) ignore SIGTERM for long.
  left=$(tree $(ours slurmstepd))
  [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
  for name in "${DAEMONS[@]}"; do
    pid=$(pid_of "$name")
    if alive "$pid" "$name"; then kill -TERM "$pid" 2>/dev/null && pids+=("$pid"); fi
  done
  pids+=($left $(ours))
  left=$(wait_gone 15 "${pids[@]}") || {
    kill -KILL $left 2>/dev/null || true
    wait_gone 5 $left >/dev/null || echo "slurm-local: still running:$left" >&2
  }
  # Give init a moment to reap the zombies, so that `pgrep slurm` right
  # after stop comes back empty; not an error if it never does.
  end=$((SECONDS + 3))
  for p in "${pids[@]}"; do
    while [ -e "/proc/$p" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
  done
  rm -f "$dir"/pids/*.pid
}

fail_start() { # REASON DAEMON...
  # Daemons in the foreground log to stderr (.out) too; show that only when
  # the log proper was never written (early failures, munged).
  local reason=$1 name log; shift
  for name in "$@"; do
    log=$dir/log/$name.log; [ -s "$log" ] || log=$dir/log/$name.out
    [ ! -s "$log" ] || { echo "--- last lines of $log" >&2; tail -n 25 "$log" >&2; }
  done
  skip "$reason"   # the EXIT trap set by start stops what did start
}

# A port nobody here is bound to now, below the usual ephemeral range so
# that srun's own sockets cannot take it later.
free_port() { # EXCLUDE...
  local used=" $* " p _ addr
  while read -r _ addr _; do used+=" $((16#${addr##*:})) "; done \
    < <(tail -q -n +2 /proc/net/tcp /proc/net/tcp6 2>/dev/null)
  while :; do
    p=$((10000 + RANDOM % 22000))
    [[ $used == *" $p "* ]] || { echo "$p"; return; }
  done
}

launch() { # NAME CMD... ; detached from the caller's session and pipes:
  # the caller runs us inside $(...), which would otherwise never return.
  local name=$1; shift
  setsid "$@" </dev/null >>"$dir/log/$name.out" 2>&1 &
  echo $! >"$dir/pids/$name.pid"
}

cleanup_failed_start() { local rc=$?; [ "$rc" -eq 0 ] || stop_cluster; exit "$rc"; }

start_cluster() {
  local missing=() p c host conf sock key cpus ctld_port d_port end state=
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] || skip "missing packages: ${missing[*]}"
  for c in munged mungekey munge unmunge slurmctld slurmd sinfo squeue srun; do
    command -v "$c" >/dev/null || skip "command $c not found"
  done
  [ "$(id -u)" -eq 0 ] || skip "needs root (slurmd starts tasks as their user)"
  host=$(hostname -s)
  # Unix socket paths are limited to 108 bytes, and slurmstepd's are
  # DIR/spool/<host>_<job>.<step>: leave room for the longest ids.
  [ $((${#dir} + ${#host} + 30)) -le 107 ] || skip "DIR too long for unix sockets: $dir"

  stop_cluster   # a previous cluster in this DIR would hold its files
  # Whatever way start fails (skip, or an unexpected error under set -e),
  # leave no daemon behind: the caller only arms its own stop on success.
  trap 'cleanup_failed_start' EXIT
  rm -rf "${dir:?}"/{munge,state,spool,log,pids}
  mkdir -p "$dir"/{state,spool,log,pids}
  mkdir -m 700 "$dir/munge"   # munged refuses a key others could read
  conf=$dir/slurm.conf sock=$dir/munge/munge.socket key=$dir/munge/munge.key

  mungekey --create --keyfile="$key" >/dev/null 2>&1 || skip "mungekey could not create a key"
  # --force turns munged's "every parent of the socket must be searchable by
  # all" error into a warning: DIR may sit in a private home or a mktemp -d
  # folder, and only root talks to this munged anyway.
  launch munged munged --foreground --force --socket="$sock" --key-file="$key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"
  end=$((SECONDS + 15))
  until munge -n -S "$sock" 2>/dev/null | unmunge -S "$sock" >/dev/null 2>&1; do
    alive "$(pid_of munged)" || fail_start "munged exited during start" munged
    [ "$SECONDS" -lt "$end" ] || fail_start "munged not answering after 15s" munged
    sleep 0.2
  done

  # Tests need 4 ranks on 2-core CI machines: declare more CPUs than exist
  # and let config_overrides make slurmd trust the config over the hardware.
  cpus=${SLURM_LOCAL_CPUS:-$(nproc)}; [ "$cpus" -ge 8 ] || cpus=8
  ctld_port=$(free_port); d_port=$(free_port "$ctld_port")
  cat >"$conf" <<EOF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/pids/slurmctld.own.pid
SlurmdPidFile=$dir/pids/slurmd.own.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
# Containers rarely allow cgroups; none of these needs them. Defaults already
# give no job completion log, no switch and no MPI plugin.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
# A job stays COMPLETING for a moment after srun returns; sharing CPUs keeps
# the next srun from queueing behind it ("waiting for resources").
PartitionName=local Nodes=$host Default=YES State=UP MaxTime=INFINITE OverSubscribe=FORCE:4
EOF
  : >"$dir/plugstack.conf"   # keep the system's SPANK plugins out

  launch slurmctld slurmctld -D -i -f "$conf"
  launch slurmd slurmd -D -f "$conf" -N "$host"
  end=$((SECONDS + READY_TIMEOUT))
  until [ "$state" = idle ]; do
    for c in slurmctld slurmd; do
      alive "$(pid_of $c)" || fail_start "$c exited during start" "$c"
    done
    [ "$SECONDS" -lt "$end" ] ||
      fail_start "node $host not idle after ${READY_TIMEOUT}s (state: ${state:-none})" slurmctld slurmd
    sleep 0.5
    state=$(SLURM_CONF=$conf timeout 5 sinfo -h -n "$host" -o %t 2>/dev/null || true)
  done
  printf 'export SLURM_CONF=%q\n' "$conf"
}

[ $# -eq 2 ] || usage
case $1 in
  start) mkdir -p "$2"; dir=$(cd "$2" && pwd -P); start_cluster ;;
  stop) [ -d "$2" ] || exit 0; dir=$(cd "$2" && pwd -P); stop_cluster ;;
  *) usage ;;
esac
