#!/usr/bin/env bash
# The persistent kernels stage by stage (docs/KERNELS.md, "Where the time goes"): the latency
# suite's T = 1000 cells and the 4-layer stack, bf16 inference, once per configuration of the
# measurement knobs, each in its own process (the knobs are read once per process). One line per
# configuration with the us per step of each cell; the rows go to OUT/<config>.jsonl.
#
#   bash scripts/bench_persistent.sh BUILD_DIR OUT [CONFIG...]
#
# A CONFIG is a space-free list of KNOB=VALUE pairs joined by commas, for example
#   skip=57                      LSTM_PERSISTENT_SKIP=57 (bits: docs/KERNELS.md)
#   exchange=flags,skip=2        LSTM_PERSISTENT_EXCHANGE=flags LSTM_PERSISTENT_SKIP=2
#   regs=0 | cluster=0 | csync=barrier | wavefront=0 | units=8
# Default configurations: the full step, then without the product, the wait, everything but the
# exchange and its wait, the exchange read alone, and the loop alone. Needs a GPU; without one the
# benchmark says so and measures nothing. Set DTYPE (default bf16) or CASES to change the cells.
set -uo pipefail
build=${1:?usage: bench_persistent.sh BUILD_DIR OUT [CONFIG...]}
out=${2:?usage: bench_persistent.sh BUILD_DIR OUT [CONFIG...]}
shift 2
configs=("$@")
((${#configs[@]})) || configs=(skip=0 skip=1 skip=2 skip=57 skip=59 skip=61)
dtype=${DTYPE:-bf16}
cases=${CASES:-"L1-H256-I256-B1-T1000 L1-H512-I512-B1-T1000 L1-H1024-I1024-B1-T1000 L1-H256-I256-B8-T1000 L1-H512-I512-B8-T1000 L1-H1024-I1024-B8-T1000 L4-H512-I512-B8-T100"}
bench=$build/bench/bench_gpu_lstm
[[ -x $bench ]] || { echo "bench_persistent: no $bench (build it first)" >&2; exit 2; }
mkdir -p "$out"
case_args=()
for c in $cases; do case_args+=(--case "$c"); done

rc=0
for cfg in "${configs[@]}"; do
  env_args=()
  IFS=',' read -r -a pairs <<<"$cfg"
  for p in "${pairs[@]}"; do
    key=${p%%=*} value=${p#*=}
    case $key in
      skip) env_args+=("LSTM_PERSISTENT_SKIP=$value") ;;
      exchange) env_args+=("LSTM_PERSISTENT_EXCHANGE=$value") ;;
      regs) env_args+=("LSTM_PERSISTENT_REGS=$value") ;;
      cluster) env_args+=("LSTM_PERSISTENT_CLUSTER=$value") ;;
      wavefront) env_args+=("LSTM_PERSISTENT_WAVEFRONT=$value") ;;
      csync) env_args+=("LSTM_PERSISTENT_CLUSTER_SYNC=$value") ;;
      units) env_args+=("LSTM_PERSISTENT_UNITS=$value") ;;
      *) echo "bench_persistent: unknown knob '$key' in '$cfg' (skip, exchange, regs, cluster, csync, wavefront, units)" >&2
         exit 2 ;;
    esac
  done
  name=$(tr '=,' '_-' <<<"$cfg")
  env "${env_args[@]}" timeout 120 "$bench" --suite latency --mode infer --dtype "$dtype" --algos persistent \
    "${case_args[@]}" --repeats 10 --warmup 2 --out "$out/$name.jsonl" >"$out/$name.txt" 2>&1 || rc=1
  python3 - "$cfg" "$out/$name.jsonl" <<'EOF'
import json, sys
cfg, path = sys.argv[1], sys.argv[2]
cells = []
try:
    for line in open(path):
        r = json.loads(line)
        if r.get("kind") == "result" and r.get("us_per_step") is not None:
            cells.append(f"{r['case']} {r['us_per_step']:.2f} ({r.get('ran', '')})")
except OSError:
    pass
print(f"== {cfg}: " + ("; ".join(cells) if cells else "nothing measured (see the .txt beside it)"))
EOF
done
exit $rc
