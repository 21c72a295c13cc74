#!/usr/bin/env bash
# A framework's pull request judged against its own checkouts (docs/reports.md): each side is
# installed editable into the environment gradnorm is installed in (pip install -e, so the
# report names it "transformers 5.19.0.dev0's Trainer, editable from PATH"), judged by
# gradnorm there, and the two reports compared. For a framework's repository, not gradnorm's:
# examples/ci/framework-pull-request.yml runs it on a pull request and posts the comment.
# Writes into OUT_DIR:
#   base.json head.json             each side's report (gradnorm run --json)
#   base.junit.xml head.junit.xml   each side's rows as JUnit
#   comment.md                      the diff as one pull-request comment (gradnorm diff --markdown)
#   diff.junit.xml report.html      the diff as JUnit (a failure per regression) and as HTML
# Exit status: gradnorm diff's (0 no regression, 1 a regression, 2 bad input); 3 when a side
# could not be installed or run.
#
#   bash scripts/framework-pr-check.sh BASE_DIR HEAD_DIR [OUT_DIR] [-- RUN_ARGUMENTS...]
#
# RUN_ARGUMENTS go to `gradnorm run` on both sides, run in each side's folder (so a
# --recipe FRAMEWORK:FILE.py:NAME or -f FILE of the checkout is read from that side); e.g.
# -- --recipe transformers:trainer -s 'single/*'. Environment (optional):
#   PYTHON   the Python of the environment gradnorm is installed in (default: python3)
#   BASE_PYTHON, HEAD_PYTHON   a side's own environment instead (default: PYTHON), where the
#            sides must not share one
#   GRADNORM_PIP_ARGS   more pip install arguments for the editable installs (default:
#                       --no-deps --no-build-isolation: the environment already holds the
#                       framework's dependencies)
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
base_dir=$(cd "$1" && pwd)
head_dir=$(cd "$2" && pwd)
shift 2
out=gradnorm-pr
if [ $# -gt 0 ] && [ "$1" != "--" ]; then out=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
run_arguments=("$@")
absolute() {  # a command as a path that still works from each side's folder (a venv's
  # bin/python stays itself: not resolved through its symbolic link)
  case $1 in
    /*) echo "$1" ;;
    */*) echo "$PWD/$1" ;;
    *) command -v "$1" || echo "$1" ;;
  esac
}
base_python=$(absolute "${BASE_PYTHON:-${PYTHON:-python3}}")
head_python=$(absolute "${HEAD_PYTHON:-${PYTHON:-python3}}")
read -r -a pip_arguments <<< "${GRADNORM_PIP_ARGS:---no-deps --no-build-isolation}"
for python in "$base_python" "$head_python"; do
  if ! "$python" -c "import gradnorm" 2> /dev/null; then
    echo "framework-pr-check: $python has no gradnorm (pip install --no-build-isolation PATH_TO_GRADNORM)" >&2
    exit 2
  fi
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

side() {  # side NAME DIR PYTHON: installs DIR editable there, runs gradnorm in it
  local name=$1 tree=$2 python=$3 status=0
  if ! "$python" -m pip install --quiet --disable-pip-version-check "${pip_arguments[@]}" -e "$tree" \
       > "$out/$name.install.log" 2>&1; then
    echo "framework-pr-check: installing $name ($tree) failed; see $out/$name.install.log" >&2
    return 3
  fi
  (cd "$tree" && "$python" -m gradnorm run -q --json "$out/$name.json" --junit "$out/$name.junit.xml" \
     "${run_arguments[@]}") > "$out/$name.log" 2>&1 || status=$?
  # 0 and 1 are verdicts; anything else means the side did not run.
  if [ "$status" -gt 1 ]; then
    echo "framework-pr-check: gradnorm run on $name exited $status:" >&2
    tail -5 "$out/$name.log" >&2
    return 3
  fi
  echo "framework-pr-check: $name ($tree): $(tail -1 "$out/$name.log")"
}

side base "$base_dir" "$base_python" || exit 3
side head "$head_dir" "$head_python" || exit 3
status=0
"$head_python" -m gradnorm diff "$out/base.json" "$out/head.json" --markdown "$out/comment.md" \
  --junit "$out/diff.junit.xml" --html "$out/report.html" || status=$?
echo "framework-pr-check: reports in $out"
exit "$status"
