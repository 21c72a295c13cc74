# Sourced by the torchtune tests (torchtune_model.sh, torchtune_recipes.sh,
# seed_pr_recipe.sh) after they set $work: skips (77) where torchtune is not installed,
# saying why; then script_common.sh ($work afresh, expect, row).
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
source "$(dirname "${BASH_SOURCE[0]}")/require_packages.sh"
require_packages "" torchtune
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
