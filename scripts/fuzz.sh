#!/usr/bin/env bash
# Builds the parsers' fuzz targets (clang, libFuzzer, ASan+UBSan; tests/fuzz) and runs each for a
# bounded time. docs/FUZZING.md says what each target covers and how to turn a finding into a
# regression input.
#
#   bash scripts/fuzz.sh                      # every target, LSTM_FUZZ_SECONDS each
#   bash scripts/fuzz.sh safetensors csv      # some targets
#
# Per target, in this order (a failure stops that target; the others still run):
#   1. replay: every file in tests/fuzz/regressions/<target>/ is run once (inputs that once
#      crashed a parser; each must now pass);
#   2. fuzz: LSTM_FUZZ_SECONDS of libFuzzer from the seeds in tests/fuzz/corpus/<target>/ (and the
#      regression inputs; for safetensors also tests/fixtures/), with tests/fuzz/<target>.dict
#      where there is one; new coverage goes to BUILD_DIR/corpus/<target>/, never into the
#      repository.
# A finding (crash, sanitizer report, an exception other than lstm::Error, leak, timeout, out of
# memory) fails the run; the input is saved under FINDINGS/<target>/ and its path, size and a
# replay command are printed, with libFuzzer's report, in the log.
#
# Environment (all optional):
#   LSTM_FUZZ_SECONDS   seconds of fuzzing per target (default 60; 0: replay and seeds only)
#   LSTM_FUZZ_JOBS      targets fuzzed at once (default nproc)
#   LSTM_FUZZ_BUILD     build folder (default build-fuzz)
#   LSTM_FUZZ_FINDINGS  where findings are saved (default BUILD_DIR/findings)
#   LSTM_FUZZ_CXX       clang++ to build with (default: clang++-14, else clang++)
#   LSTM_FUZZ_SEED      libFuzzer's -seed (default: a random one each run); scripts/test.sh's fuzz
#                       part fixes it so that CI explores the same inputs on every run
#   LSTM_FUZZ_ARGS      extra libFuzzer arguments for the fuzzing step, e.g. "-max_len=4096"
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

ALL_TARGETS=(safetensors config csv corpus)
SECONDS_EACH=${LSTM_FUZZ_SECONDS:-60}
JOBS=${LSTM_FUZZ_JOBS:-$(nproc)}
BUILD=${LSTM_FUZZ_BUILD:-build-fuzz}
targets=("$@")
((${#targets[@]})) || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (targets: ${ALL_TARGETS[*]})" >&2; exit 64; }
done
[[ "$SECONDS_EACH" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: LSTM_FUZZ_SECONDS must be a whole number, got '$SECONDS_EACH'" >&2; exit 64; }
SEED=${LSTM_FUZZ_SEED:-}
[[ -z "$SEED" || "$SEED" =~ ^[1-9][0-9]{0,8}$ ]] || { echo "fuzz.sh: LSTM_FUZZ_SEED must be a whole number in [1, 999999999], got '$SEED'" >&2; exit 64; }

log() { echo "[fuzz.sh $(date +%H:%M:%S)] $*"; }

CXX_FUZZ=${LSTM_FUZZ_CXX:-}
if [[ -z "$CXX_FUZZ" ]]; then
  for c in clang++-14 clang++; do command -v "$c" >/dev/null 2>&1 && { CXX_FUZZ=$c; break; }; done
fi
[[ -n "$CXX_FUZZ" ]] || { echo "fuzz.sh: no clang++ (bash scripts/setup.sh --deps-only installs it)" >&2; exit 1; }

# Only the library and the fuzz targets: the tests run in the other parts of scripts/test.sh.
# Static: one instrumented binary per target, nothing to find at run time.
log "building $BUILD with $CXX_FUZZ"
cmake -S . -B "$BUILD" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLSTM_CUDA=OFF \
  -DLSTM_FUZZ=ON -DLSTM_SHARED=OFF -DLSTM_BUILD_TESTS=OFF -DLSTM_BUILD_BENCH=OFF -DLSTM_BUILD_EXAMPLES=OFF >/dev/null || exit 1
fuzz_bins=()
for t in "${targets[@]}"; do fuzz_bins+=("fuzz_$t"); done
cmake --build "$BUILD" -j"$(nproc)" --target "${fuzz_bins[@]}" || exit 1

BUILD=$(cd "$BUILD" && pwd)
FINDINGS=${LSTM_FUZZ_FINDINGS:-$BUILD/findings}
mkdir -p "$FINDINGS" "$BUILD/logs"
FINDINGS=$(cd "$FINDINGS" && pwd)
extra=()
[[ -n "$SEED" ]] && extra+=(-seed="$SEED")
[[ -n "${LSTM_FUZZ_ARGS:-}" ]] && read -r -a more <<<"$LSTM_FUZZ_ARGS" && extra+=("${more[@]}")
# UB aborts (-fno-sanitize-recover); its report needs the stack to be useful.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# -timeout: a parser that takes 10 s on one small input is stuck. -rss_limit_mb (libFuzzer's
# default 2048, written out): memory a header's claims make us allocate is a finding too.
common=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)

# Runs one target (replay, then fuzz); its output goes to $BUILD/logs/<target>.log.
run_target() {
  local t=$1 bin="$BUILD/tests/fuzz/fuzz_$1" seeds="tests/fuzz/corpus/$1" regress="tests/fuzz/regressions/$1"
  local work="$BUILD/corpus/$t" out="$FINDINGS/$t/" tmp="$BUILD/tmp/$t" f
  mkdir -p "$work" "$out" "$tmp"
  rm -rf "${tmp:?}"/*
  local replay=()
  if [[ -d "$regress" ]]; then
    for f in "$regress"/*; do [[ -f "$f" && "$(basename "$f")" != README* ]] && replay+=("$f"); done
  fi
  if ((${#replay[@]})); then
    echo "replay: ${#replay[@]} regression inputs from $regress"
    TMPDIR=$tmp "$bin" "${common[@]}" -artifact_prefix="$out" "${replay[@]}" || return 1
  fi
  local dict=()
  [[ -f "tests/fuzz/$t.dict" ]] && dict=(-dict="tests/fuzz/$t.dict")
  local dirs=("$work" "$seeds")
  ((${#replay[@]})) && dirs+=("$regress")
  [[ "$t" == safetensors ]] && dirs+=(tests/fixtures)
  echo "fuzz: ${SECONDS_EACH}s from ${dirs[*]:1}"
  # libFuzzer reads -max_total_time=0 as "no limit": 0 seconds runs the seeds once (-runs=0).
  local budget=(-max_total_time="$SECONDS_EACH")
  ((SECONDS_EACH == 0)) && budget=(-runs=0)
  TMPDIR=$tmp "$bin" "${common[@]}" "${dict[@]}" "${budget[@]}" -artifact_prefix="$out" \
    "${extra[@]}" "${dirs[@]}"
}

# Prints what a failed target left: the report's head and every input saved for it.
report_finding() {
  local t=$1 logf="$BUILD/logs/$1.log" f
  log "$t: FINDING (full log: $logf)"
  grep -m1 -B2 -A40 -E "^==[0-9]+==ERROR|runtime error:|^==[0-9]+== ERROR|deadly signal|uncaught exception|terminate called|out-of-memory|timeout after|^SUMMARY" "$logf" \
    | head -n 60
  # Only this run's: the folder keeps earlier runs' inputs too.
  find "$FINDINGS/$t" -type f -newer "$BUILD/logs/.start" | while read -r f; do
    echo "  saved input: $f ($(stat -c %s "$f") bytes); replay: $BUILD/tests/fuzz/fuzz_$t $f"
  done
}

touch "$BUILD/logs/.start"
log "targets: ${targets[*]}; ${SECONDS_EACH}s each, $JOBS at a time, seed ${SEED:-random}; findings go to $FINDINGS"
failed=()
running=0
start=$SECONDS
for t in "${targets[@]}"; do
  if ((running >= JOBS)); then
    wait -n
    running=$((running - 1))
  fi
  rm -f "$BUILD/logs/$t.rc"
  (run_target "$t"; echo $? >"$BUILD/logs/$t.rc") >"$BUILD/logs/$t.log" 2>&1 &
  running=$((running + 1))
done
wait
for t in "${targets[@]}"; do
  if [[ "$(cat "$BUILD/logs/$t.rc" 2>/dev/null)" == 0 ]]; then
    log "$t: ok ($(grep -o 'stat::number_of_executed_units: [0-9]*' "$BUILD/logs/$t.log" | tail -n 1 | grep -o '[0-9]*$' || echo '?') runs)"
  else
    failed+=("$t")
    report_finding "$t"
  fi
done
log "done in $((SECONDS - start))s; $(( ${#targets[@]} - ${#failed[@]} )) of ${#targets[@]} targets clean${failed:+; findings in: ${failed[*]}}"
((${#failed[@]} == 0))
