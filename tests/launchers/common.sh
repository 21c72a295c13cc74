# Sourced by the launcher tests (after setting $gradnorm): how they fail, and how they run
# the distributed catalogue under a launcher and compare with gradnorm's own supervisor.
fail() { echo "FAIL: $*" >&2; exit 1; }

# Every line, in order: the same rows, bit-identical observations.
same_digests() {  # REFERENCE CANDIDATE WHAT
  cmp -s "$1" "$2" || { diff "$1" "$2" | head -20 >&2; fail "$3: digests differ from the supervisor's"; }
  grep -qv '^#' "$1" || fail "$3: no digests written"
  echo "ok: $3: $(wc -l < "$1") rank digests equal the supervisor's"
}

# The reference: gradnorm's own supervisor, W ranks over a FileStore, on PATTERN's scenarios
# (default the whole distributed catalogue) into refW.tsv; its ranks forked warm, whose
# digests are the exec'd ranks' (ctest WarmRankProcesses), at a fraction of the start-up
# (docs/ranks.md).
supervisor_digests() {  # WORLD [PATTERN]
  GRADNORM_WARM_RANKS=1 "$gradnorm" run --nproc "$1" -s "${2:-dist/*}" -q --digests "ref$1.tsv" > "ref$1.out"
}

# The header and the lines of the digests file FILE whose scenario matches the glob PATTERN.
digests_of() {  # FILE PATTERN
  local line
  while IFS= read -r line; do
    # shellcheck disable=SC2053  # PATTERN is a glob on purpose
    if [[ $line == "#"* || ${line%%$'\t'*} == $2 ]]; then printf '%s\n' "$line"; fi
  done < "$1"
}

# `LAUNCHER... gradnorm run --launcher KIND` over the scenarios into NAME.tsv and NAME.json: it
# must succeed, match refWORLD.tsv's lines of those scenarios, and (unless TRANSPORT is empty)
# name TRANSPORT in its settings. The scenarios are $scenarios, the whole distributed catalogue
# unless the caller sets it (scenarios=GLOB launched_digests ...).
launched_digests() {  # NAME WORLD KIND TRANSPORT WHAT LAUNCHER...
  local name=$1 world=$2 kind=$3 transport=$4 what=$5 pattern=${scenarios:-dist/*}
  shift 5
  "$@" "$gradnorm" run --launcher "$kind" -s "$pattern" -q --digests "$name.tsv" --json "$name.json" \
    > "$name.out" 2> "$name.err" || fail "$what: $(tail -5 "$name.err")"
  digests_of "ref$world.tsv" "$pattern" > "ref$world-$name.tsv"
  same_digests "ref$world-$name.tsv" "$name.tsv" "$what"
  [ -z "$transport" ] || grep -qF "\"transport\": \"$transport\"" "$name.json" ||
    fail "$what: the report's settings do not say '$transport': $(grep transport "$name.json")"
}
