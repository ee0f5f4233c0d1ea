#!/usr/bin/env python3
"""lstm_engine.torch.LSTM against torch.nn.LSTM from PyTorch, eager and CUDA-graphed, over cases of
bench/suites.json (default: the latency, paper and throughput suites). Writes JSON lines.

Per case x dtype x mode x implementation x variant, one "result" line (a failure is a line with
"error", never left out); a "header" line first (date, GPU, torch / CUDA / cuDNN / engine versions,
the command).
  impl     "lstm_engine" (lstm_engine.torch.LSTM, --algo, default auto) or "torch" (nn.LSTM)
  mode     infer: module.eval(), forward under torch.no_grad();
           train: a training step of the LSTM: grads zeroed in place, forward, output.backward(dy)
           (x requires grad, so d_x is computed too); no optimizer step
  variant  eager: the calls as written; graph: the same call captured once with torch.cuda.graph
           (warm-up on a side stream first, the documented recipe) and replayed, inputs copied into
           the static input before each replay
  dtype    fp32 (TF32 off: torch.backends.cudnn.allow_tf32 and matmul.allow_tf32 False), tf32 (both
           True), bf16, fp16 (module and inputs in that dtype)
Both modules hold the same weights (nn.LSTM's default initialisation); x ~ U(-1, 1). Timing: CUDA
events on the current stream around each call after warm-up (ours also warms up until its backend
says it has settled: `auto`'s measurements, its own CUDA-graph decisions), median / min / p90 of
--repeats calls; ms per call. The rows name the backend ours ran ("backend": its last_run).

  PYTHONPATH=python LSTM_ENGINE_LIB=build/liblstm_c.so python3 scripts/bench_python.py --out py.jsonl
      [--suite NAME]... [--dtype D]... [--mode infer|train]... [--variant eager|graph]...
      [--algo auto|cudnn|fused|...] [--repeats N] [--warmup N] [--case ID]... [--quick]
      [--budget-s S] [--device cuda|cpu] [--list]
--device cpu runs the same over the CPU backends (no graphs; for a smoke test: --quick).
Exits 0 with a header line holding "error" when torch or the GPU is missing.
"""
import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_SUITES = os.path.join(REPO, "bench", "suites.json")
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)
# The suites' case names, work counts and statistics are bench_gpu_torch's (one definition).
from bench_gpu_torch import add_case, case_gflop, case_id, percentile, split_append, suite_case  # noqa: E402


def load_cases(args):
    with open(args.suites_file) as f:
        doc = json.load(f)
    suites = split_append(args.suite) or ["latency", "paper", "throughput"]
    only = set(split_append(args.case))
    cases, by_id = [], {}
    for s in suites:
        if s not in doc["suites"]:
            sys.exit(f"bench_python: unknown suite {s!r} (the suites file has: {' '.join(doc['suites'])})")
        for n, c in enumerate(doc["suites"][s]["cases"]):
            if args.quick and n >= 1:
                break
            cs = suite_case(c)
            if args.quick and args.device == "cpu":  # a smoke test: small shapes
                cs.update(H=min(cs["H"], 64), I=min(cs["I"], 64), T=min(cs["T"], 20), B=min(cs["B"], 8))
            if not only or case_id(cs) in only:
                add_case(cases, by_id, cs, s)
    return cases


def stats(ms):
    v = sorted(ms)
    return {"ms_median": percentile(v, 0.5), "ms_min": v[0], "ms_p90": percentile(v, 0.9), "repeats": len(v)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--suites-file", default=DEFAULT_SUITES)
    ap.add_argument("--suite", action="append")
    ap.add_argument("--case", action="append")
    ap.add_argument("--dtype", action="append")
    ap.add_argument("--mode", action="append")
    ap.add_argument("--variant", action="append")
    ap.add_argument("--impl", action="append", help="lstm_engine, torch (default both)")
    ap.add_argument("--algo", default="auto")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--settle-max", type=int, default=100, help="at most this many calls waiting for `settled`")
    ap.add_argument("--quick", action="store_true", help="the first case of each suite, fp32 and bf16")
    ap.add_argument("--budget-s", type=float, default=0, help="stop starting cells after this many seconds")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()

    cases = load_cases(args)
    dtypes = split_append(args.dtype) or (["fp32", "bf16"] if args.quick else ["fp32", "tf32", "bf16", "fp16"])
    modes = split_append(args.mode) or ["infer", "train"]
    variants = split_append(args.variant) or (["eager"] if args.device == "cpu" else ["eager", "graph"])
    impls = split_append(args.impl) or ["lstm_engine", "torch"]
    if args.list:
        for c in cases:
            print(case_id(c), ",".join(c["suites"]))
        return 0

    out_file = open(args.out, "w")

    def emit(row):
        out_file.write(json.dumps(row) + "\n")
        out_file.flush()

    header = {"kind": "header", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), "device": args.device, "algo": args.algo}
    try:
        import torch
        from torch import nn

        import lstm_engine
        from lstm_engine.torch import LSTM
    except Exception as e:  # noqa: BLE001
        header["error"] = f"cannot import torch / lstm_engine: {e}"
        emit(header)
        print(header["error"])
        return 0
    header.update(torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                  engine=lstm_engine.version(), engine_lib=lstm_engine._lib.path())
    if args.device == "cuda":
        if not torch.cuda.is_available() or not lstm_engine.cuda_available():
            header["error"] = "no usable GPU (torch.cuda.is_available() or the engine's lstm_cuda_available() is false)"
            emit(header)
            print(header["error"])
            return 0
        header["gpu"] = torch.cuda.get_device_name()
    emit(header)
    dev = torch.device(args.device)
    tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    start = time.time()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn, n):
        ms = []
        for _ in range(n):
            if dev.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                ms.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                ms.append(1e3 * (time.perf_counter() - t0))
        return ms

    for c in cases:
        for d in dtypes:
            for mode in modes:
                for impl in impls:
                    for variant in variants:
                        if args.budget_s and time.time() - start > args.budget_s:
                            print("bench_python: budget spent, stopping")
                            return 0
                        row = {"kind": "result", "impl": impl, "variant": variant, "suite": c["suites"][0],
                               "suites": c["suites"], "case": case_id(c), "L": c["L"], "H": c["H"], "I": c["I"],
                               "B": c["B"], "T": c["T"], "bidirectional": c["bidirectional"], "mode": mode,
                               "dtype": d, "gflop": case_gflop(c, mode == "train"),
                               "algo": args.algo if impl == "lstm_engine" else "torch"}
                        try:
                            torch.backends.cudnn.allow_tf32 = d == "tf32"
                            torch.backends.cuda.matmul.allow_tf32 = d == "tf32"
                            # Only CPU generators: after a failed capture the CUDA generator stays unusable for
                            # the rest of the process, and the cells after it would fail too.
                            torch.random.default_generator.manual_seed(0)
                            gen = torch.Generator().manual_seed(1)
                            ref = nn.LSTM(c["I"], c["H"], c["L"], bidirectional=c["bidirectional"]).to(dev, tdt[d])
                            if impl == "torch":
                                m = ref
                                m.flatten_parameters()
                            else:
                                m = LSTM(c["I"], c["H"], c["L"], bidirectional=c["bidirectional"], algo=args.algo,
                                         device=dev, dtype=tdt[d])
                                m.load_state_dict(ref.state_dict())
                            x = (torch.rand(c["T"], c["B"], c["I"], generator=gen) * 2 - 1).to(dev, tdt[d])
                            train = mode == "train"
                            m.train(train)
                            if train:
                                x.requires_grad_(True)
                                dy = (torch.rand(c["T"], c["B"], (2 if c["bidirectional"] else 1) * c["H"],
                                                 generator=gen) * 2 - 1).to(dev, tdt[d])
                                for p in m.parameters():
                                    p.grad = torch.zeros_like(p)

                            def call():
                                if train:
                                    for p in m.parameters():
                                        p.grad.zero_()
                                    x.grad = None
                                    out, _ = m(x)
                                    out.backward(dy)
                                else:
                                    with torch.no_grad():
                                        m(x)

                            fn = call
                            if impl == "lstm_engine":  # auto's measurements and graph decisions first
                                for _ in range(args.settle_max):
                                    call()
                                    if m.backend_info("settled") == "1":
                                        break
                            if variant == "graph":
                                s = torch.cuda.Stream()
                                s.wait_stream(torch.cuda.current_stream())
                                with torch.cuda.stream(s):
                                    for _ in range(3):
                                        call()
                                torch.cuda.current_stream().wait_stream(s)
                                g = torch.cuda.CUDAGraph()
                                if train:
                                    x.grad = None
                                with torch.cuda.graph(g):
                                    if train:
                                        for p in m.parameters():
                                            p.grad.zero_()
                                        out, _ = m(x)
                                        out.backward(dy)
                                    else:
                                        with torch.no_grad():
                                            m(x)
                                xs = x.detach().clone()

                                def fn():
                                    with torch.no_grad():
                                        x.copy_(xs)
                                    g.replay()

                            for _ in range(args.warmup):
                                fn()
                            sync()
                            ms = timed(fn, args.repeats)
                            row.update(stats(ms))
                            row["tflops"] = row["gflop"] / row["ms_median"] if row["ms_median"] > 0 else None
                            if impl == "lstm_engine":
                                row["backend"] = m.backend_info("last_run")
                        except Exception as e:  # noqa: BLE001 (a failed cell is a row)
                            row["error"] = f"{type(e).__name__}: {e}"
                        emit(row)
                        print(f"{impl:<11} {variant:<5} {row['case']:<26} {mode:<5} {d:<4} "
                              + (f"{row['ms_median']:9.3f} ms" if "ms_median" in row else row.get("error", "?")[:100]),
                              flush=True)
                        sync() if "error" not in row else None
    return 0


if __name__ == "__main__":
    sys.exit(main())
