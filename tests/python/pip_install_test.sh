#!/usr/bin/env bash
# gradnorm in a user's own environment: a fresh virtual environment from the machine's default
# python3, torch 2.13.0 and pytest from requirements-pip.txt, then the README's
# `pip install --no-build-isolation .` (from this build: GRADNORM_BUILD_DIR, the same CMake
# build, so CI compiles the C++ once), then gradnorm run and the example pytest suite
# (examples/pytest): the passing rows pass, mean_of_means fails with the oracle's reason and
# its reproduce command, -k, -x and --junitxml behave as pytest's own; the plugin's options,
# a left-out pair (skipped), a rank that dies and tables gradnorm refuses; a build for another
# torch refused by pip install; and the Python API.
# Arguments: SOURCE_DIR BUILD_DIR WORK_DIR.
set -uo pipefail
source_dir="$1"
build_dir="$2"
work="$3"
base_python="${GRADNORM_BASE_PYTHON:-python3}"
if ! command -v "$base_python" > /dev/null || ! "$base_python" -c "import venv, ensurepip" 2> /dev/null; then
  echo "SKIP: no $base_python with venv and ensurepip to make a fresh environment"; exit 77
fi
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
unset PYTHONPATH
"$base_python" -m venv env || exit 1
py="$PWD/env/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check --no-deps -r "$source_dir/requirements-pip.txt" || {
  echo "SKIP: requirements-pip.txt did not install into a fresh environment of $base_python"; exit 77; }
echo "fresh environment: $("$py" -c 'import sys, torch; print(sys.version.split()[0], sys.executable, "torch", torch.__version__)')"
# The README's command, from the source tree (pip builds there; one install at a time: the
# RESOURCE_LOCK in tests/CMakeLists.txt).
(cd "$source_dir" && GRADNORM_BUILD_DIR="$build_dir" "$py" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation .) > install.out 2>&1 || { echo "FAIL: pip install:"; cat install.out; exit 1; }
"$py" -m pip check > check.out 2>&1 || { echo "FAIL: pip check:"; cat check.out; failed=1; }
# A build made for another torch is refused, naming both, never rebuilt in its place.
mkdir -p other-build/python-package
sed 's/"torch": "[^"]*"/"torch": "2.9.0"/' "$build_dir/python-package/gradnorm-build.json" \
  > other-build/python-package/gradnorm-build.json
(cd "$source_dir" && GRADNORM_BUILD_DIR="$work/other-build" "$py" -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation --no-deps .) > other-build.out 2>&1; rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: pip install from a build for torch 2.9.0 succeeded"; failed=1; }
expect "was built for another environment: torch: 2.9.0 (the build) vs 2.13.0+cpu (here)" other-build.out

# The console script and python -m gradnorm run in this interpreter.
env/bin/gradnorm --version > version.out
expect "the interpreter running gradnorm: $py" version.out
env/bin/gradnorm run -q -s single/n3/float32 -s dist/5-3/float32 > run.out 2>&1; rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: gradnorm run -q exited $rc"; cat run.out; failed=1; }
"$py" -m gradnorm run -q -s dist/5-3/float32 -v baseline --nproc 2 > ranks.out 2>&1; rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: --nproc 2 exited $rc"; cat ranks.out; failed=1; }

# The example suite: exits 1, with the failing row's reasons and reproduce command.
cp -r "$source_dir/examples/pytest" suite && cp -r "$source_dir/examples/python" python
"$py" -m pytest suite -rA --junitxml=junit.xml --gradnorm-timeout 300 > pytest.out 2>&1; rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: pytest on the example suite exited $rc, not 1"; failed=1; }
expect "PASSED suite/pyproject.toml::full_finetune::single/accum2-ragged/float32[py/full_finetune]" pytest.out
expect "PASSED suite/pyproject.toml::full_finetune::dist/5-3/float32[py/full_finetune]" pytest.out
expect "PASSED suite/pyproject.toml::mean_of_means::single/n3/float32[py/mean_of_means]" pytest.out
expect "FAILED suite/pyproject.toml::mean_of_means::single/accum2-ragged/float32[py/mean_of_means]" pytest.out
expect "PASSED suite/ragged.gradnorm.toml::mine/accum3-ragged/float32[py/full_finetune]" pytest.out
expect "PASSED suite/test_api.py::test_mean_of_means_is_caught_on_a_ragged_window" pytest.out
expect "single/accum2-ragged/float32 x py/mean_of_means: fail, expected agree" pytest.out
expect "reproduce: gradnorm run --python-step steps/mean_of_means.py -s single/accum2-ragged/float32 -v py/mean_of_means" pytest.out
expect "5 passed" pytest.out
expect "1 failed" pytest.out
# The reproduce command fails the same way, run where the suite's configuration runs it.
reproduce=$(grep -o "reproduce: gradnorm run --python-step steps/mean_of_means.py.*" pytest.out | head -1 | sed 's/^reproduce: //')
(cd suite && eval "../env/bin/$reproduce" > ../reproduce.out 2>&1); rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: the reproduce command exited $rc, not 1"; cat reproduce.out; failed=1; }
# -k selects by step, scenario or variant (the table's 2 rows and the API test here); -x stops
# at the first failure; --gradnorm-report-dir keeps the run's report (both rows of the table:
# its selected items run together).
"$py" -m pytest suite -x -q -k mean_of_means --gradnorm-report-dir reports > x.out 2>&1
expect "stopping after 1 failures" x.out
expect "1 failed, 1 passed, 3 deselected" x.out
"$py" - reports <<'PY' || failed=1
import gradnorm, os, sys
files = os.listdir(sys.argv[1])
assert len(files) == 1 and "mean_of_means" in files[0], files
report = gradnorm.Report.load(os.path.join(sys.argv[1], files[0]))
assert sorted(r.scenario for r in report.rows) == ["single/accum2-ragged/float32", "single/n3/float32"], report.rows
print("ok: --gradnorm-report-dir kept", files[0])
PY
# --junitxml (the first run's): a testcase per row, the failure with the oracle's reason, the
# reproduce property.
"$py" - junit.xml <<'PY' || failed=1
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
cases = root.findall(".//testcase")
failures = [c for c in cases if c.find("failure") is not None]
assert len(cases) == 6, [c.get("name") for c in cases]
assert [c.get("name") for c in failures] == ["single/accum2-ragged/float32[py/mean_of_means]"], failures
properties = {p.get("name"): p.get("value") for p in failures[0].iter("property")}
assert properties["reproduce"].startswith("gradnorm run --python-step steps/mean_of_means.py"), properties
assert "fail, expected agree" in failures[0].find("failure").text
print("ok: junit", len(cases), "testcases, 1 failure with its reproduce property")
PY
# --gradnorm-arg reaches every run, its plan included: -v baseline adds the built-in step's rows.
"$py" -m pytest suite --collect-only -q -k "not test_api" --gradnorm-arg=-v --gradnorm-arg=baseline > arg.out 2>&1
expect "pyproject.toml::full_finetune::dist/5-3/float32[baseline]" arg.out
expect "pyproject.toml::mean_of_means::single/n3/float32[baseline]" arg.out
# A table gradnorm refuses, and one with a key it does not know: collection errors that say why.
mkdir -p bad && cat > bad/pyproject.toml <<'TOML'
[tool.pytest.ini_options]
[[tool.gradnorm.run]]
step = "missing.py"
[[tool.gradnorm.run]]
stepp = "typo.py"
TOML
"$py" -m pytest bad -q > bad.out 2>&1; rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: pytest on bad tables exited $rc, not 2"; cat bad.out; failed=1; }
expect "gradnorm could not plan pyproject.toml::missing.py (exit 2):" bad.out
expect "Python step 'missing.py' does not exist" bad.out
expect "has unknown keys stepp" bad.out
# A pair the step leaves out is a skipped item with its reason; a run whose rank dies fails its
# items with gradnorm's own account (exit 3, the rank named).
mkdir -p odd && cat > odd/pyproject.toml <<'TOML'
[tool.pytest.ini_options]
[[tool.gradnorm.run]]
name = "refused"
step = "../python/full_finetune.py"
scenarios = ["single/in-bwd-accum2-refused/float32"]
[[tool.gradnorm.run]]
name = "dies"
step = "../python/full_finetune.py"
scenarios = ["dist/5-3/float32"]
nproc = 2
args = ["--inject-fault", "1:exit"]
TOML
"$py" -m pytest odd -rs > odd.out 2>&1; rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: pytest on odd tables exited $rc, not 1"; cat odd.out; failed=1; }
expect "1 failed, 1 skipped" odd.out
expect "gradnorm leaves this pair out: transcribes the recipes' usual path; optimizer in backward is not transcribed" odd.out
expect "gradnorm did not judge: gradnorm run exited 3 (a rank failed)" odd.out
expect "rank 1" odd.out
# gradnorm from Python: a report object whose assertion carries the oracle's reasons.
(cd suite && "$py" - <<'PY') > api.out 2>&1 || { echo "FAIL: the Python API:"; cat api.out; failed=1; }
import gradnorm
report = gradnorm.run(step="steps/mean_of_means.py", scenarios=["single/n3/float32", "single/accum2-ragged/float32"])
assert len(report.rows) == 2 and len(report.failed) == 1, report
row = report.failed[0]
assert row.scenario == "single/accum2-ragged/float32" and row.verdict == "fail" and row.reasons, row.record
assert row.figures["rel_l2_error"] > 1e-3, row.figures
try:
    report.assert_ok()
except gradnorm.NormalisationError as error:
    message = str(error)
else:
    raise SystemExit("assert_ok passed a failing report")
assert "1 of 2 rows not as expected" in message and row.reasons[0] in message and row.reproduce in message, message
try:
    gradnorm.run(scenarios=["no/such/scenario"])
except gradnorm.GradnormError as error:
    assert error.returncode == 2 and "no/such/scenario" in str(error), error
else:
    raise SystemExit("an unknown scenario gave no GradnormError")
print("ok: the API's report, assertion and errors")
PY
exit $failed
