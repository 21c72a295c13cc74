# Sourced by the tests of users' own loops (accelerate_loops.sh, deepspeed_loops.sh) with
# $framework set and their arguments GRADNORM_BINARY SOURCE_DIR WORK_DIR: skips (77) where the
# framework is not installed, then sources script_common.sh, and sets mean and tokens (the
# loops of examples/FRAMEWORK/), tests (tests/python/FRAMEWORK/loops.py) and scenarios.
gradnorm="$1"
source_dir="$2"
work="$3"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
source "$(dirname "${BASH_SOURCE[0]}")/require_packages.sh"
require_packages "" "$framework"
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
unset PYTHONPATH
mean=$framework:$source_dir/examples/$framework/mean_loss.py:train
tokens=$framework:$source_dir/examples/$framework/token_loss.py:train
tests=$source_dir/tests/python/$framework/loops.py
scenarios=$source_dir/tests/python/lightning/scenarios.toml
