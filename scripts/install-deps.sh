#!/usr/bin/env bash
# Installs, from Debian 12's own packages, whatever gradnorm needs and this machine lacks.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev          # LibTorch 1.13 (CPU) and the headers its c10d needs
  libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev librapidcheck-dev
  python3-torch                     # PyTorch for /usr/bin/python3: Python steps run on it
  python3-dev pybind11-dev          # the embedded interpreter that runs Python steps
  python3-pytest                    # tests: the oracle-vector helper in a pytest suite
  libmimalloc-dev                   # the gradnorm executable's allocator (docs/design.md §8)
  libvalijson-dev                   # gradnorm validate-report: JSON Schema validation
  python3-jsonschema                # tests: a second, independent validator of the report schema
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
  echo "install-deps: every package is already installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
