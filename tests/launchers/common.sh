# Sourced by the launcher tests (after setting $gradnorm): how they fail, and how they run
# the distributed catalogue under a launcher and compare with gradnorm's own supervisor.
fail() { echo "FAIL: $*" >&2; exit 1; }

# Every line, in order: the same rows, bit-identical observations.
same_digests() {  # REFERENCE CANDIDATE WHAT
  cmp -s "$1" "$2" || { diff "$1" "$2" | head -20 >&2; fail "$3: digests differ from the supervisor's"; }
  [ -s "$1" ] || fail "$3: no digests written"
  echo "ok: $3: $(wc -l < "$1") rank digests equal the supervisor's"
}

# The reference: gradnorm's own supervisor, W ranks over a FileStore, into refW.tsv; its
# ranks forked warm, whose digests are the exec'd ranks' (ctest WarmRankProcesses), at a
# fraction of the start-up (docs/ranks.md).
supervisor_digests() {  # WORLD
  GRADNORM_WARM_RANKS=1 "$gradnorm" run --nproc "$1" -s 'dist/*' -q --digests "ref$1.tsv" > "ref$1.out"
}

# `LAUNCHER... gradnorm run --launcher KIND` over dist/* into NAME.tsv and NAME.json: it must
# succeed, match refWORLD.tsv, and (unless TRANSPORT is empty) name TRANSPORT in its settings.
launched_digests() {  # NAME WORLD KIND TRANSPORT WHAT LAUNCHER...
  local name=$1 world=$2 kind=$3 transport=$4 what=$5
  shift 5
  "$@" "$gradnorm" run --launcher "$kind" -s 'dist/*' -q --digests "$name.tsv" --json "$name.json" \
    > "$name.out" 2> "$name.err" || fail "$what: $(tail -5 "$name.err")"
  same_digests "ref$world.tsv" "$name.tsv" "$what"
  [ -z "$transport" ] || grep -qF "\"transport\": \"$transport\"" "$name.json" ||
    fail "$what: the report's settings do not say '$transport': $(grep transport "$name.json")"
}
