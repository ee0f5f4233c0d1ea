#!/usr/bin/env bash
# Stages a build for the lent GPU machine: gpu-stage/build (the build tree without object files,
# binaries stripped; ctest runs from it) and gpu-stage/lib (the Debian shared libraries that
# machine lacks). Keep it under the 64 MiB the device tool carries.
#   bash scripts/stage_gpu.sh [BUILD_DIR]     (default: build)
# On the GPU machine: `source scripts/gpu_env.sh`, then run from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rm -rf gpu-stage/build gpu-stage/lib
mkdir -p gpu-stage/build gpu-stage/lib
(cd "$build" && tar cf - --exclude='*.o' --exclude='*.a' --exclude=Testing --exclude=CheckCUDA --exclude='3.*.*' .) |
  (cd gpu-stage/build && tar xf -)
find gpu-stage/build -type f -perm -u+x -exec sh -c 'file "$1" | grep -q ELF && strip "$1"' _ {} \;
# Absolute paths the build refers to (RUNPATH, ctest files); scripts/gpu_env.sh recreates them.
realpath . > gpu-stage/source_path
realpath "$build" > gpu-stage/build_path
# The commit the build came from (+dirty when the tree had uncommitted changes), for reports.
{ git rev-parse --short HEAD 2>/dev/null || echo unknown; } | tr -d '\n' > gpu-stage/source_commit
git diff --quiet HEAD 2>/dev/null || printf '+dirty' >> gpu-stage/source_commit
lib=/usr/lib/x86_64-linux-gnu
cp -L "$lib/openblas-openmp/libopenblas.so.0" "$lib/libgfortran.so.5" "$lib/libquadmath.so.0" "$lib/libgomp.so.1" gpu-stage/lib/
# oneDNN (the onednn CPU backend) when the build linked it.
if grep -q '^LSTM_HAVE_ONEDNN\|dnnl' "$build/CMakeCache.txt" 2>/dev/null && [[ -e $lib/libdnnl.so.2 ]]; then
  cp -L "$lib/libdnnl.so.2" "$lib/libOpenCL.so.1" gpu-stage/lib/
fi
du -sh gpu-stage
