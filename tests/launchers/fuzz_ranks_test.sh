#!/usr/bin/env bash
# fuzz --nproc: each generated case runs on its own rank processes (forked warm from the
# fuzzing process, or exec'd with GRADNORM_WARM_RANKS=0), shrinks across them and prints the
# command that replays its counter-example. The transcription holds on generated ranks; the
# pull request's skip is caught on ragged ranks and its replayed counter-example fails as
# printed; a rank that dies mid-case is a counter-example naming it; Trainer on 2 ranks
# without average_tokens_across_devices is caught; the same seed prints the same cases; bad
# input is exit 2 before any case runs.
# Usage: fuzz_ranks_test.sh GRADNORM SOURCE_DIR WORK_DIR
set -uo pipefail
gradnorm=$(realpath "$1") source=$(realpath "$2") work=$(realpath -m "$3")
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
source "$source/tests/launchers/common.sh"
steps=$source/examples/python

expect() {  # TEXT FILE
  grep -qF -- "$1" "$2" || fail "no '$1' in $2: $(tail -30 "$2")"
}
fuzz() {  # NAME EXPECTED-EXIT ARGS...
  local name=$1 want=$2 status=0
  shift 2
  timeout 300 "$gradnorm" fuzz "$@" > "$name.out" 2>&1 || status=$?
  [ "$status" -eq "$want" ] || fail "$name: exit $status, not $want: $(tail -30 "$name.out")"
  echo "ok: $name: exit $status, $(grep -m1 'cases per second' "$name.out")"
}

# The transcription agrees wherever its reference does, on ragged and any 2-rank cases, warm.
fuzz transcription 0 --python-step "$steps/full_finetune.py" --nproc 2 --cases 6 --seed 1
expect "each case's ranks are warm forked processes" transcription.out
expect "py/full_finetune agrees where its reference does, on ragged rank processes" transcription.out
expect "py/full_finetune agrees where its reference does, on any rank processes" transcription.out
expect "every property held" transcription.out
! grep -q "start by exec" transcription.out || fail "the cases were not forked warm: $(grep 'start by exec' transcription.out)"

# The same seed gives the same cases, whatever starts the ranks (timings aside).
fuzz warm 0 --python-step "$steps/full_finetune.py" --nproc 2 --cases 2 --seed 4
GRADNORM_WARM_RANKS=0 fuzz exec 0 --python-step "$steps/full_finetune.py" --nproc 2 --cases 2 --seed 4
expect "each case's ranks are exec'd processes" exec.out
diff <(grep -v "cases per second\|ranks are" warm.out) <(grep -v "cases per second\|ranks are" exec.out) ||
  fail "warm and exec'd ranks judged the same seed differently"

# A range of world sizes: 1 is one device, 2 and 3 are rank processes.
fuzz range 0 --python-step "$steps/full_finetune.py" --nproc 1-3 --cases 4 --seed 2
expect "agrees where its reference does, on one device" range.out
expect "agrees where its reference does, on any rank processes" range.out

# FSDP2 on a model from a Python file (--model): its cases are a recipe's, on that model.
fuzz fsdp2 0 --python-step "$steps/fsdp2.py" --model "python:$steps/tiny_transformer.py:tiny_transformer" \
  --nproc 2 --cases 4 --seed 1
expect "every property held" fsdp2.out

# Negative control: the pull request's skip drops W/N, which ragged ranks show. The smallest
# counter-example is printed as a scenario with the command that replays it, and replaying it
# fails the same way.
fuzz skip 1 --python-step "$steps/skip.py" --nproc 2 --cases 20 --seed 1
expect "py/skip disagrees with the oracle on gradients" skip.out
expect "replay it: gradnorm run -f FILE --nproc 2 -v py/skip --python-step $steps/skip.py" skip.out
# The first property's (ragged ranks) counter-example.
sed -n '/^\[\[scenario\]\]/,/^seed = /{p;/^seed = /q}' skip.out > counter.toml
grep -q "^valid_tokens" counter.toml || fail "no counter-example table in skip.out"
status=0
"$gradnorm" run -f counter.toml --nproc 2 -v py/skip --python-step "$steps/skip.py" > replay.out 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "the replayed counter-example: exit $status, not 1: $(tail -5 replay.out)"
expect "1 rows: 0 pass, 1 fail" replay.out
echo "ok: replayed $(grep '^valid_tokens' counter.toml): $(grep -m1 'rel L2' replay.out)"

# A rank that dies mid-case (DDP, a graph-less loss on an empty rank: that rank's backward
# raises while the other waits in DDP's all-reduce) is a counter-example naming the rank.
fuzz ddp 1 --python-step "$steps/ddp.py" --nproc 2 --cases 10 --seed 1
expect "py/ddp disagrees with the oracle on run, where its reference agrees" ddp.out
grep -qE "the rank processes ended with exit status 3: gradnorm: run aborted: rank [01] " ddp.out ||
  fail "the rank that died is not named: $(grep -A3 'ended with' ddp.out)"

# Trainer on 2 ranks (transformers, requirements.txt), averaging each rank's own tokens: a
# documented finding (docs/findings.md), found and shrunk; rank processes forked warm.
if "$GRADNORM_PYTHON" -c 'import transformers' 2> /dev/null; then
  fuzz trainer 1 --recipe transformers:trainer --recipe-arg average_tokens_across_devices=false \
    --nproc 2 --cases 5 --seed 3
  expect "transformers/trainer disagrees with the oracle on" trainer.out
  expect "replay it: gradnorm run -f FILE --nproc 2 -v transformers/trainer --recipe transformers:trainer --recipe-arg average_tokens_across_devices=false" trainer.out
  ! grep -q "start by exec" trainer.out || fail "Trainer's cases were not forked warm: $(grep 'start by exec' trainer.out)"
else
  fail "transformers does not import in $GRADNORM_PYTHON (requirements.txt installs it)"
fi

# Bad input: exit 2 before any case runs.
bad() {  # TEXT ARGS...
  local text=$1 status=0
  shift
  "$gradnorm" fuzz "$@" > bad.out 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "fuzz $*: exit $status, not 2: $(cat bad.out)"
  expect "$text" bad.out
}
bad "expected W or a range W1-W2" --python-step "$steps/full_finetune.py" --nproc two
bad "ranks run from 1 to 64, the smaller first" --python-step "$steps/full_finetune.py" --nproc 3-2
bad "ranks run from 1 to 64, the smaller first" --python-step "$steps/full_finetune.py" --nproc 0
bad "give the step to fuzz on rank processes" --nproc 2
bad "fuzz --model gives a --python-step its model" --recipe transformers:trainer --model "python:$steps/tiny_transformer.py:tiny_transformer" --nproc 2
bad "fuzz --timeout bounds rank processes: it goes with --nproc" --python-step "$steps/full_finetune.py" --timeout 5
echo "ok: bad input is exit 2"
