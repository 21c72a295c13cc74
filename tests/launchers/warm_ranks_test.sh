#!/usr/bin/env bash
# Warm rank processes (GRADNORM_WARM_RANKS=1): --nproc W forks the supervisor, which has
# loaded the interpreter, torch and the step's module, instead of exec'ing W new programs.
# The ranks give the exec'd ranks' digests (a DDP Python step, the built-in variants); a
# supervisor that runs a thread beside its own (a step module that starts one at import)
# says so and execs its ranks; a rank that throws, exits or hangs is named and every rank
# ends, with nothing left running.
# Usage: warm_ranks_test.sh GRADNORM SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm=$(realpath "$1") source=$(realpath "$2") work=$(realpath -m "$3")
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$source/tests/launchers/common.sh"
ddp=$source/examples/python/ddp.py

# Exit 0 or 1 (verdicts; the catalogue holds findings): the digests are what is compared.
judged() { [ "$1" -le 1 ]; }
for mode in 0 1; do
  GRADNORM_WARM_RANKS=$mode "$gradnorm" run --nproc 2 --python-step "$ddp" -s 'dist/*' -q \
    --digests "ddp$mode.tsv" > "ddp$mode.out" 2> "ddp$mode.err"
  judged $? || fail "DDP step, warm=$mode: $(tail -3 "ddp$mode.err")"
  GRADNORM_WARM_RANKS=$mode "$gradnorm" run --nproc 2 -s 'dist/5-3/*' -s 'dist/accum2-ragged/*' -q \
    --digests "builtin$mode.tsv" > "builtin$mode.out" 2> "builtin$mode.err"
  judged $? || fail "built-in variants, warm=$mode: $(tail -3 "builtin$mode.err")"
done
same_digests ddp0.tsv ddp1.tsv "a DDP Python step on 2 warm ranks"
same_digests builtin0.tsv builtin1.tsv "the built-in variants on 2 warm ranks"
! grep -q "start by exec" ddp1.err || fail "the warm run fell back to exec: $(cat ddp1.err)"

# A supervisor with a thread of its own is not forked: it says which, and execs.
cat > threaded.py <<'PY'
import threading, time, sys
sys.path.insert(0, "$source/examples/python")
threading.Thread(target=time.sleep, args=(600,), name="sleeper", daemon=True).start()
PY
sed -i "s|\$source|$source|" threaded.py
cat "$ddp" >> threaded.py
GRADNORM_WARM_RANKS=1 "$gradnorm" run --nproc 2 --python-step threaded.py -s dist/5-3/float32 -q \
  --digests threaded.tsv > threaded.out 2> threaded.err
judged $? || fail "a threaded supervisor: $(tail -3 threaded.err)"
grep -qE "rank processes start by exec, not warm: this process runs 1 thread beside its own: .* \(Python threads: sleeper\)" threaded.err ||
  fail "no notice naming the thread: $(cat threaded.err)"
echo "ok: $(grep -m1 'start by exec' threaded.err)"

# Faults on warm ranks: named, every rank ends, nothing left running.
fault() {  # NAME FAULT TEXT
  local status=0
  GRADNORM_WARM_RANKS=1 timeout 120 "$gradnorm" run --nproc 2 -s dist/5-3/float32 -v baseline --timeout 3 \
    --inject-fault "$2" --json "$work/$1.json" > "$1.out" 2> "$1.err" || status=$?
  [ "$status" -eq 3 ] || fail "$1: exit $status, not 3: $(cat "$1.err")"
  grep -qF -- "$3" "$1.err" || fail "$1: no '$3' in: $(cat "$1.err")"
  ! pgrep -f "$work/$1.json" > /dev/null || fail "$1: a rank is still running: $(pgrep -af "$work/$1.json")"
  echo "ok: $1: $(head -c 160 "$1.err")"
}
fault throws 1:throw "rank 1 threw: injected fault"
fault exits 1:exit "rank 1 exited with status 4"
fault hangs 0:hang "rank 0"
