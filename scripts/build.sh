#!/usr/bin/env bash
# Configures and builds gradnorm (its executable, its Python package's module and its tests) into
# ./build with Ninja, then installs the Python package into .venv from that same build:
# `pip install --no-build-isolation .` (setup.py) takes build/ when it was made for the same
# torch and Python, so the install costs seconds and .venv has the gradnorm command and the
# pytest plugin (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -G Ninja -B build -S . -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build --parallel "$(nproc)"
if [ -x .venv/bin/python ]; then
  # --no-deps: .venv holds requirements.txt's pins, the package's torch and pytest among them.
  GRADNORM_BUILD_DIR=build .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation \
    --disable-pip-version-check --no-compile .
fi
