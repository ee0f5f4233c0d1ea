#!/usr/bin/env python3
"""torch.nn.LSTM on the CPU over the cases bench/bench_cpu_lstm.cpp runs, for scripts/compare_cpu.py.

Same cases, warm-up, repeat count, median and JSON line format as bench_cpu_lstm, with
"impl": "pytorch". What each mode times, chosen to do the same work as ours:
  fwd     forward under torch.no_grad() (nothing saved for backward)
  fwdbwd  training forward, then output.backward(d_output) with a fixed random d_output; x has
          requires_grad so that d_x is computed, as our backward always returns it; parameter
          .grad is zeroed before each repeat outside the timed region, so backward accumulates
          into zeroed gradients as ours does.
h0/c0 are omitted (zeros); weights keep nn.LSTM's default initialisation; x ~ U(-1, 1).

  python3 scripts/bench_cpu_torch.py --threads 2 --json torch.jsonl [--quick]
"""
import argparse
import json
import statistics
import sys
import time


def parse_int_list(s):
    try:
        values = [int(v) for v in s.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {s!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return values


def parse_modes(s):
    modes = [m for m in s.split(",") if m]
    if not modes or any(m not in ("fwd", "fwdbwd") for m in modes):
        raise argparse.ArgumentTypeError(f"modes are fwd and fwdbwd, got {s!r}")
    return modes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads(N); 0 keeps torch's default")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7; 3 with --quick)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed warm-up runs (default 2; 1 with --quick)")
    ap.add_argument("--json", help="write one JSON object per case to this file")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, for smoke tests")
    ap.add_argument("--hidden", type=parse_int_list, default=[128, 512])
    ap.add_argument("--batch", type=parse_int_list, default=[1, 32])
    ap.add_argument("--layers", type=parse_int_list, default=[1, 2])
    ap.add_argument("--steps", type=parse_int_list, default=[100])
    ap.add_argument("--modes", type=parse_modes, default=["fwd", "fwdbwd"])
    args = ap.parse_args()
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 7)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    if repeats < 1 or warmup < 0:
        ap.error("--repeats must be >= 1 and --warmup >= 0")

    try:
        import torch
    except ImportError:
        print("bench_cpu_torch: torch is not installed", file=sys.stderr)
        return 3

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    torch.manual_seed(1)

    out = open(args.json, "w") if args.json else None
    print(f"pytorch {torch.__version__} CPU nn.LSTM (f32), {threads} thread(s), "
          f"warm-up {warmup}, median of {repeats}")
    print(f"{'L':>3} {'H':>5} {'B':>4} {'T':>5} {'mode':<7} {'median ms':>11} {'min ms':>11} {'us/step':>10}")
    sys.stdout.flush()

    for L in args.layers:
        for H in args.hidden:
            for B in args.batch:
                for T in args.steps:
                    for mode in args.modes:
                        lstm = torch.nn.LSTM(H, H, num_layers=L).float()
                        x = torch.rand(T, B, H) * 2 - 1
                        times = []
                        if mode == "fwd":
                            with torch.no_grad():
                                for r in range(warmup + repeats):
                                    t0 = time.perf_counter()
                                    y, _ = lstm(x)
                                    t1 = time.perf_counter()
                                    if r >= warmup:
                                        times.append((t1 - t0) * 1e3)
                        else:
                            x.requires_grad_(True)
                            dout = torch.rand(T, B, H) * 2 - 1
                            for r in range(warmup + repeats):
                                for p in lstm.parameters():
                                    if p.grad is not None:
                                        p.grad.zero_()
                                x.grad = None
                                t0 = time.perf_counter()
                                y, _ = lstm(x)
                                y.backward(dout)
                                t1 = time.perf_counter()
                                if r >= warmup:
                                    times.append((t1 - t0) * 1e3)
                        if not torch.isfinite(y).all():
                            print(f"bench_cpu_torch: non-finite output for H={H} B={B} L={L}", file=sys.stderr)
                            return 1
                        med, lo = statistics.median(times), min(times)
                        print(f"{L:>3} {H:>5} {B:>4} {T:>5} {mode:<7} {med:>11.3f} {lo:>11.3f} {1e3 * med / T:>10.2f}")
                        sys.stdout.flush()
                        if out:
                            row = {"impl": "pytorch", "torch_version": torch.__version__, "dtype": "f32",
                                   "H": H, "B": B, "T": T, "L": L, "mode": mode, "threads": threads,
                                   "ms_median": med, "ms_min": lo, "repeats": repeats}
                            # Flushed per row so a run cut short still leaves its finished rows.
                            out.write(json.dumps(row) + "\n")
                            out.flush()
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
