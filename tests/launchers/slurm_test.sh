#!/usr/bin/env bash
# gradnorm's ranks under a real single-node Slurm (munge, slurmctld and slurmd from Debian,
# on localhost, started and stopped here): `srun -n 2` and `srun -n 4` over the distributed
# catalogue give the same observation digests as gradnorm's own supervisor, rank 0 writes
# the reports, and a rank that hangs or dies ends every task with a non-zero exit that srun
# passes on. Exits 77 (skipped) with the reason when the daemons cannot start here.
# Usage: slurm_test.sh GRADNORM SOURCE_DIR WORK_DIR
set -euo pipefail
gradnorm=$(realpath "$1") source=$(realpath "$2") work=$(realpath -m "$3")
cluster_script="$source/tests/launchers/slurm-local.sh"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
# The daemons' unix sockets live in the cluster folder, and a socket path has 108 bytes at
# most: a short folder of its own, whatever the build folder's path.
cluster=$(mktemp -d /tmp/gradnorm-slurm.XXXXXX)
source "$source/tests/launchers/common.sh"

status=0
setup=$(bash "$cluster_script" start "$cluster") || status=$?
if [ "$status" -eq 77 ]; then
  rm -rf "$cluster"
  echo "SKIP: no single-node Slurm here (see the reason above)"
  exit 77
fi
trap 'bash "$cluster_script" stop "$cluster"; rm -rf "$cluster"' EXIT
[ "$status" -eq 0 ] || fail "the single-node Slurm did not start (exit $status)"
eval "$setup"
export SLURM_CONF


# srun waits for every task; only rank 0 prints and writes the reports. 2 tasks on the whole
# distributed catalogue; 4, and every launch after these, on its float32 scenarios (every
# variant), as in torchrun_test.sh: each launch of the whole catalogue cost about 10 s (26 s
# with 4 tasks), and what a launch varies is how the ranks find each other.
for world in 2 4; do
  if [ "$world" -eq 4 ]; then scenarios='dist/*/float32'; fi
  supervisor_digests "$world" "${scenarios:-dist/*}"
  launched_digests "slurm$world" "$world" slurm "gloo processes x $world under slurm" \
    "srun -n $world" timeout 600 srun -n "$world" --kill-on-bad-exit=1
  [ "$(grep -c 'rows:' "slurm$world.out")" -eq 1 ] || fail "srun -n $world: not exactly one summary line: $(cat "slurm$world.out")"
done
# The Python package's gradnorm (the console script scripts/build.sh installs into .venv: the
# harness in that interpreter) under srun: the same digests.
package_gradnorm="$(dirname "${GRADNORM_PYTHON:?set by ctest}")/gradnorm"
gradnorm="$package_gradnorm" launched_digests package2 2 slurm "gloo processes x 2 under slurm" \
  "srun -n 2, the Python package's gradnorm" timeout 600 srun -n 2 --kill-on-bad-exit=1
# Detection: --launcher env without RANK reads Slurm's variables too.
launched_digests detected 2 env "" "srun -n 2, --launcher env detecting Slurm" timeout 600 srun -n 2

# Faults: without --kill-on-bad-exit srun leaves the other tasks running, so they must end on
# their own; `timeout 120` failing the test means a task waited forever.
fault_case() {  # NAME FAULT EXPECTED_TEXT
  local name=$1 fault=$2 text=$3 status=0
  timeout 120 srun -n 2 "$gradnorm" run --launcher slurm -s dist/5-3/float32 -v baseline \
    --timeout 5 -q --inject-fault "$fault" > "$name.out" 2> "$name.err" || status=$?
  [ "$status" -ne 0 ] || fail "$name: srun exited 0"
  [ "$status" -ne 124 ] || fail "$name: a task never ended: $(cat "$name.err")"
  grep -qF -- "$text" "$name.err" || fail "$name: no '$text' in: $(cat "$name.err")"
  echo "ok: $name: srun exited $status; $(grep -m1 -F -- "$text" "$name.err" | cut -c1-160)"
}
fault_case rank1-hangs 1:hang "rank 1 said nothing"
fault_case rank1-dies 1:exit "rank 1 said nothing"
fault_case rank0-dies 0:exit "rank 0"
echo "PASS"
