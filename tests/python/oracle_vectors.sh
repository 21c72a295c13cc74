#!/usr/bin/env bash
# ctest: export oracle vectors with the built gradnorm, then run the pytest suite that reads
# them through the shipped helper. Arguments: GRADNORM_BINARY SOURCE_DIR WORK_DIR
set -euo pipefail
gradnorm="$1"
source_dir="$2"
work="$3"
rm -rf "$work"
mkdir -p "$work"
"$gradnorm" export 'single/n5/*' 'single/accum2-chunked/float32' 'single/n5-linear-ce/float32' \
  'single/clip-active/float32' 'single/n5-momentum-3steps/float32' 'single/all-masked-mean_ce/float32' \
  'single/n5-linear-head/float32' 'single/n5-lora/float32' 'dist/5-3/*' 'dist/0-8/float32' \
  'dist/accum2-ragged/float32' 'dist/5-3-clip-active/float32' 'dist/8-ranks-ragged/float32' \
  --out "$work/vectors" > /dev/null
export GRADNORM_VECTORS="$work/vectors"
export PYTHONPATH="$source_dir/python:$source_dir/examples/python"
cd "$work"
exec "${GRADNORM_PYTHON:?set it to the environment python, as ctest does}" -m pytest -q -p no:cacheprovider "$source_dir/tests/python/test_oracle_vectors.py"
