# Sourced by the framework tests after they set $work (and made sure their framework
# imports): makes $work afresh and enters it; defines expect TEXT FILE, which sets failed=1
# (and shows FILE) when FILE lacks TEXT, expect_not TEXT FILE (when it holds it), row
# SCENARIO VARIANT VERDICT FILE, and reason SCENARIO VARIANT TEXT FILE (for runs of several
# rows: TEXT is among that row's reasons, or the output shown under it); and variant NAME
# RECIPE [ARG], which prints a scenario file's [[variant]] table (so that runs that differ in
# their recipe alone share one start of gradnorm, a few seconds of importing the framework).
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failed=0
expect() {  # expect TEXT FILE
  if ! grep -qF -- "$1" "$2"; then echo "FAIL: '$1' not in $2:"; cat "$2"; failed=1; fi
}
expect_not() {  # expect_not TEXT FILE
  if grep -qF -- "$1" "$2"; then echo "FAIL: '$1' in $2:"; cat "$2"; failed=1; fi
}
row() {  # row SCENARIO VARIANT VERDICT FILE: the table row has that verdict
  if ! grep -qE "^$1 +$2 +[0-9]+ $3 " "$4"; then
    echo "FAIL: no row '$1 $2 ... $3' in $4:"; cat "$4"; failed=1
  fi
}
reason() {  # reason SCENARIO VARIANT TEXT FILE: TEXT is in the table's block for that row
  if ! awk -v head="  $1 x $2 (" -v text="$3" '
      index($0, head) == 1 { inside = 1; next }
      inside && !/^    / { inside = 0 }
      inside && index($0, text) { found = 1 }
      END { exit !found }' "$4"; then
    echo "FAIL: '$3' not among the reasons of '$1 x $2' in $4:"; cat "$4"; failed=1
  fi
}
variant() {  # NAME RECIPE [ARG]: a [[variant]] table running RECIPE (with the recipe argument ARG)
  printf '[[variant]]\nname = "%s"\nrecipe = "%s"\n' "$1" "$2"
  [ -z "${3:-}" ] || printf 'recipe_args = ["%s"]\n' "$3"
}
