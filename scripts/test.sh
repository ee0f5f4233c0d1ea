#!/usr/bin/env bash
# Parts are called by name (part_$name), which shellcheck cannot follow.
# shellcheck disable=SC2317
# Builds lstm-engine and runs the whole test suite (installs missing packages first). The suite
# has parts, each built in a folder of its own so that they never share objects:
#   default  build/      CUDA auto-detected (on where nvcc is found), Release; ctest
#   cpu      build-cpu/  -DLSTM_CUDA=OFF (what a machine without nvcc builds), Release; ctest.
#                        Skipped when the default part ran here and found no CUDA: the same build.
#   python   build-cpu/  (build/ when the default part ran without CUDA) the Python package
#                        (python/): pytest of python/tests against torch.nn.LSTM and the lstm
#                        program (GPU cases skip without a GPU), and a wheel built and imported
#                        offline with its bundled liblstm_c.so. Needs python3 with torch.
#   asan     build-asan/ -DLSTM_CUDA=OFF -DLSTM_SANITIZE=ON (GCC, ASan+UBSan, RelWithDebInfo;
#                        no benchmarks or examples); ctest. Any sanitizer report fails its test.
#   fuzz     build-fuzz/ scripts/fuzz.sh: clang, libFuzzer, ASan+UBSan; replays
#                        tests/fuzz/regressions/, then fuzzes each parser LSTM_FUZZ_SECONDS (60)
#                        from LSTM_FUZZ_SEED (1) (docs/FUZZING.md). Any finding fails the part.
#
#   bash scripts/test.sh              # every part, in the order above
#   bash scripts/test.sh cpu          # one part (or several: bash scripts/test.sh default cpu)
#   LSTM_TEST_PARTS="cpu" bash scripts/test.sh   # the same, for callers that pass no arguments
#
# Environment: LSTM_TEST_JOBS (build and ctest parallelism, default nproc); fuzz: scripts/fuzz.sh's.
# A failing part does not stop the others; the exit status is non-zero when any part failed.
# Each part's time is printed as it ends and again in the summary at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

ALL_PARTS=(default cpu python asan fuzz)
JOBS=${LSTM_TEST_JOBS:-$(nproc)}
if (($#)); then
  parts=("$@")
elif [[ -n "${LSTM_TEST_PARTS:-}" ]]; then
  read -r -a parts <<<"$LSTM_TEST_PARTS"
else
  parts=("${ALL_PARTS[@]}")
fi
for p in "${parts[@]}"; do
  [[ " ${ALL_PARTS[*]} " == *" $p "* ]] || { echo "test.sh: unknown part '$p' (parts: ${ALL_PARTS[*]})" >&2; exit 64; }
done

bash scripts/setup.sh --deps-only || exit 1

log() { echo "[test.sh $(date +%H:%M:%S)] $*"; }

# configure + build + ctest of one build folder; extra arguments go to cmake's configure step.
build_and_test() {
  local dir=$1
  shift
  cmake -S . -B "$dir" "$@" || return 1
  cmake --build "$dir" -j"$JOBS" || return 1
  ctest --test-dir "$dir" --output-on-failure --no-tests=error -j"$JOBS"
}

default_ran_without_cuda=0
part_default() {
  build_and_test build -DCMAKE_BUILD_TYPE=Release || return 1
  grep -q '^LSTM_CUDA:BOOL=OFF' build/CMakeCache.txt && default_ran_without_cuda=1
  return 0
}

part_cpu() {
  if ((default_ran_without_cuda)); then
    log "cpu: skipped, the default part found no CUDA compiler and built this configuration in build/"
    return 0
  fi
  build_and_test build-cpu -DCMAKE_BUILD_TYPE=Release -DLSTM_CUDA=OFF
}

part_python() {
  local dir=build-cpu
  if ((default_ran_without_cuda)); then
    dir=build
  elif [[ ! -f build-cpu/CMakeCache.txt ]]; then
    cmake -S . -B build-cpu -DCMAKE_BUILD_TYPE=Release -DLSTM_CUDA=OFF || return 1
  fi
  # A no-op after the cpu part (it built everything); alone, builds what the tests load and run.
  cmake --build "$dir" -j"$JOBS" --target lstm_c lstm_cli || return 1
  python3 -c 'import torch, numpy, pytest' || {
    log "python: needs python3 with torch, numpy and pytest (scripts/setup.sh --deps-only pip-installs numpy and pytest)"
    return 1
  }
  LSTM_ENGINE_LIB="$PWD/$dir/liblstm_c.so" LSTM_ENGINE_BIN="$PWD/$dir/lstm" PYTHONPATH="$PWD/python" \
    python3 -m pytest -q -rs -p no:cacheprovider python/tests || return 1
  # The installed route: a wheel built offline bundles the library and loads it from there.
  local tmp
  tmp=$(mktemp -d) || return 1
  LSTM_ENGINE_LIB="$PWD/$dir/liblstm_c.so" python3 -m pip wheel -q --no-build-isolation --no-index --no-deps \
    -w "$tmp/wheel" ./python &&
    python3 -m pip install -q --no-index --no-deps --target "$tmp/site" "$tmp"/wheel/*.whl &&
    (cd "$tmp" && env -u LSTM_ENGINE_LIB PYTHONPATH="$tmp/site" python3 -c '
import lstm_engine, torch
from lstm_engine.torch import LSTM
p = lstm_engine._lib.path()
assert p.endswith("site/lstm_engine/lib/liblstm_c.so"), p
out, _ = LSTM(3, 4)(torch.randn(5, 2, 3))
assert out.shape == (5, 2, 4)
print("python: the wheel loads its bundled", p)')
  local rc=$?
  rm -rf "$tmp" python/build python/lstm_engine.egg-info
  return "$rc"
}

part_asan() {
  # Reports abort the test that made them, with a stack; LeakSanitizer runs at each exit.
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1} \
    build_and_test build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLSTM_CUDA=OFF -DLSTM_SANITIZE=ON \
    -DLSTM_BUILD_BENCH=OFF -DLSTM_BUILD_EXAMPLES=OFF
}

part_fuzz() {
  # A fixed seed: every run of the suite explores the same inputs, so its result does not depend
  # on luck. Random, longer runs are for development (docs/FUZZING.md).
  LSTM_FUZZ_SEED=${LSTM_FUZZ_SEED:-1} bash scripts/fuzz.sh
}

summary=()
failed=0
for p in "${parts[@]}"; do
  log "== part $p"
  start=$SECONDS
  "part_$p"
  rc=$?
  took=$((SECONDS - start))
  status=$([[ $rc == 0 ]] && echo ok || echo "FAILED (exit $rc)")
  ((rc == 0)) || failed=1
  log "== part $p: $status in ${took}s"
  summary+=("$(printf '%-8s %6ss  %s' "$p" "$took" "$status")")
done
echo "test.sh summary (part, seconds, result):"
printf '  %s\n' "${summary[@]}"
exit "$failed"
