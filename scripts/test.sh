#!/usr/bin/env bash
# Builds lstm-engine and runs the whole test suite (installs missing packages first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --deps-only
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
