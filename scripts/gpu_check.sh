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
#            else BUILD_DIR/bin/bench_cpu_lstm.
# OUT_DIR receives:
#   ctest.xml (or gtest/*.xml), logs/*.log, bench/*.jsonl (one JSON row per case),
#   compare/*.json, report.d/*.md (fragments), *.png, results.json, report.md.
# The last line printed is a one-line summary.
# Exit status: 0 all passed; 1 tests failed or none were found; 2 tests passed (or were not
# selected) but another section failed, e.g. a benchmark crashed. A missed performance goal is
# reported, never an error.
#
# Environment (all optional):
#   LSTM_CHECK_SECTIONS       sections to run, in order (default "tests interop cpu_bench")
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
  "$OUT"/bench/*.jsonl "$OUT"/compare/*.json "$OUT"/report.d/*.md
rm -rf "$OUT/gtest"

log() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }
have_python() { command -v "$PYTHON" >/dev/null 2>&1; }
NOTE=""  # a section sets this to a short remark for the section table

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

  local dirs=()
  [[ -n "${LSTM_TEST_BIN_DIR:-}" ]] && dirs+=("$LSTM_TEST_BIN_DIR")
  dirs+=("$BUILD_DIR/tests" "$BUILD_DIR/bin")
  local bins=() d f
  for d in "${dirs[@]}"; do
    for f in "$d"/test_*; do
      [[ -f "$f" && -x "$f" ]] && bins+=("$f")
    done
    (( ${#bins[@]} )) && break
  done
  if (( ${#bins[@]} == 0 )); then
    NOTE="no tests found (no CTestTestfile.cmake, no test_* in ${dirs[*]})"
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
# section: cpu_bench (lstm-engine vs torch.nn.LSTM on the CPU)
# ---------------------------------------------------------------------------------------------
find_cpu_bench() {
  local c
  for c in "${LSTM_BENCH_CPU:-}" "$BUILD_DIR/bench/bench_cpu_lstm" "$BUILD_DIR/bin/bench_cpu_lstm"; do
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

export LSTM_CHECK_GIT_COMMIT=${LSTM_CHECK_GIT_COMMIT:-$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || true)}
for s in ${LSTM_CHECK_SECTIONS:-tests interop cpu_bench}; do
  run_section "$s"
done

if have_python; then
  "$PYTHON" "$SCRIPT_DIR/check_summary.py" "$OUT"
  exit $?
fi
# Without python: no results.json; decide from the section table alone.
tests_rc=$(awk -F'\t' '$1=="tests"{print $2}' "$OUT/sections.tsv")
others_bad=$(awk -F'\t' '$1!="tests" && $2!=0' "$OUT/sections.tsv" | wc -l)
echo "gpu_check: no $PYTHON, so no results.json/report.md; tests exit ${tests_rc:-not run}; $others_bad other section(s) failed"
[[ -z "$tests_rc" || "$tests_rc" == 0 ]] || exit 1
(( others_bad == 0 )) || exit 2
exit 0
