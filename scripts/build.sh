#!/usr/bin/env bash
# Configures and builds gradnorm (and its tests) into ./build with Ninja.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -G Ninja -B build -S . -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build --parallel "$(nproc)"
