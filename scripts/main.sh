#!/usr/bin/env bash
# The main job: install what is missing, build, run the default scenario matrix and write
# its reports to build/report.{md,json,junit.xml,html}. Exit status is gradnorm's own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/tools/gradnorm run --markdown build/report.md --json build/report.json --junit build/report.junit.xml --html build/report.html "$@"
