#!/usr/bin/env bash
# A pull request's normalisation check: runs gradnorm on the base and on the head commit, each
# in its own tree, and compares them. Writes into OUT_DIR:
#   base.json head.json             each side's report (gradnorm run --json)
#   base.junit.xml head.junit.xml   each side's rows as JUnit
#   comment.md                      the diff as one pull-request comment (gradnorm diff --markdown)
#   diff.junit.xml                  the diff as JUnit: a failure per regression
#   report.html                     the head's report and the diff, self-contained (when built)
# Exit status: gradnorm diff's (0 no regression, 1 a regression, 2 bad input); 3 when a side
# could not be built or run.
#
#   bash scripts/pr-check.sh BASE_REF HEAD_REF [OUT_DIR] [-- RUN_ARGUMENTS...]
#
# RUN_ARGUMENTS go to `gradnorm run` on both sides, in each side's tree (so -f FILE and
# --python-step FILE read that commit's files); default: the default matrix.
# Environment (each optional):
#   GRADNORM_BUILD       the command that builds a side, run in its tree (default: bash scripts/build.sh)
#   GRADNORM_EXE         the built executable, relative to a side's tree (default: build/tools/gradnorm);
#                        a project with its own steps names its own gradnorm executable here
#   GRADNORM_BASE_BIN    use this executable for the base instead of building it
#   GRADNORM_HEAD_BIN    likewise for the head (e.g. the build CI already made)
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
base_ref=$1 head_ref=$2
shift 2
out=gradnorm-pr
if [ $# -gt 0 ] && [ "$1" != "--" ]; then out=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
run_arguments=("$@")
build_command=${GRADNORM_BUILD:-bash scripts/build.sh}
exe=${GRADNORM_EXE:-build/tools/gradnorm}
repo=$(git rev-parse --show-toplevel)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

side() {  # side NAME REF BIN: extracts REF, builds it unless BIN is given, runs gradnorm there
  local name=$1 ref=$2 bin=$3 tree="$work/$1"
  mkdir -p "$tree"
  if ! git -C "$repo" archive --format=tar "$ref" | tar -x -C "$tree"; then
    echo "pr-check: cannot extract $name ($ref)" >&2
    return 3
  fi
  if [ -z "$bin" ]; then
    echo "pr-check: building $name ($ref)"
    (cd "$tree" && bash -c "$build_command") > "$out/$name.build.log" 2>&1 ||
      { echo "pr-check: building $name failed; see $out/$name.build.log" >&2; return 3; }
    bin="$tree/$exe"
  fi
  local status=0
  (cd "$tree" && "$bin" run -q --json "$out/$name.json" --junit "$out/$name.junit.xml" \
     "${run_arguments[@]}") > "$out/$name.log" 2>&1 || status=$?
  # 0 and 1 are verdicts; anything else means the side did not run.
  if [ "$status" -gt 1 ]; then
    echo "pr-check: gradnorm run on $name exited $status:" >&2
    tail -5 "$out/$name.log" >&2
    return 3
  fi
  echo "pr-check: $name ($ref): $(tail -1 "$out/$name.log")"
  eval "${name}_bin=\$bin"
}

base_bin=${GRADNORM_BASE_BIN:-}
head_bin=${GRADNORM_HEAD_BIN:-}
side base "$base_ref" "$base_bin" || exit 3
side head "$head_ref" "$head_bin" || exit 3

status=0
diff_arguments=(diff "$out/base.json" "$out/head.json" --markdown "$out/comment.md" --junit "$out/diff.junit.xml")
# An older gradnorm has no --html: read its help whole (grep -q in a pipe would stop reading
# and, under pipefail, fail on the writer's SIGPIPE).
diff_help=$("$head_bin" diff --help 2>/dev/null || true)
if grep -q -- '--html' <<< "$diff_help"; then
  diff_arguments+=(--html "$out/report.html")
fi
"$head_bin" "${diff_arguments[@]}" || status=$?
echo "pr-check: reports in $out"
exit "$status"
