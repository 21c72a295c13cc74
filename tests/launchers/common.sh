# Sourced by the launcher tests: how they fail, and how they compare a launcher's digests
# with the supervisor's (every line, in order: the same rows, bit-identical observations).
fail() { echo "FAIL: $*" >&2; exit 1; }
same_digests() {  # REFERENCE CANDIDATE WHAT
  cmp -s "$1" "$2" || { diff "$1" "$2" | head -20 >&2; fail "$3: digests differ from the supervisor's"; }
  [ -s "$1" ] || fail "$3: no digests written"
  echo "ok: $3: $(wc -l < "$1") rank digests equal the supervisor's"
}
