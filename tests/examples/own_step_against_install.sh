#!/usr/bin/env bash
# Installs this build of gradnorm into a fresh prefix, then configures, builds and tests
# examples/own-step against that install only, as a user's own project would.
# Usage: own_step_against_install.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$(realpath "$1") source=$(realpath "$2") work=$(realpath -m "$3")
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work.install.log" 2>&1 ||
  { cat "$work.install.log"; exit 1; }
cmake -G Ninja -S "$source/examples/own-step" -B "$work/build" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$work/prefix"
cmake --build "$work/build" --parallel "$(nproc)"
ctest --test-dir "$work/build" --output-on-failure --timeout 300
# The scenario-file tests the package's CMake function registered: one per scenario x
# variant, selected by label as CI does.
listed=$(ctest --test-dir "$work/build" -N -L own/token-sum | grep -c 'gradnorm:own/' || true)
if [ "$listed" -ne 2 ]; then
  echo "ctest -L own/token-sum lists $listed scenario tests, want 2 (2 scenarios x 1 variant)" >&2
  ctest --test-dir "$work/build" -N >&2
  exit 1
fi
# Read whole before searching: grep -q would stop reading, and ctest's SIGPIPE would fail the
# pipeline under pipefail.
tests=$(ctest --test-dir "$work/build" -N -L gradnorm)
grep -q 'gradnorm:own/accumulation-\[1,7\] x baseline' <<< "$tests" ||
  { echo "the bracketed scenario's test is missing:" >&2; echo "$tests" >&2; exit 1; }
