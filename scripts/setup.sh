#!/usr/bin/env bash
# Sets up a fresh Debian machine for lstm-engine, builds it and (unless --deps-only or
# --no-run) runs the default training job. Every dependency comes from Debian packages.
#   bash scripts/setup.sh             # install, build, run `lstm train`
#   bash scripts/setup.sh --deps-only # install the packages only
#   bash scripts/setup.sh --no-run    # install and build
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-run}
pkgs=(build-essential cmake pkg-config libopenblas-dev libopenblas0-openmp libdnnl-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev fortunes fortunes-min python3
      clang-14 libclang-rt-14-dev libomp-14-dev)  # clang: the fuzz targets (libFuzzer, its OpenMP)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The Python package's tests (scripts/test.sh python) need pytest and numpy besides torch; pip
# installs them when missing (torch itself is not installed here: it is large, and CI has it).
py_missing=()
for m in pytest numpy; do python3 -c "import $m" 2>/dev/null || py_missing+=("$m"); done
if ((${#py_missing[@]})); then
  echo "setup: pip installing ${py_missing[*]}"
  python3 -m pip install -q "${py_missing[@]}" || echo "setup: pip could not install ${py_missing[*]}; the python test part will say so"
fi
[ "$mode" = "--deps-only" ] && exit 0

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
[ "$mode" = "--no-run" ] && exit 0
exec ./build/lstm train
