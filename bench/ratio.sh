#!/usr/bin/env bash
# gradnorm against bench/reference.py on the same reference stream, whole process, start-up
# included, runs alternating: prints each pair of wall times and the median ratio.
#   bash bench/ratio.sh [CASES] [RUNS] [GRADNORM]     (defaults: 3000 cases, 3 runs, ./build/tools/gradnorm)
set -euo pipefail
cases="${1:-3000}"
runs="${2:-3}"
gradnorm="${3:-./build/tools/gradnorm}"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$gradnorm" stream --cases "$cases" --seed 1 --out "$work/stream.toml"

seconds() {  # wall seconds of a command, its output discarded; a failure to start is fatal
  local start end
  start=$(date +%s.%N)
  "$@" > /dev/null 2>&1 || [ $? -eq 1 ]  # gradnorm exits 1: the skip's unexpected rows
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }' 
}

ratios=()
for run in $(seq "$runs"); do
  g=$(seconds "$gradnorm" run -f "$work/stream.toml" -v baseline -v skip -q)
  p=$(seconds "${GRADNORM_PYTHON:-$here/../.venv/bin/python}" "$here/reference.py" "$work/stream.toml")
  r=$(awk -v p="$p" -v g="$g" 'BEGIN { printf "%.3f", p / g }')
  ratios+=("$r")
  printf 'run %d: gradnorm %.2f s, reference.py %.2f s, ratio %.2fx\n' "$run" "$g" "$p" "$r"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
printf '%d cases: gradnorm is %.2fx as fast as the PyTorch script (median of %d)\n' "$cases" "$median" "$runs"
