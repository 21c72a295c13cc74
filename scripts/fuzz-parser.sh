#!/usr/bin/env bash
# The scenario-file parser under libFuzzer with ASan and UBSan (fuzz/): builds the target
# with clang, then runs it RUNS times (default 1000000) from the seed corpus and the saved
# regressions, with the parser's dictionary. New inputs go to the build folder, never into
# the repository. Exits non-zero on a crash, a non-InvalidInput exception, a leak, a hang
# or a UBSan report; exits 77 when clang or libFuzzer's runtime is missing.
# Usage: scripts/fuzz-parser.sh [RUNS] [BUILD_DIR]   (BUILD_DIR also from GRADNORM_FUZZ_BUILD;
#        default ./build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
source_dir=$PWD
runs=${1:-1000000}
build=$(realpath -m "${2:-${GRADNORM_FUZZ_BUILD:-build-fuzz}}")

skip() { echo "fuzz-parser: SKIPPED: $*"; exit 77; }
for tool in clang clang++; do
  command -v "$tool" > /dev/null || skip "$tool is not installed (Debian: apt-get install clang)"
done
mkdir -p "$build"
probe="$build/probe"
mkdir -p "$probe"
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }' \
  > "$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cpp" -o "$probe/probe" \
     > "$probe/probe.log" 2>&1; then
  skip "clang++ cannot link a libFuzzer target (Debian: apt-get install libclang-rt-14-dev): $(tail -1 "$probe/probe.log")"
fi

CC=clang CXX=clang++ cmake -G Ninja -S fuzz -B "$build" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --parallel "$(nproc)"

# A fresh scratch corpus per run: it comes first, so libFuzzer writes new inputs there.
work="$build/run"
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
seeds=("$source_dir/fuzz/corpus/scenario_file")
if [ -d "$source_dir/fuzz/regressions" ]; then seeds+=("$source_dir/fuzz/regressions"); fi
status=0
start=$(date +%s.%N)
# libFuzzer's own error code is 77 by default, which ctest would read as a skip: 1 instead.
"$build/scenario_file_fuzz" -runs="$runs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
  -dict="$source_dir/fuzz/scenario_file.dict" -artifact_prefix="$work/artifacts/" \
  "$work/corpus" "${seeds[@]}" > "$work/fuzz.log" 2>&1 || status=$?
end=$(date +%s.%N)

last=$(grep -E '^#[0-9]+' "$work/fuzz.log" | tail -1 || true)
execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$work/fuzz.log" | grep -oE '[0-9]+$' || true)
seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
echo "fuzz-parser: $last"
rate=$(awk -v n="${execs:-0}" -v s="$seconds" 'BEGIN { printf "%.0f", (s > 0) ? n / s : 0 }')
echo "fuzz-parser: ${execs:-?} executions in $seconds s ($rate exec/s, build excluded); new inputs in $work/corpus"
if [ "$status" -ne 0 ]; then
  tail -60 "$work/fuzz.log" >&2
  echo "fuzz-parser: FAILED (exit $status); reproducer(s) in $work/artifacts:" >&2
  ls -l "$work/artifacts" >&2
  exit 1
fi
echo "fuzz-parser: ok, no crash"
