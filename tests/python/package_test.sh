#!/usr/bin/env bash
# The Python package's gradnorm (python -m gradnorm: the C++ as an extension module, run in the
# interpreter that imports it) against the executable: the same digests on one device, on
# ranks as threads, on exec'd and warm rank processes and under torchrun -m; its own
# --version; the messages where the package cannot run; and the installed package (.venv's,
# from scripts/build.sh) with its example models.
# Arguments: GRADNORM_BINARY PACKAGE_DIR (build/python-package) SOURCE_DIR WORK_DIR.
set -uo pipefail
gradnorm="$1"
package="$2"
source_dir="$3"
work="$4"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
export PYTHONPATH="$package"
step="$source_dir/examples/python/full_finetune.py"

same_digests() {  # same_digests LABEL A B: two digest files, equal and not empty
  if [ ! -s "$2" ] || ! cmp -s "$2" "$3"; then
    echo "FAIL: $1: the package's digests differ from the executable's:"; diff "$2" "$3" | head; failed=1
  else
    echo "ok: $1: $(wc -l < "$2") rank digests equal"
  fi
}

# One device and threads: built-in variants and a Python step.
"$gradnorm" run -q -s 'single/*' -s 'dist/5-3/*' -v baseline -v skip --digests exe.txt > exe.out
"$python" -m gradnorm run -q -s 'single/*' -s 'dist/5-3/*' -v baseline -v skip --digests pkg.txt > pkg.out
same_digests "built-in variants" exe.txt pkg.txt
expect "$(tail -1 exe.out)" pkg.out
"$gradnorm" run -q --python-step "$step" -s 'dist/*' --digests exe-py.txt > /dev/null
"$python" -m gradnorm run -q --python-step "$step" -s 'dist/*' --digests pkg-py.txt > /dev/null
same_digests "a Python step on threads" exe-py.txt pkg-py.txt

# Rank processes: exec'd (python -m gradnorm again, in this environment), warm, torchrun -m.
"$gradnorm" run -q --python-step "$step" -s 'dist/5-3/*' -s 'dist/accum2-ragged/*' --nproc 2 --digests exe-ranks.txt > /dev/null
"$python" -m gradnorm run -q --python-step "$step" -s 'dist/5-3/*' -s 'dist/accum2-ragged/*' --nproc 2 --digests pkg-ranks.txt > ranks.out 2>&1
same_digests "exec'd rank processes" exe-ranks.txt pkg-ranks.txt
GRADNORM_WARM_RANKS=1 "$python" -m gradnorm run -q --python-step "$step" -s 'dist/5-3/*' -s 'dist/accum2-ragged/*' --nproc 2 --digests pkg-warm.txt > warm.out 2>&1
same_digests "warm rank processes" exe-ranks.txt pkg-warm.txt
torchrun="$(dirname "$python")/torchrun"
"$torchrun" --standalone --nproc-per-node 2 -m gradnorm run -q --launcher env --python-step "$step" \
  -s 'dist/5-3/*' -s 'dist/accum2-ragged/*' --digests pkg-torchrun.txt > torchrun.out 2>&1
same_digests "torchrun -m gradnorm" exe-ranks.txt pkg-torchrun.txt

# A folder named torch in the working directory is not imported instead of the environment's
# (python -m puts the working directory first on sys.path; the executable's interpreter has
# no such entry).
mkdir -p shadow/torch && echo 'raise ImportError("the torch folder in the working directory")' > shadow/torch/__init__.py
(cd shadow && "$python" -m gradnorm run -q -s single/n3/float32 -v baseline) > shadow.out 2>&1 ||
  { echo "FAIL: a torch folder in the working directory shadowed torch:"; cat shadow.out; failed=1; }
# What it says of itself, and where it cannot run.
"$python" -m gradnorm --version > version.out
expect "the interpreter running gradnorm: $python" version.out
"$python" -m gradnorm fuzz --cases 3 > fuzz.out 2>&1; rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: fuzz in the package exited $rc, not 2"; failed=1; }
expect "fuzz is not in the Python package's gradnorm" fuzz.out
# Another torch than the one it was built against: refused, naming both.
mkdir -p fake/torch && cat > fake/torch/__init__.py <<'PY'
__version__ = "2.9.0"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
PY
PYTHONPATH="$PWD/fake:$package" "$python" -m gradnorm run -q -s single/n3/float32 > other-torch.out 2>&1; rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: another torch: exit $rc, not 2"; failed=1; }
expect "was built for another environment: torch" other-torch.out
# A plan: the rows a run would judge and the pairs it leaves out (the step's cannot_run), as JSON.
"$python" -m gradnorm run --plan --python-step "$step" -s single/n3/float32 -s 'single/in-bwd-accum2-refused/float32' > plan.out
"$python" - plan.out <<'PY' || failed=1
import json, sys
plan = json.load(open(sys.argv[1]))
assert plan["rows"] == [{"scenario": "single/n3/float32", "variant": "py/full_finetune"}], plan
left_out = plan["left_out"]
assert [(p["scenario"], p["variant"]) for p in left_out] == [("single/in-bwd-accum2-refused/float32", "py/full_finetune")], plan
assert "optimizer in backward is not transcribed" in left_out[0]["why"], plan  # the step's cannot_run
print("ok: plan", len(plan["rows"]), "rows,", len(plan["left_out"]), "left out")
PY

# .venv's installed package (scripts/build.sh): its console script and example models.
unset PYTHONPATH
venv_bin="$(dirname "$python")"
if [ -x "$venv_bin/gradnorm" ]; then
  site=$("$python" -c "import gradnorm, os; print(os.path.dirname(gradnorm.__file__))")
  [ -f "$site/examples/transformers/tiny_llama.py" ] || { echo "FAIL: no example models in $site"; failed=1; }
  "$venv_bin/gradnorm" run -q -s single/n3/float32 -v baseline > console.out 2>&1 || { cat console.out; failed=1; }
  expect "1 rows" console.out
else
  echo "FAIL: $venv_bin/gradnorm is not there (scripts/build.sh installs the package into .venv)"; failed=1
fi
exit $failed
