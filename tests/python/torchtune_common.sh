# Sourced by the torchtune tests (torchtune_model.sh, torchtune_recipes.sh,
# seed_pr_recipe.sh) after they set $work: skips (77) where torchtune cannot be imported,
# saying why; makes $work afresh and enters it; defines expect TEXT FILE, which sets
# failed=1 (and shows FILE) when FILE lacks TEXT, and row SCENARIO VARIANT VERDICT FILE.
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
if ! why=$("$python" -c 'import torchtune' 2>&1); then
  echo "SKIP: torchtune does not import in $python: $(echo "$why" | tail -1)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failed=0
expect() {  # expect TEXT FILE
  if ! grep -qF -- "$1" "$2"; then echo "FAIL: '$1' not in $2:"; cat "$2"; failed=1; fi
}
row() {  # row SCENARIO VARIANT VERDICT FILE: the table row has that verdict
  if ! grep -qE "^$1 +$2 +[0-9]+ $3 " "$4"; then
    echo "FAIL: no row '$1 $2 ... $3' in $4:"; cat "$4"; failed=1
  fi
}
