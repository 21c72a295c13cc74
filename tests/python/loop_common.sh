# Sourced by the tests of users' own loops (accelerate_loops.sh, deepspeed_loops.sh) with
# $framework set and their arguments GRADNORM_BINARY SOURCE_DIR WORK_DIR: skips (77) where the
# framework does not import, then sources script_common.sh, and sets mean and tokens (the
# loops of examples/FRAMEWORK/), tests (tests/python/FRAMEWORK/loops.py) and scenarios.
gradnorm="$1"
source_dir="$2"
work="$3"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
# DeepSpeed picks its accelerator at import: the CPU's, as gradnorm's adapter makes it.
if ! why=$(DS_ACCELERATOR=cpu "$python" -c "import $framework" 2>&1); then
  echo "SKIP: $framework does not import in $python: $(echo "$why" | tail -1)"
  exit 77
fi
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
unset PYTHONPATH
mean=$framework:$source_dir/examples/$framework/mean_loss.py:train
tokens=$framework:$source_dir/examples/$framework/token_loss.py:train
tests=$source_dir/tests/python/$framework/loops.py
scenarios=$source_dir/tests/python/lightning/scenarios.toml
