#!/usr/bin/env bash
# Sections are called by name (section_$name), which shellcheck cannot follow.
# shellcheck disable=SC2317
# The machine check we run on the GPU machine: tests, then benchmarks against PyTorch, then a
# report. One command, one folder of results.
#
#   scripts/gpu_check.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR is a CMake build tree or an install prefix:
#   tests  - a build tree (BUILD_DIR/CTestTestfile.cmake) runs through ctest; otherwise the
#            GoogleTest executables test_* found in $LSTM_TEST_BIN_DIR, BUILD_DIR/tests or
#            BUILD_DIR/bin are run one by one with --gtest_output=xml.
#   bench  - bench_cpu_lstm is taken from $LSTM_BENCH_CPU, else BUILD_DIR/bench/bench_cpu_lstm,
#            else BUILD_DIR/libexec/lstm-engine/bench_cpu_lstm (an install with
#            -DLSTM_INSTALL_BENCH=ON), else BUILD_DIR/bin/bench_cpu_lstm (older installs);
#            bench_gpu_lstm likewise ($LSTM_BENCH_GPU).
# Sections (all run by default): tests, python (pytest of the Python package, python/tests: its
# GPU cases against torch.nn.LSTM, CUDA graphs, training loops; loads BUILD_DIR/liblstm_c.so),
# interop, cpu_bench, gpu_bench (GPU LSTM harness over bench/suites.json + torch.nn.LSTM on the
# GPU + gpu_report.py; bench/README.md).
# Opt-in section: python_bench (scripts/bench_python.py: lstm_engine.torch.LSTM against nn.LSTM,
# eager and graphed, latency/paper/throughput suites -> bench/python.jsonl; budget
# LSTM_PY_BENCH_BUDGET_S, default 420 s; LSTM_PY_BENCH_ARGS adds arguments).
# Opt-in section: sanitizer (compute-sanitizer over the GPU test executables: memcheck on every
# kernel, racecheck and synccheck on our own kernels; select it with LSTM_CHECK_SECTIONS, e.g.
# "tests sanitizer"; it is 10-100x slower than the tests alone, so trim it with the variables below).
# OUT_DIR receives:
#   ctest.xml (or gtest/*.xml), logs/*.log, bench/*.jsonl (one JSON row per case),
#   compare/*.json, report.d/*.md (fragments), *.png, gpu_results.json, results.json, report.md.
# Then, unless LSTM_CHECK_PACK=0, everything is packed into OUT_DIR/check.tar.gz and only
# check.tar.gz, report.md, results.json and at most 5 PNGs stay loose (at most 8 files: what the
# lent GPU machine sends back).
# The last line printed is a one-line summary.
# Exit status: 0 all passed; 1 tests failed or none were found; 2 tests passed (or were not
# selected) but another section failed, e.g. a benchmark crashed. A missed performance goal is
# reported, never an error.
#
# Environment (all optional):
#   LSTM_CHECK_SECTIONS       sections to run, in order (default "tests python interop cpu_bench gpu_bench")
#   LSTM_PYTEST_ARGS          extra pytest arguments for the python section, e.g. "-k cuda -x"
#   LSTM_CHECK_QUICK=1        benchmarks with --quick (smoke test of this script)
#   LSTM_CHECK_THREADS        CPU bench thread counts (default "2 N", N = min(16, nproc))
#   LSTM_CHECK_CPU_BENCH_ARGS extra arguments for both CPU benches, e.g. "--hidden 128 --layers 1"
#                             (both accept --hidden/--batch/--layers/--steps/--modes/--repeats/--warmup)
#   LSTM_CHECK_BENCH_TIMEOUT  seconds allowed per benchmark process (default 240); rows finished
#                             before the limit are kept
#   LSTM_CTEST_JOBS           ctest -j (default nproc/4, at least 1, at most 8)
#   LSTM_CTEST_ARGS           extra ctest arguments, e.g. "-R Lstm" or "-LE slow"
#   LSTM_TEST_BIN_DIR         folder of test_* executables (install-prefix mode)
#   LSTM_BENCH_CPU            path of bench_cpu_lstm
#   LSTM_CPU_BASELINE         context-only PyTorch CPU rows (default: shared/bench/pytorch_cpu_baseline.jsonl
#                             next to or above the repository, when present)
#   PYTHON                    python interpreter (default python3)
#   LSTM_CHECK_PACK=0         keep OUT_DIR as a tree (no check.tar.gz)
# gpu_bench (defaults sized so the section takes about 6 minutes on an H200):
#   LSTM_BENCH_GPU            path of bench_gpu_lstm
#   LSTM_GPU_SUITES_FILE      suites file (default bench/suites.json of this repository)
#   LSTM_GPU_SUITES / LSTM_GPU_DTYPES / LSTM_GPU_MODES   space-separated subsets (default all)
#   LSTM_GPU_REPEATS (10), LSTM_GPU_WARMUP (2)           per cell, both benches
#   LSTM_GPU_ROUNDS (1)       rounds of (ours, torch), alternating; the report keeps each cell's
#                             fastest round on both sides (bench/gpu_*_rN.jsonl for rounds >= 2)
#   LSTM_GPU_FIRST_ROUND (1)  number of the first round: rounds split over several runs (a device
#                             call's time limit) keep their own pads and file names; merge their
#                             bench/*.jsonl with gpu_report.py (ceilings and checks: round 1 only)
#   LSTM_GPU_PAD_STEP_MIB (6) round N runs both benches with --pad-mib (N-1) x this: each round's
#                             buffers land elsewhere in device memory, where the same cuDNN call
#                             ran up to 17% apart (docs/perf/log_2026-11-29_to_2026-12-01.md,
#                             fourth session)
#   LSTM_GPU_BENCH_BUDGET_S (210), LSTM_GPU_TORCH_BUDGET_S (100)   seconds of cells per bench;
#                             cells not started in time are recorded as "not run"
#   LSTM_GPU_MAX_CELL_S (0.5) cap per cell for an algorithm > 3x slower than the case's best
#   LSTM_GPU_COOLDOWN_MS (1000) both benches' --cooldown-ms: before a cell the GPU idles as long
#                             as the previous cell kept it busy, at most this long (0: never), so
#                             that no cell inherits a power-capped clock from the one before
#   LSTM_GPU_CHECK_SUITES     suites checked against the float64 CPU reference (default "paper")
#   LSTM_GPU_BENCH_ARGS / LSTM_GPU_TORCH_ARGS   extra arguments for bench_gpu_lstm / bench_gpu_torch.py
# sanitizer:
#   LSTM_COMPUTE_SANITIZER    path of compute-sanitizer (default: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)
#   LSTM_SANITIZER_TOOLS      tools to run, in order (default "memcheck racecheck synccheck")
#   LSTM_SANITIZER_TESTS      test executables (names or globs, default "test_gpu_*")
#   LSTM_SANITIZER_FILTER     --gtest_filter for them (default: every test)
#   LSTM_SANITIZER_OWN_KERNELS  compute-sanitizer --kernel-name filter for racecheck/synccheck
#                             (default kns=_ZN4lstm4cuda: the mangled prefix of namespace lstm::cuda)
#   LSTM_SANITIZER_TIMEOUT    seconds allowed per (tool, executable) run (default 900)
#   LSTM_SANITIZER_ARGS       extra compute-sanitizer arguments, e.g. "--leak-check full"
#
# Adding a section (e.g. a GPU bench): write section_<name>() below, which may write
# bench/<name>*.jsonl, compare/<name>.json, report.d/NN_<name>.md and *.png under $OUT, logs under
# $OUT/logs, and returns non-zero on a failure; then add <name> to the default section list.
# check_summary.py collects those files generically.
set -uo pipefail

if [[ $# -ne 2 ]]; then
  sed -n '4,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 64
fi

BUILD_DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "gpu_check: BUILD_DIR '$1' does not exist" >&2; exit 64; }
mkdir -p "$2" || exit 64
OUT=$(cd "$2" && pwd)
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
PYTHON=${PYTHON:-python3}
NPROC=$(nproc 2>/dev/null || echo 1)
BENCH_TIMEOUT=${LSTM_CHECK_BENCH_TIMEOUT:-240}
QUICK_FLAG=()
[[ "${LSTM_CHECK_QUICK:-0}" == 1 ]] && QUICK_FLAG=(--quick)

mkdir -p "$OUT/logs" "$OUT/bench" "$OUT/compare" "$OUT/report.d"
# Results of an earlier run in the same folder would be mistaken for this run's.
rm -f "$OUT/sections.tsv" "$OUT/ctest.xml" "$OUT/results.json" "$OUT/report.md" "$OUT"/*.png \
  "$OUT"/bench/*.jsonl "$OUT"/compare/*.json "$OUT"/report.d/*.md "$OUT/gpu_results.json" "$OUT/check.tar.gz"
rm -rf "$OUT/gtest"

log() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }
have_python() { command -v "$PYTHON" >/dev/null 2>&1; }
NOTE=""  # a section sets this to a short remark for the section table

# The folders test executables are looked for in, in order.
test_bin_dirs() {
  [[ -n "${LSTM_TEST_BIN_DIR:-}" ]] && echo "$LSTM_TEST_BIN_DIR"
  echo "$BUILD_DIR/tests"
  echo "$BUILD_DIR/bin"
}

# Prints, one per line, the executables matching the globs given, from the first folder of
# test_bin_dirs that has any.
find_test_bins() {
  local d pat f found=0
  while read -r d; do
    for pat in "$@"; do
      for f in "$d"/$pat; do
        [[ -f "$f" && -x "$f" ]] && { echo "$f"; found=1; }
      done
    done
    (( found )) && return 0
  done < <(test_bin_dirs)
  return 0
}

# ---------------------------------------------------------------------------------------------
# section: tests
# ---------------------------------------------------------------------------------------------
section_tests() {
  local ctest_dir=""
  if [[ -f "$BUILD_DIR/CTestTestfile.cmake" ]]; then
    ctest_dir=$BUILD_DIR
  fi
  if [[ -n "$ctest_dir" ]]; then
    local jobs=${LSTM_CTEST_JOBS:-$(( NPROC / 4 ))}
    (( jobs < 1 )) && jobs=1
    (( jobs > 8 )) && [[ -z "${LSTM_CTEST_JOBS:-}" ]] && jobs=8
    local extra=()
    [[ -n "${LSTM_CTEST_ARGS:-}" ]] && read -r -a extra <<<"$LSTM_CTEST_ARGS"
    log "ctest in $ctest_dir (-j $jobs)"
    # --no-tests=error: a build without tests must not pass as a clean run.
    ctest --test-dir "$ctest_dir" --output-on-failure --output-junit "$OUT/ctest.xml" \
      --no-tests=error -j "$jobs" "${extra[@]}" >"$OUT/logs/tests.log" 2>&1
    local rc=$?
    tail -n 5 "$OUT/logs/tests.log"
    NOTE="ctest exit $rc"
    write_tests_fragment
    return "$rc"
  fi

  local bins=()
  mapfile -t bins < <(find_test_bins "test_*")
  if (( ${#bins[@]} == 0 )); then
    NOTE="no tests found (no CTestTestfile.cmake, no test_* in $(test_bin_dirs))"
    log "$NOTE"
    write_tests_fragment
    return 1
  fi
  mkdir -p "$OUT/gtest"
  local rc=0 b name
  : >"$OUT/logs/tests.log"
  for b in "${bins[@]}"; do
    name=$(basename "$b")
    log "gtest $name"
    "$b" --gtest_output="xml:$OUT/gtest/$name.xml" >>"$OUT/logs/tests.log" 2>&1 || rc=1
  done
  NOTE="${#bins[@]} gtest executables from $(dirname "${bins[0]}")"
  write_tests_fragment
  return "$rc"
}

write_tests_fragment() {
  {
    echo "## Tests"
    echo
    echo "Log: logs/tests.log. Counts and failing test names are in results.json (tests)."
    if grep -q "tests passed\|tests failed" "$OUT/logs/tests.log" 2>/dev/null; then
      echo
      echo '```'
      grep -E "tests passed|tests failed|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run" "$OUT/logs/tests.log" | head -n 40
      echo '```'
    fi
  } >"$OUT/report.d/10_tests.md"
}

# ---------------------------------------------------------------------------------------------
# section: sanitizer (compute-sanitizer over the GPU tests; opt-in)
# ---------------------------------------------------------------------------------------------
find_compute_sanitizer() {
  local c
  for c in "${LSTM_COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
           "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -n "$c" && -x "$c" ]] && { echo "$c"; return 0; }
  done
  return 1
}

section_sanitizer() {
  local cs
  cs=$(find_compute_sanitizer) || {
    NOTE="compute-sanitizer not found (set LSTM_COMPUTE_SANITIZER)"
    log "$NOTE"
    return 1
  }
  local bins=() pats=()
  read -r -a pats <<<"${LSTM_SANITIZER_TESTS:-test_gpu_*}"
  mapfile -t bins < <(find_test_bins "${pats[@]}")
  if (( ${#bins[@]} == 0 )); then
    NOTE="no GPU test executables (${pats[*]}) in $(test_bin_dirs | tr '\n' ' ')"
    log "$NOTE"
    return 1
  fi
  local extra=() filter=()
  [[ -n "${LSTM_SANITIZER_ARGS:-}" ]] && read -r -a extra <<<"$LSTM_SANITIZER_ARGS"
  [[ -n "${LSTM_SANITIZER_FILTER:-}" ]] && filter=(--gtest_filter="$LSTM_SANITIZER_FILTER")
  local own=${LSTM_SANITIZER_OWN_KERNELS:-kns=_ZN4lstm4cuda} limit=${LSTM_SANITIZER_TIMEOUT:-900}
  # A distinct exit code tells a sanitizer report from a test that failed under the tool.
  local found=86 tool b name logf r rc=0 reports=0 failed=0 runs=0 summary
  mkdir -p "$OUT/logs/sanitizer"
  : >"$OUT/logs/sanitizer.log"
  for tool in ${LSTM_SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
    local scope=()
    case $tool in
      # Every kernel: an out-of-bounds access in cuDNN's kernels is ours when we passed the sizes.
      # API errors are left out: every CUDA call of ours is checked and throws, and the libraries
      # probe with calls that are meant to fail.
      memcheck) scope=(--report-api-errors no) ;;
      # Shared-memory races and barrier misuse: only kernels we wrote can be fixed here.
      racecheck | synccheck) scope=(--kernel-name "$own") ;;
      *) log "sanitizer: unknown tool '$tool' (memcheck, racecheck, synccheck, initcheck)"; rc=1; continue ;;
    esac
    for b in "${bins[@]}"; do
      name=$(basename "$b")
      logf="$OUT/logs/sanitizer/${tool}_$name.log"
      log "compute-sanitizer --tool $tool $name"
      runs=$((runs + 1))
      timeout "$limit" "$cs" --tool "$tool" "${scope[@]}" --target-processes all --error-exitcode "$found" \
        "${extra[@]}" "$b" "${filter[@]}" >"$logf" 2>&1
      r=$?
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logf" | tail -n 1)
      printf '%s %s: exit %d; %s\n' "$tool" "$name" "$r" "${summary:-no summary}" >>"$OUT/logs/sanitizer.log"
      case $r in
        0) ;;
        "$found") reports=$((reports + 1)); rc=1; log "$tool $name: REPORTS ($summary; logs/sanitizer/${tool}_$name.log)" ;;
        124) failed=$((failed + 1)); rc=1; log "$tool $name: time limit ${limit}s hit" ;;
        *) failed=$((failed + 1)); rc=1; log "$tool $name: exit $r, tests failed under the tool (logs/sanitizer/${tool}_$name.log)" ;;
      esac
    done
  done
  NOTE="$runs runs over ${#bins[@]} executables; $reports with sanitizer reports, $failed failed or timed out"
  {
    echo "## compute-sanitizer"
    echo
    echo "Tools: ${LSTM_SANITIZER_TOOLS:-memcheck racecheck synccheck} (racecheck/synccheck: $own). $NOTE."
    echo
    echo '```'
    cat "$OUT/logs/sanitizer.log"
    echo '```'
  } >"$OUT/report.d/15_sanitizer.md"
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
# section: cpu_bench (lstm-engine vs torch.nn.LSTM on the CPU)
# ---------------------------------------------------------------------------------------------
find_cpu_bench() {
  local c
  for c in "${LSTM_BENCH_CPU:-}" "$BUILD_DIR/bench/bench_cpu_lstm" "$BUILD_DIR/libexec/lstm-engine/bench_cpu_lstm" "$BUILD_DIR/bin/bench_cpu_lstm"; do
    [[ -n "$c" && -x "$c" ]] && { echo "$c"; return 0; }
  done
  return 1
}

cpu_thread_counts() {
  if [[ -n "${LSTM_CHECK_THREADS:-}" ]]; then
    echo "$LSTM_CHECK_THREADS"
    return
  fi
  local many=$(( NPROC < 16 ? NPROC : 16 ))
  if (( many <= 2 )); then echo "$many"; else echo "2 $many"; fi
}

section_cpu_bench() {
  local bench
  bench=$(find_cpu_bench) || {
    NOTE="bench_cpu_lstm not found (set LSTM_BENCH_CPU)"
    log "$NOTE"
    return 1
  }
  local torch_ok=0 rc=0 t
  if have_python && "$PYTHON" -c "import torch" >/dev/null 2>&1; then torch_ok=1; fi
  local ours_args=() torch_args=() case_args=() c
  [[ -n "${LSTM_CHECK_CPU_BENCH_ARGS:-}" ]] && read -r -a case_args <<<"$LSTM_CHECK_CPU_BENCH_ARGS"
  for t in $(cpu_thread_counts); do
    log "bench_cpu_lstm --threads $t"
    OMP_NUM_THREADS=$t timeout "$BENCH_TIMEOUT" "$bench" --threads "$t" "${QUICK_FLAG[@]}" "${case_args[@]}" \
      --json "$OUT/bench/cpu_ours_t$t.jsonl" >"$OUT/logs/cpu_ours_t$t.log" 2>&1
    local r=$?
    cat "$OUT/logs/cpu_ours_t$t.log"
    if (( r != 0 )); then
      rc=1
      log "bench_cpu_lstm --threads $t exited $r$( (( r == 124 )) && echo " (time limit ${BENCH_TIMEOUT}s)")"
    fi
    ours_args+=(--ours "$OUT/bench/cpu_ours_t$t.jsonl")
    if (( torch_ok )); then
      log "bench_cpu_torch.py --threads $t"
      OMP_NUM_THREADS=$t timeout "$BENCH_TIMEOUT" "$PYTHON" "$SCRIPT_DIR/bench_cpu_torch.py" --threads "$t" \
        "${QUICK_FLAG[@]}" "${case_args[@]}" --json "$OUT/bench/cpu_torch_t$t.jsonl" >"$OUT/logs/cpu_torch_t$t.log" 2>&1
      r=$?
      cat "$OUT/logs/cpu_torch_t$t.log"
      if (( r != 0 )); then
        rc=1
        log "bench_cpu_torch.py --threads $t exited $r"
      fi
      torch_args+=(--torch "$OUT/bench/cpu_torch_t$t.jsonl")
    fi
  done
  NOTE="threads $(cpu_thread_counts | tr ' ' ','); torch $( ((torch_ok)) && echo yes || echo 'not importable: no comparison')"

  local baseline=${LSTM_CPU_BASELINE:-}
  if [[ -z "$baseline" ]]; then
    for c in "$REPO_DIR/shared/bench/pytorch_cpu_baseline.jsonl" "$REPO_DIR/../shared/bench/pytorch_cpu_baseline.jsonl"; do
      [[ -f "$c" ]] && { baseline=$c; break; }
    done
  fi
  local base_args=()
  [[ -n "$baseline" && -f "$baseline" ]] && base_args=(--baseline "$baseline")

  if have_python; then
    {
      echo "## CPU LSTM: lstm-engine vs PyTorch"
      echo
      if ((${#QUICK_FLAG[@]})); then
        echo "fp32, T=100, input = hidden; --quick run: warm-up 1, median of 3 (not a measurement to quote)."
      else
        echo "fp32, T=100, input = hidden; warm-up 2, median of 7 (repeats per row in bench/*.jsonl)."
      fi
      echo "Goal: ours no slower than 1.5x torch at the same thread count. Plot: cpu_ratio.png."
      (( torch_ok )) || { echo; echo "torch was not importable by $PYTHON: no same-run comparison."; }
      echo
    } >"$OUT/report.d/20_cpu_bench.md"
    "$PYTHON" "$SCRIPT_DIR/compare_cpu.py" "${ours_args[@]}" "${torch_args[@]}" "${base_args[@]}" \
      --md "$OUT/compare/cpu_table.md" --png "$OUT/cpu_ratio.png" --json-out "$OUT/compare/cpu.json" \
      || rc=1
    cat "$OUT/compare/cpu_table.md" >>"$OUT/report.d/20_cpu_bench.md" 2>/dev/null
    rm -f "$OUT/compare/cpu_table.md"
  fi
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
# section: gpu_bench (our GPU LSTM algorithms vs torch.nn.LSTM on the GPU, over bench/suites.json)
# ---------------------------------------------------------------------------------------------
find_gpu_bench() {
  local c
  for c in "${LSTM_BENCH_GPU:-}" "$BUILD_DIR/bench/bench_gpu_lstm" "$BUILD_DIR/libexec/lstm-engine/bench_gpu_lstm" "$BUILD_DIR/bin/bench_gpu_lstm"; do
    [[ -n "$c" && -x "$c" ]] && { echo "$c"; return 0; }
  done
  return 1
}

section_gpu_bench() {
  local bench rc=0 r c
  bench=$(find_gpu_bench) || {
    NOTE="bench_gpu_lstm not found (set LSTM_BENCH_GPU)"
    log "$NOTE"
    return 1
  }
  local suites=${LSTM_GPU_SUITES_FILE:-$REPO_DIR/bench/suites.json}
  [[ -f "$suites" ]] || { NOTE="no suites file $suites"; log "$NOTE"; return 1; }
  # bench/suites.json is a copy of the shared suites; say so when they drifted apart.
  for c in "$REPO_DIR/shared/bench/suite.json" "$REPO_DIR/../shared/bench/suite.json"; do
    if [[ -f "$c" ]] && ! cmp -s "$c" "$suites"; then
      log "WARNING: $suites differs from $c: copy the shared file over"
    fi
  done
  local ours_budget=${LSTM_GPU_BENCH_BUDGET_S:-210} torch_budget=${LSTM_GPU_TORCH_BUDGET_S:-100}
  local common=(--suites-file "$suites" --cooldown-ms "${LSTM_GPU_COOLDOWN_MS:-1000}") cell=() s
  for s in ${LSTM_GPU_SUITES:-}; do common+=(--suite "$s"); done
  for s in ${LSTM_GPU_DTYPES:-}; do common+=(--dtype "$s"); done
  for s in ${LSTM_GPU_MODES:-}; do common+=(--mode "$s"); done
  # --quick keeps its own (smaller) repeat counts unless they are given.
  if ((${#QUICK_FLAG[@]})); then
    cell=("${QUICK_FLAG[@]}")
    [[ -n "${LSTM_GPU_REPEATS:-}" ]] && cell+=(--repeats "$LSTM_GPU_REPEATS")
    [[ -n "${LSTM_GPU_WARMUP:-}" ]] && cell+=(--warmup "$LSTM_GPU_WARMUP")
  else
    cell=(--repeats "${LSTM_GPU_REPEATS:-10}" --warmup "${LSTM_GPU_WARMUP:-2}")
  fi
  local ours_extra=() torch_extra=() checks=()
  [[ -n "${LSTM_GPU_BENCH_ARGS:-}" ]] && read -r -a ours_extra <<<"$LSTM_GPU_BENCH_ARGS"
  [[ -n "${LSTM_GPU_TORCH_ARGS:-}" ]] && read -r -a torch_extra <<<"$LSTM_GPU_TORCH_ARGS"
  for s in ${LSTM_GPU_CHECK_SUITES-paper}; do checks+=(--check-suite "$s"); done

  local ins=() torch_ok=0 gpu_note="" rounds=${LSTM_GPU_ROUNDS:-1} first=${LSTM_GPU_FIRST_ROUND:-1} round sfx hard pad_step=${LSTM_GPU_PAD_STEP_MIB:-6} pad
  if have_python && "$PYTHON" -c "import torch" >/dev/null 2>&1; then torch_ok=1; fi
  [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { NOTE="LSTM_GPU_ROUNDS must be a positive integer, got '$rounds'"; log "$NOTE"; return 1; }
  [[ "$first" =~ ^[1-9][0-9]*$ ]] || { NOTE="LSTM_GPU_FIRST_ROUND must be a positive integer, got '$first'"; log "$NOTE"; return 1; }
  [[ "$pad_step" =~ ^[0-9]+$ ]] || { NOTE="LSTM_GPU_PAD_STEP_MIB must be a whole number of MiB, got '$pad_step'"; log "$NOTE"; return 1; }
  # Rounds alternate ours and torch, so that a slow spell of the machine (clocks, host jitter in
  # launch-bound cases) reaches both sides alike; the report keeps each cell's fastest round.
  local last=$(( first + rounds - 1 ))
  for (( round = first; round <= last; round++ )); do
    sfx=""; (( round > 1 )) && sfx="_r$round"
    pad=$(( (round - 1) * pad_step ))
    log "bench_gpu_lstm round $round/$last (cells budget ${ours_budget}s, --pad-mib $pad)"
    # The hard limit leaves room for the ceilings, the CPU reference checks and the last cell.
    hard=$(( ${ours_budget%.*} > 0 ? ${ours_budget%.*} + 120 : 0 ))  # timeout 0: no limit
    local round_args=("${checks[@]}")
    (( round > 1 )) && round_args=(--no-ceilings)  # ceilings and checks once
    timeout "$hard" "$bench" "${common[@]}" "${cell[@]}" --budget-s "$ours_budget" \
      --max-cell-s "${LSTM_GPU_MAX_CELL_S:-0.5}" --pad-mib "$pad" "${round_args[@]}" "${ours_extra[@]}" \
      --out "$OUT/bench/gpu_ours$sfx.jsonl" >"$OUT/logs/gpu_ours$sfx.log" 2>&1
    r=$?
    grep -E "^ceiling|^bench_gpu_lstm" "$OUT/logs/gpu_ours$sfx.log" | tail -n 8
    case $r in
      0) ;;
      3) rc=1; log "bench_gpu_lstm: a correctness check against the CPU reference FAILED (logs/gpu_ours$sfx.log)" ;;
      124) rc=1; log "bench_gpu_lstm: hard time limit hit; rows finished before it are kept" ;;
      *) rc=1; log "bench_gpu_lstm exited $r (logs/gpu_ours$sfx.log)" ;;
    esac
    if head -n 1 "$OUT/bench/gpu_ours$sfx.jsonl" 2>/dev/null | grep -q '"error"'; then
      # A GPU check without a GPU is a failed check, not a pass with nothing in it.
      gpu_note="no GPU: $(head -n 1 "$OUT/logs/gpu_ours$sfx.log")"
      rc=1
    fi
    ins+=(--in "$OUT/bench/gpu_ours$sfx.jsonl")

    if (( torch_ok )); then
      log "bench_gpu_torch.py round $round/$last (cells budget ${torch_budget}s, --pad-mib $pad)"
      hard=$(( ${torch_budget%.*} > 0 ? ${torch_budget%.*} + 90 : 0 ))
      PYTHONUNBUFFERED=1 timeout "$hard" "$PYTHON" "$SCRIPT_DIR/bench_gpu_torch.py" \
        "${common[@]}" "${cell[@]}" --budget-s "$torch_budget" --pad-mib "$pad" "${torch_extra[@]}" \
        --out "$OUT/bench/gpu_torch$sfx.jsonl" >"$OUT/logs/gpu_torch$sfx.log" 2>&1
      r=$?
      tail -n 1 "$OUT/logs/gpu_torch$sfx.log"
      if (( r != 0 )); then
        rc=1
        log "bench_gpu_torch.py exited $r (logs/gpu_torch$sfx.log)"
      fi
      ins+=(--in "$OUT/bench/gpu_torch$sfx.jsonl")
    elif (( round == first )); then
      log "torch is not importable by $PYTHON: no same-run PyTorch comparison"
    fi
  done

  if have_python; then
    "$PYTHON" "$SCRIPT_DIR/gpu_report.py" "${ins[@]}" --suites-file "$suites" --json "$OUT/gpu_results.json" \
      --md "$OUT/report.d/30_gpu_bench.md" --png-dir "$OUT" >"$OUT/logs/gpu_report.log" 2>&1 || rc=1
    grep -E "^(FAIL|MISSING)" "$OUT/logs/gpu_report.log" | head -n 20
    tail -n 1 "$OUT/logs/gpu_report.log"
    NOTE="$(tail -n 1 "$OUT/logs/gpu_report.log" | sed 's/^gpu_report: //')"
  else
    NOTE="no $PYTHON: JSON lines only (bench/gpu_ours.jsonl)"
  fi
  (( torch_ok )) || NOTE="$NOTE; torch not importable"
  [[ -n "$gpu_note" ]] && NOTE="$gpu_note; $NOTE"
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
# section: interop (ours -> PyTorch: strict state_dict load, nn.LSTM equals `lstm forward`)
# ---------------------------------------------------------------------------------------------
section_interop() {
  local bin=""
  for c in "${LSTM_CLI:-}" "$BUILD_DIR/lstm" "$BUILD_DIR/bin/lstm"; do
    [[ -n "$c" && -x "$c" ]] && { bin=$c; break; }
  done
  [[ -n "$bin" ]] || { NOTE="no lstm program found"; return 1; }
  have_python && "$PYTHON" -c 'import torch, safetensors' 2>/dev/null || { NOTE="no torch/safetensors"; return 1; }
  "$PYTHON" "$SCRIPT_DIR/check_torch_interop.py" "$bin" --work "$OUT/logs/interop" 2>&1 | tee "$OUT/logs/interop.log"
  local rc=${PIPESTATUS[0]}
  NOTE=$(tail -n 1 "$OUT/logs/interop.log")
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
# section: python (the Python package's tests; the GPU cases run here)
# ---------------------------------------------------------------------------------------------
python_env() {
  # The build's C API library and lstm program; the package from the source tree (no install).
  env LSTM_ENGINE_LIB="$BUILD_DIR/liblstm_c.so" LSTM_ENGINE_BIN="$BUILD_DIR/lstm" \
    PYTHONPATH="$REPO_DIR/python${PYTHONPATH:+:$PYTHONPATH}" "$@"
}

section_python() {
  [[ -f "$BUILD_DIR/liblstm_c.so" ]] || { NOTE="no $BUILD_DIR/liblstm_c.so"; return 1; }
  if ! have_python || ! "$PYTHON" -c 'import torch, numpy, pytest' 2>/dev/null; then
    NOTE="no torch/numpy/pytest"
    return 1
  fi
  # shellcheck disable=SC2086
  python_env "$PYTHON" -m pytest -q -rs -p no:cacheprovider --junitxml="$OUT/logs/python.xml" \
    ${LSTM_PYTEST_ARGS:-} "$REPO_DIR/python/tests" 2>&1 | tee "$OUT/logs/python.log"
  local rc=${PIPESTATUS[0]}
  NOTE=$(grep -E '^[0-9]+ (passed|failed)|[0-9]+ (passed|failed).* in ' "$OUT/logs/python.log" | tail -n 1)
  return "$rc"
}

section_python_bench() {
  [[ -f "$BUILD_DIR/liblstm_c.so" ]] || { NOTE="no $BUILD_DIR/liblstm_c.so"; return 1; }
  have_python || { NOTE="no $PYTHON"; return 1; }
  # shellcheck disable=SC2086
  python_env "$PYTHON" "$REPO_DIR/scripts/bench_python.py" --out "$OUT/bench/python.jsonl" \
    --budget-s "${LSTM_PY_BENCH_BUDGET_S:-420}" "${QUICK_FLAG[@]}" ${LSTM_PY_BENCH_ARGS:-} 2>&1 |
    tee "$OUT/logs/python_bench.log"
  local rc=${PIPESTATUS[0]}
  NOTE="$(grep -c '"kind": "result"' "$OUT/bench/python.jsonl" 2>/dev/null || echo 0) rows in bench/python.jsonl"
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------
run_section() {
  local name=$1 start rc
  if ! declare -F "section_$name" >/dev/null; then
    log "unknown section '$name'"
    printf '%s\t%d\t%d\t%s\n' "$name" 127 0 "unknown section" >>"$OUT/sections.tsv"
    return
  fi
  log "== section $name"
  NOTE=""
  start=$(date +%s)
  "section_$name"
  rc=$?
  printf '%s\t%d\t%d\t%s\n' "$name" "$rc" $(( $(date +%s) - start )) "${NOTE//$'\t'/ }" >>"$OUT/sections.tsv"
  log "== section $name: exit $rc ($(( $(date +%s) - start ))s)"
}

# The commit the staged build was made from (scripts/stage_gpu.sh records it): the GPU machine's
# copy of the tree may carry another .git HEAD than the files it holds.
if [ -z "${LSTM_CHECK_GIT_COMMIT:-}" ] && [ -f "$REPO_DIR/gpu-stage/source_commit" ]; then
  LSTM_CHECK_GIT_COMMIT=$(cat "$REPO_DIR/gpu-stage/source_commit")
fi
export LSTM_CHECK_GIT_COMMIT=${LSTM_CHECK_GIT_COMMIT:-$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || true)}
# The machine as the driver reports it (the benches record only the CUDA driver API version):
# the driver's full version, clocks and power limit, for the report's header.
write_machine() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  local q
  q=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit \
        --format=csv 2>/dev/null) || return 0
  nvidia-smi >"$OUT/logs/nvidia-smi.txt" 2>&1 || true
  {
    echo "## Machine"
    echo
    echo "nvidia-smi at $(date -u +%Y-%m-%dT%H:%M:%SZ):"
    echo
    echo '```'
    echo "$q"
    echo '```'
    echo
  } >"$OUT/report.d/05_machine.md"
}
write_machine
for s in ${LSTM_CHECK_SECTIONS:-tests python interop cpu_bench gpu_bench}; do
  run_section "$s"
done

# Packs OUT into check.tar.gz, leaving report.md, results.json and at most 5 PNGs beside it: the
# lent GPU machine sends back at most 8 files.
pack_out() {
  [[ "${LSTM_CHECK_PACK:-1}" == 0 ]] && return 0
  local tmp
  tmp=$(mktemp "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || return 0
  if ! tar -czf "$tmp" -C "$OUT" . 2>/dev/null; then
    log "packing $OUT failed; the tree is left as it is"
    rm -f "$tmp"
    return 0
  fi
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name report.md ! -name results.json ! -name '*.png' -exec rm -rf {} +
  find "$OUT" -mindepth 1 -maxdepth 1 -name '*.png' | sort | tail -n +6 | while read -r f; do rm -f "$f"; done
  mv "$tmp" "$OUT/check.tar.gz"
  chmod 644 "$OUT/check.tar.gz"
  echo "gpu_check: packed into $OUT/check.tar.gz (tar xzf it for logs/, bench/*.jsonl, gpu_results.json, ...)"
}

if have_python; then
  # The summary line is printed last, after packing.
  summary=$("$PYTHON" "$SCRIPT_DIR/check_summary.py" "$OUT")
  status=$?
  pack_out
  echo "$summary"
  exit "$status"
fi
# Without python: no results.json; decide from the section table alone.
tests_rc=$(awk -F'\t' '$1=="tests"{print $2}' "$OUT/sections.tsv")
others_bad=$(awk -F'\t' '$1!="tests" && $2!=0' "$OUT/sections.tsv" | wc -l)
pack_out
echo "gpu_check: no $PYTHON, so no results.json/report.md; tests exit ${tests_rc:-not run}; $others_bad other section(s) failed"
[[ -z "$tests_rc" || "$tests_rc" == 0 ]] || exit 1
(( others_bad == 0 )) || exit 2
exit 0
