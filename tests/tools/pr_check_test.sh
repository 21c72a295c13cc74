#!/usr/bin/env bash
# scripts/pr-check.sh on a repository of two real commits: the base's Python step is right,
# the head's normalises by each rank's own count. The comment must name the regression and
# the command that reproduces it, that command must reproduce it, the JUnit files must read
# as CI reporters read them, and the head against itself must show no regression.
# Usage: pr_check_test.sh GRADNORM SOURCE_DIR WORK_DIR
set -euo pipefail
gradnorm=$(realpath "$1") source=$(realpath "$2") work=$(realpath -m "$3")
rm -rf "$work"
mkdir -p "$work/repo/steps"
cd "$work/repo"
git init -q
git config user.email ci@example.invalid
git config user.name ci
cp "$source/examples/python/full_finetune.py" steps/step.py
git add steps && git commit -q -m "base: the recipe's step"
base=$(git rev-parse HEAD)
cp "$source/tests/python/steps/local_mean.py" steps/step.py
git commit -q -am "head: normalise by each rank's own count"
head=$(git rev-parse HEAD)

fail() { echo "FAIL: $*" >&2; exit 1; }
args=(-- --python-step steps/step.py --name py/step -s dist/5-3/float32 -s single/n3/float32 -v baseline)
status=0
GRADNORM_BASE_BIN=$gradnorm GRADNORM_HEAD_BIN=$gradnorm \
  bash "$source/scripts/pr-check.sh" "$base" "$head" "$work/out" "${args[@]}" || status=$?
[ "$status" -eq 1 ] || fail "pr-check exited $status on a broken head, not 1"
comment="$work/out/comment.md"
grep -q '^## \*\*gradnorm: 1 regression\*\*' "$comment" || fail "no regression headline: $(head -3 "$comment")"
grep -q '`dist/5-3/float32` | `py/step`' "$comment" || fail "the regression row is not named"
reproduce=$(grep -o 'reproduce: `[^`]*`' "$comment" | head -1 | sed 's/^reproduce: `gradnorm //; s/`$//')
[ -n "$reproduce" ] || fail "no reproduce command in the comment"
# The command, run from the head's tree, reproduces the regression (exit 1).
status=0
eval "\"$gradnorm\" $reproduce" > "$work/reproduce.log" 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "the reproduce command exited $status: $(tail -3 "$work/reproduce.log")"
# JUnit as reporters read it: count testcases, failures and skipped with an XML parser.
"${GRADNORM_PYTHON:?set it to the environment python, as ctest does}" - "$work/out" <<'PY'
import sys, xml.etree.ElementTree as ET
out = sys.argv[1]
def read(name):
    root = ET.parse(f"{out}/{name}").getroot()
    cases = root.findall(".//testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    suite = root.find("testsuite")
    assert int(suite.get("tests")) == len(cases), name
    assert int(suite.get("failures")) == len(failed), name
    assert int(suite.get("skipped")) == len(skipped), name
    return cases, failed
cases, failed = read("head.junit.xml")
assert len(cases) == 4, f"head: {len(cases)} testcases, want 2 scenarios x 2 variants"
assert [(c.get("classname"), c.get("name")) for c in failed] == [("dist/5-3/float32", "py/step")], failed
cases, failed = read("base.junit.xml")
assert not failed, "the base has failures"
cases, failed = read("diff.junit.xml")
assert len(failed) == 1 and "reproduce: gradnorm run" in failed[0].find("failure").text
print("junit: ok")
PY
for report in base head; do
  "$gradnorm" validate-report "$work/out/$report.json" > /dev/null || fail "$report.json is not a valid report"
done
# A second, independent validator of the same schema: Python's jsonschema.
"${GRADNORM_PYTHON:?set it to the environment python, as ctest does}" - "$source/docs/report.schema.json" "$work/out/base.json" "$work/out/head.json" <<'PY'
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft7Validator.check_schema(schema)
for path in sys.argv[2:]:
    jsonschema.validate(json.load(open(path)), schema)
bad = json.load(open(sys.argv[2]))
bad["records"][0]["max_ulp"] = -1
try:
    jsonschema.validate(bad, schema)
except jsonschema.ValidationError:
    print("jsonschema: ok")
else:
    raise SystemExit("a negative ULP count passed the schema")
PY
# The control: the head against itself has no regression.
status=0
GRADNORM_BASE_BIN=$gradnorm GRADNORM_HEAD_BIN=$gradnorm \
  bash "$source/scripts/pr-check.sh" "$head" "$head" "$work/same" "${args[@]}" > /dev/null || status=$?
[ "$status" -eq 0 ] || fail "head against itself exited $status"
grep -q 'no regression' "$work/same/comment.md" || fail "head against itself: $(head -1 "$work/same/comment.md")"
# A ref that does not exist is a failure to run (3), not a verdict.
status=0
GRADNORM_BASE_BIN=$gradnorm GRADNORM_HEAD_BIN=$gradnorm \
  bash "$source/scripts/pr-check.sh" no-such-ref "$head" "$work/bad" "${args[@]}" > /dev/null 2>&1 || status=$?
[ "$status" -eq 3 ] || fail "a missing ref exited $status, not 3"
echo "pr-check: ok"
