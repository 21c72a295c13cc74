#!/usr/bin/env bash
# A framework's pull request judged against its own checkout, on real code and none copied into
# gradnorm: a git repository of the installed transformers' sources (base, as version
# 5.19.0.dev0), a head commit that breaks its normalisation as a contributor could (Trainer
# counts every label position, padding included, as the batch's items: trainer.py's
# _get_num_items_in_batch), each side installed editable into a fresh environment of its own, and
# scripts/framework-pr-check.sh's comment: the base passes, the head's regression names the rows,
# the editable checkout it judged and a reproduce command that fails again there.
# Arguments: SOURCE_DIR WORK_DIR. The fresh environment takes torch, transformers' dependencies
# and gradnorm (scripts/build.sh installs it) from .venv's site-packages, after its own.
set -uo pipefail
source_dir="$1"
work="$2"
python="${GRADNORM_PYTHON:?set it to the environment python, as ctest does}"
if ! site=$("$python" -c "import transformers, os, sysconfig; print(sysconfig.get_paths()['purelib'])" 2>&1); then
  echo "SKIP: transformers does not import in $python: $(echo "$site" | tail -1)"; exit 77
fi
installed="$site/transformers"
source "$(dirname "${BASH_SOURCE[0]}")/script_common.sh"
unset PYTHONPATH
"$python" -c "import gradnorm" 2> /dev/null || { echo "FAIL: $python has no gradnorm package (scripts/build.sh installs it)"; exit 1; }

# The framework's repository: base, then the contributor's head.
mkdir -p repo/src
(cd "$installed/.." && tar --exclude=__pycache__ -cf - transformers) | tar -xf - -C repo/src
cat > repo/pyproject.toml <<'TOML'
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"
[project]
name = "transformers"
version = "5.19.0.dev0"
[tool.setuptools.packages.find]
where = ["src"]
TOML
git -C repo init -q && git -C repo add -A && git -C repo -c user.name=base -c user.email=base@example.com commit -qm base || exit 1
git -C repo worktree add -q ../head || exit 1
trainer=head/src/transformers/trainer.py
old='num_items_in_batch = sum(labels.ne(-100).sum() for labels in labels_for_count)'
new='num_items_in_batch = sum(labels.numel() for labels in labels_for_count)  # no device sync'
[ "$(grep -cF -- "$old" "$trainer")" -eq 1 ] || { echo "FAIL: the counting line is not in $trainer once"; exit 1; }
"$python" - "$trainer" "$old" "$new" <<'PY'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
open(path, "w").write(text.replace(old, new))
PY
git -C head -c user.name=head -c user.email=head@example.com commit -qam "Count items without a device sync" || exit 1

# A fresh environment for each side, of the same Python, .venv's packages after its own (sorted
# after the editable install's .pth, so the checkout comes first).
base_python=$("$python" -c "import sys; print(sys._base_executable)")
for side in base head; do
  "$base_python" -m venv --without-pip "env-$side" || exit 1  # pip, setuptools: .venv's, through the layer
  env_site=$("env-$side/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$site" > "$env_site/zz_gradnorm_layer.pth"
done

BASE_PYTHON=env-base/bin/python HEAD_PYTHON=env-head/bin/python \
  bash "$source_dir/scripts/framework-pr-check.sh" repo head out -- \
  --recipe transformers:trainer -s single/accum2-ragged/float32 -s first-valid/single/accum2-ragged/float32 \
  > check.out 2>&1; rc=$?
cat check.out
[ "$rc" -eq 1 ] || { echo "FAIL: framework-pr-check exited $rc, not 1 (a regression)"; failed=1; }
expect "framework-pr-check: base ($PWD/repo): 2 rows" check.out
comment=out/comment.md
expect "## **gradnorm: 2 regressions**" "$comment"
expect "| \`hf_tiny_llama/single/accum2-ragged/float32\` | \`transformers/trainer\` |" "$comment"
expect "Judged: \`transformers/trainer\`: transformers 5.19.0.dev0's Trainer, editable from $PWD/head" "$comment"
expect "(base: transformers 5.19.0.dev0's Trainer, editable from $PWD/repo" "$comment"
"$python" - out/base.json <<'PY' || failed=1
import json, sys
report = json.load(open(sys.argv[1]))
assert report["summary"]["unexpected"] == 0 and report["summary"]["rows"] == 2, report["summary"]
print("ok: the base passes its", report["summary"]["rows"], "rows")
PY
# The transformers judged was each side's checkout, not .venv's.
env-base/bin/python -c "import transformers; print(transformers.__file__)" > file.out
env-head/bin/python -c "import transformers; print(transformers.__file__)" >> file.out
expect "$PWD/repo/src/transformers/__init__.py" file.out
expect "$PWD/head/src/transformers/__init__.py" file.out
# The comment's reproduce command fails again in the head's environment.
reproduce=$(grep -o 'reproduce: `gradnorm run [^`]*`' "$comment" | head -1 | sed 's/^reproduce: `//; s/`$//')
[ -n "$reproduce" ] || { echo "FAIL: no reproduce command in $comment"; failed=1; }
# (the environment has gradnorm through the layer, without its console script: python -m)
(cd head && eval "$work/env-head/bin/python -m ${reproduce#gradnorm }" > ../reproduce.out 2>&1); rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: '$reproduce' exited $rc in the head, not 1"; cat reproduce.out; failed=1; }
exit $failed
