# Sourced by the framework tests after they set $work (and made sure their framework
# imports): makes $work afresh and enters it; defines expect TEXT FILE, which sets failed=1
# (and shows FILE) when FILE lacks TEXT, expect_not TEXT FILE (when it holds it), and row
# SCENARIO VARIANT VERDICT FILE.
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
