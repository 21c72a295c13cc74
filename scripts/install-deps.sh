#!/usr/bin/env bash
# Installs whatever gradnorm needs and this machine lacks: the C++ libraries and tools from
# Debian 12's own packages, and the Python environment (.venv, or $GRADNORM_VENV) with the
# packages requirements.txt pins, torch 2.13.0 among them, whose wheel is also the LibTorch
# the C++ side builds against (docs/design.md §5).
# --system-only: the Debian packages alone (what a pip install of gradnorm into an environment
# of one's own needs; docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
system_only=0
if [ "${1:-}" = "--system-only" ]; then system_only=1; fi

packages=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev librapidcheck-dev
  python3.11 python3.11-venv libpython3.11-dev  # the environment's Python: its shared libpython
                                                # is what the embedded interpreter links
  libmimalloc-dev                   # the gradnorm executable's allocator (docs/design.md §8)
  libvalijson-dev                   # gradnorm validate-report: JSON Schema validation
  clang libclang-rt-14-dev          # tests: the scenario-file parser under libFuzzer (fuzz/)
  slurmd slurmctld slurm-client munge  # tests: ranks under a single-node Slurm on localhost
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: every Debian package is already installed"
else
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$system_only" -eq 1 ]; then exit 0; fi

# The environment is made from Debian's python3.11, never from whatever python3 is first on
# PATH: the embedded interpreter needs the shared libpython that libpython3.11-dev provides.
venv=${GRADNORM_VENV:-$PWD/.venv}
stamp="$venv/gradnorm-requirements.txt"
if [ -x "$venv/bin/python" ] && cmp -s requirements.txt "$stamp"; then
  echo "install-deps: $venv already holds requirements.txt"
else
  if [ ! -x "$venv/bin/python" ]; then
    /usr/bin/python3.11 -m venv "$venv"
  fi
  # Every package is pinned, dependencies included, so --no-deps keeps pip from resolving
  # anything the file does not name (an unpinned torch would be a CUDA build of several GB);
  # pip check then proves the pins are complete and consistent.
  "$venv/bin/python" -m pip install --quiet --no-deps --disable-pip-version-check -r requirements.txt
  "$venv/bin/python" -m pip check
  cp requirements.txt "$stamp"
  echo "install-deps: $venv holds requirements.txt ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
fi

# DeepSpeed (requirements-deepspeed.txt): PyPI has it as a source distribution only, whose
# setup.py imports torch, so it is built in the environment itself (--no-build-isolation), with
# DS_BUILD_OPS=0: no op is compiled, the package is pure Python.
ds_stamp="$venv/gradnorm-requirements-deepspeed.txt"
if cmp -s requirements-deepspeed.txt "$ds_stamp"; then
  echo "install-deps: $venv already holds requirements-deepspeed.txt"
else
  DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$venv/bin/python" -m pip install --quiet --no-deps \
    --no-build-isolation --use-pep517 --disable-pip-version-check -r requirements-deepspeed.txt
  "$venv/bin/python" -m pip check
  DS_ACCELERATOR=cpu "$venv/bin/python" -c '
import deepspeed
from deepspeed.accelerator import get_accelerator
assert deepspeed.__version__ == "0.19.8", deepspeed.__version__
print("install-deps: deepspeed", deepspeed.__version__, "on", get_accelerator().device_name())'
  cp requirements-deepspeed.txt "$ds_stamp"
fi

# Overlays: a few packages in a folder of their own inside the environment, put first on
# PYTHONPATH by the runs that judge them (each requirements file says why), before the
# overlay they stand beside, if any. pip check cannot see a --target folder, so two checks
# stand in for it: every requirement of every package in the folder (its metadata's
# Requires-Dist, extras aside, markers evaluated) is met by what that PYTHONPATH imports, and
# an import check loads the overlay's pins beside the environment's other packages. A stamp
# file records which pins the folder holds.
overlay_requirements_met='
import importlib.metadata as metadata, sys
from packaging.requirements import Requirement
unmet = []
for dist in metadata.distributions(path=[sys.argv[1]]):
    for text in dist.requires or []:
        need = Requirement(text)
        if need.marker is not None and not need.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(need.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not need.specifier.contains(have, prereleases=True):
            unmet.append("%s %s needs %s, has %s" % (dist.metadata["Name"], dist.version,
                                                      need, have or "none"))
if unmet:
    sys.exit("install-deps: " + sys.argv[1] + ": unmet requirements:\n  " + "\n  ".join(unmet))
'
install_overlay() {  # install_overlay FOLDER REQUIREMENTS CHECK-PROGRAM [BESIDE-FOLDER]
  local overlay="$venv/$1" requirements=$2 check=$3 path="$venv/$1"
  if [ -n "${4:-}" ]; then path="$overlay:$venv/$4"; fi
  if cmp -s "$requirements" "$overlay/gradnorm-requirements.txt"; then
    echo "install-deps: $overlay already holds $requirements"
    return
  fi
  rm -rf "$overlay"
  "$venv/bin/python" -m pip install --quiet --no-deps --disable-pip-version-check \
    --target "$overlay" -r "$requirements"
  PYTHONPATH="$path" "$venv/bin/python" -c "$overlay_requirements_met" "$overlay"
  PYTHONPATH="$path" "$venv/bin/python" -c "$check"
  cp "$requirements" "$overlay/gradnorm-requirements.txt"
}

install_overlay transformers-4.57.6 requirements-transformers4.txt '
import transformers, accelerate, huggingface_hub
assert transformers.__version__ == "4.57.6", transformers.__version__
from transformers import Trainer, LlamaForCausalLM  # noqa: F401
print("install-deps: transformers", transformers.__version__, "with huggingface_hub",
      huggingface_hub.__version__, "and accelerate", accelerate.__version__)'

install_overlay transformers-5.17.0 requirements-transformers517.txt '
import transformers, accelerate, huggingface_hub
assert transformers.__version__ == "5.17.0", transformers.__version__
from transformers import Trainer, LlamaForCausalLM  # noqa: F401
print("install-deps: transformers", transformers.__version__, "with huggingface_hub",
      huggingface_hub.__version__, "and accelerate", accelerate.__version__)'

trl_imports='
import warnings
warnings.filterwarnings("ignore")  # torchao 0.15 warns that its C++ extensions do not match
import trl, datasets, pyarrow, transformers
assert trl.__version__ == "1.16.0", trl.__version__
from trl import SFTTrainer, SFTConfig  # noqa: F401
print("install-deps: trl", trl.__version__, "with datasets", datasets.__version__,
      "pyarrow", pyarrow.__version__, "and transformers", transformers.__version__)
'
install_overlay trl-1.16.0 requirements-trl.txt "$trl_imports"

# TRL 1.16.0 beside transformers 4.57.6: after install_overlay transformers-4.57.6, which it
# stands beside.
install_overlay trl-1.16.0-transformers-4.57.6 requirements-trl-transformers4.txt "$trl_imports
assert transformers.__version__ == \"4.57.6\", transformers.__version__" transformers-4.57.6

install_overlay lightning-2.5.6 requirements-lightning25.txt '
import warnings
warnings.filterwarnings("ignore")
import lightning, pytorch_lightning
assert lightning.__version__ == "2.5.6", lightning.__version__
assert pytorch_lightning.__version__ == "2.5.6", pytorch_lightning.__version__
from lightning.pytorch import Trainer  # noqa: F401
from lightning.fabric import Fabric  # noqa: F401
print("install-deps: lightning", lightning.__version__)'

# litgpt beside transformers 4.57.6 (requirements-litgpt.txt says why): after install_overlay
# transformers-4.57.6, which it stands beside.
install_overlay litgpt-0.5.13 requirements-litgpt.txt '
import warnings
warnings.filterwarnings("ignore")
import litgpt, jsonargparse, huggingface_hub
import importlib.metadata as metadata
assert metadata.version("litgpt") == "0.5.13", metadata.version("litgpt")
from litgpt.finetune import full  # noqa: F401
print("install-deps: litgpt", metadata.version("litgpt"), "with jsonargparse", jsonargparse.__version__,
      "and huggingface_hub", huggingface_hub.__version__)' transformers-4.57.6
