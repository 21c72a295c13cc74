#!/usr/bin/env bash
# The counter-examples fuzzing finds for every negative control and candidate, written one
# file per variant and seed, so two builds (another torch, a refactor) compare with diff -r:
#   bash scripts/fuzz-counterexamples.sh OUT_DIR [GRADNORM]   (default ./build/tools/gradnorm)
# The throughput line is left out (the only wall-clock figure), and the source tree's folder
# is cut from the properties' FILE:LINE, so two checkouts compare.
set -euo pipefail
out="${1:?usage: fuzz-counterexamples.sh OUT_DIR [GRADNORM]}"
gradnorm="${2:-./build/tools/gradnorm}"
mkdir -p "$out"
variants=(broken/step-inside-skip-gate broken/clip-inside-skip-gate broken/logged-loss-divided-by-n
          broken/scale-pass-dropped broken/non-finite-zeroed skip world-size-only)
for v in "${variants[@]}"; do
  for seed in 11 12 13; do
    # Exit 1 is the expected "a property failed"; anything else stops the script.
    "$gradnorm" fuzz -v "$v" --cases 200 --seed "$seed" > "$out/raw" 2>&1 || [ $? -eq 1 ]
    grep -v " cases in " "$out/raw" | sed -E 's|[^ ]*/(oracles/include/)|\1|' \
      > "$out/${v//\//_}-$seed.txt"
  done
done
"$gradnorm" fuzz --cases 100 --seed 11 > "$out/raw" 2>&1
grep -v " cases in " "$out/raw" | sed -E 's|[^ ]*/(oracles/include/)|\1|' > "$out/properties-11.txt"
rm -f "$out/raw"
echo "wrote $(ls "$out" | wc -l) files to $out"
