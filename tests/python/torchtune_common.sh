# Sourced by the torchtune tests (torchtune_model.sh, torchtune_recipes.sh,
# seed_pr_recipe.sh) after they set $work: skips (77) where torchtune cannot be imported,
# saying why; then script_common.sh ($work afresh, expect, row).
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
if ! why=$("$python" -c 'import torchtune' 2>&1); then
  echo "SKIP: torchtune does not import in $python: $(echo "$why" | tail -1)"
  exit 77
fi
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
