#!/usr/bin/env python3
"""torch.nn.LSTM on the GPU over the cases of bench/suites.json, for scripts/gpu_report.py.

Writes JSON lines in bench_gpu_lstm's schema (see bench/bench_gpu_lstm.cpp) with "impl": "torch"
and "algo": "torch": a header line (date, GPU, torch / CUDA / cuDNN versions, command), then one
"result" line per case x mode x dtype (a failure is a line with "error", never left out).

What one timed repeat is, chosen to do the same work as ours:
  infer  module.eval(), forward under torch.no_grad() (nothing saved for backward)
  train  module.train(), forward, then output.backward(d_output) with a random d_output; x has
         requires_grad so that d_x is computed as ours always does; parameter grads are set to
         None before each repeat, outside the timed region (zero_grad's default)
Dtypes: fp32 = TF32 off (torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
False), tf32 = both True, bf16/fp16 = module and inputs in that dtype. flatten_parameters() is
called; weights keep nn.LSTM's default initialisation U(-1/sqrt(H), 1/sqrt(H)); x and d_output
~ U(-1, 1) are views into one random pool per dtype (>= 4x the L2), each call reading the next
slot of it, so that no call finds its inputs in L2. CUDA events on the current stream, warm-up,
median (and min, p90) of the repeats; host_us_per_call (median host time to issue one call) and
sm_mhz (the SM clock measured right after the timed loop) as bench_gpu_lstm records them.
peak_mib: torch.cuda.max_memory_allocated over the case above what was allocated before it, plus
one x (and one d_output), as bench_gpu_lstm counts it.

--graphs: inference cells only, each call replayed from a torch.cuda.CUDAGraph captured once per
cell (the documented recipe: warm-up on a side stream, capture with torch.cuda.graph, then per call
static_x.copy_(x) and graph.replay()), as "algo": "torch_graph": what a PyTorch user gets by
graphing nn.LSTM by hand, to set beside our cuda_graphs.

--cooldown-ms N: before a cell's warm-up the GPU idles as long as the previous cell kept it busy,
at most N ms (bench_gpu_lstm has the same option and says why); the row says "cooldown_ms".

--pad-mib N: N MiB of device memory taken first and held for the run, so that every later buffer
lands elsewhere in device memory (bench_gpu_lstm has the same option and says why).

Exits 0 with a note (and a header line with "error") when torch or a CUDA GPU is missing.

  python3 scripts/bench_gpu_torch.py --out torch.jsonl [--suite NAME]... [--dtype D]...
          [--mode infer|train]... [--repeats N] [--warmup N] [--quick] [--budget-s S] [--case ID]... [--list]
          [--graphs] [--cooldown-ms N] [--pad-mib N]
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SUITES = os.path.join(os.path.dirname(HERE), "bench", "suites.json")
DTYPES = ("fp32", "tf32", "bf16", "fp16")
ALIASES = {"f32": "fp32", "f16": "fp16"}


def split_append(values):
    out = []
    for v in values or []:
        out += [s for s in v.split(",") if s]
    return out


def case_id(c):
    return (f"L{c['L']}-H{c['H']}-I{c['I']}-B{c['B']}-T{c['T']}" + ("-bi" if c["bidirectional"] else ""))


def suite_case(c):
    """A case of bench/suites.json as the benches use it (input size = hidden unless given)."""
    h = int(c["hidden"])
    return {"L": int(c.get("layers", 1)), "H": h, "I": int(c.get("input", h)), "B": int(c["batch"]),
            "T": int(c["steps"]), "bidirectional": bool(c.get("bidirectional", False)), "suites": []}


def add_case(cases, by_id, cs, suite):
    """Appends case cs of `suite` to cases unless an equal one is there (by_id: id -> index), whose
    suites then gain `suite`."""
    key = case_id(cs)
    if key not in by_id:
        by_id[key] = len(cases)
        cases.append(cs)
    if suite not in cases[by_id[key]]["suites"]:
        cases[by_id[key]]["suites"].append(suite)


def case_gflop(c, train):
    """2*4H*(I_l+H)*B*T per layer l and direction forward, x3 for train (as bench_gpu_lstm)."""
    d = 2 if c["bidirectional"] else 1
    f = 0.0
    for layer in range(c["L"]):
        i = c["I"] if layer == 0 else d * c["H"]
        f += 2.0 * 4.0 * c["H"] * (i + c["H"]) * c["B"] * c["T"] * d
    return f * (3.0 if train else 1.0) * 1e-9


def make_plan(args):
    """Cases (deduplicated across suites, each knowing its suites) and cells, cheapest first."""
    with open(args.suites_file) as f:
        doc = json.load(f)
    suites_all = list(doc["suites"].keys())
    suites = split_append(args.suite) or suites_all
    for s in suites:
        if s not in doc["suites"]:
            sys.exit(f"bench_gpu_torch: unknown suite {s!r} (the suites file has: {' '.join(suites_all)})")
    dtypes = [ALIASES.get(d, d) for d in split_append(args.dtype)]
    if not dtypes:
        dtypes = ["fp32", "bf16"] if args.quick else [ALIASES.get(d, d) for d in doc.get("dtypes", DTYPES)]
    for d in dtypes:
        if d not in DTYPES:
            sys.exit(f"bench_gpu_torch: unknown dtype {d!r} (expected fp32, tf32, bf16 or fp16)")
    modes = split_append(args.mode) or ["infer", "train"]
    for m in modes:
        if m not in ("infer", "train"):
            sys.exit(f"bench_gpu_torch: --mode accepts infer and train, got {m!r}")
    per_suite = args.cases_per_suite or (1 if args.quick else 0)
    only = set(split_append(args.case))
    cases, by_id = [], {}
    for s in suites:
        for n, c in enumerate(doc["suites"][s]["cases"]):
            if per_suite and n >= per_suite:
                break
            cs = suite_case(c)
            if not only or case_id(cs) in only:
                add_case(cases, by_id, cs, s)
    for key in only:
        if key not in by_id:
            sys.exit(f"bench_gpu_torch: --case: no case of the chosen suites has the id {key!r} (see --list)")
    cells = [(ci, m, d) for ci in range(len(cases)) for d in dtypes for m in modes]
    cells.sort(key=lambda cell: case_gflop(cases[cell[0]], cell[1] == "train"))  # stable
    return suites, dtypes, modes, cases, cells


def percentile(values, q):
    v = sorted(values)
    if not v:
        return 0.0
    pos = q * (len(v) - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites-file", default=DEFAULT_SUITES)
    ap.add_argument("--suite", action="append", help="suite name (repeatable or comma list; default all)")
    ap.add_argument("--dtype", action="append", help="fp32, tf32, bf16, fp16 (repeatable; default the file's)")
    ap.add_argument("--mode", action="append", help="infer, train (repeatable; default both)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats, >= 10 (default 20; 10 with --quick)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed warm-up calls, >= 1 (default 3; 1 with --quick)")
    ap.add_argument("--out", help="JSON lines output file")
    ap.add_argument("--quick", action="store_true", help="first case of each suite, fp32 and bf16: a smoke test")
    ap.add_argument("--cases-per-suite", type=int, default=0)
    ap.add_argument("--case", action="append", help="only this case id, e.g. L2-H1024-I1024-B64-T100 (repeatable)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="stop starting cells after this many seconds (they are recorded as not run); 0: no limit")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    ap.add_argument("--cooldown-ms", type=float, default=0.0,
                    help="idle before a cell's warm-up for as long as the previous cell kept the GPU busy, "
                         "at most this many ms (as bench_gpu_lstm --cooldown-ms); 0: never")
    ap.add_argument("--pad-mib", type=int, default=0,
                    help="device memory held from the start, so every later buffer lands elsewhere")
    ap.add_argument("--graphs", action="store_true",
                    help="inference cells only, replayed from a CUDA graph (algo torch_graph)")
    args = ap.parse_args()
    repeats = args.repeats if args.repeats is not None else (10 if args.quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if repeats < 10 or warmup < 1:
        ap.error("--repeats must be >= 10 and --warmup >= 1")
    if args.cooldown_ms < 0:
        ap.error(f"--cooldown-ms must be >= 0, got {args.cooldown_ms}")
    if args.pad_mib < 0:
        ap.error(f"--pad-mib must be >= 0, got {args.pad_mib}")

    if args.graphs:
        args.mode = ["infer"]
    suites, dtypes, modes, cases, cells = make_plan(args)
    if args.list:
        print(f"{len(cases)} cases, {len(cells)} cells (suites: {' '.join(suites)})")
        for ci, m, d in cells:
            print(f"torch {case_id(cases[ci]):<26} {m:<5} {d:<4} {case_gflop(cases[ci], m == 'train'):10.2f} GFLOP")
        return 0

    out = open(args.out, "w") if args.out else None

    def emit(row):
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()  # a run cut short keeps what it measured

    command = " ".join([os.path.basename(sys.executable)] + sys.argv)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        import torch
    except ImportError as e:
        print(f"bench_gpu_torch: nothing measured: torch is not importable ({e})")
        emit({"kind": "header", "impl": "torch", "date": date, "command": command,
              "error": f"torch is not importable: {e}"})
        return 0
    if not torch.cuda.is_available():
        print(f"bench_gpu_torch: nothing measured: torch {torch.__version__} sees no CUDA GPU")
        emit({"kind": "header", "impl": "torch", "date": date, "command": command,
              "torch": torch.__version__, "error": "torch sees no CUDA GPU"})
        return 0

    dev = torch.device("cuda")
    pad = torch.empty(args.pad_mib << 20, dtype=torch.uint8, device=dev) if args.pad_mib > 0 else None  # noqa: F841
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    header = {"kind": "header", "impl": "torch", "date": date, "gpu": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version(), "cudnn_enabled": torch.backends.cudnn.enabled,
              "cudnn_benchmark": torch.backends.cudnn.benchmark,
              "versions": (f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                           f"cuDNN {torch.backends.cudnn.version()}"),
              "sms": props.multi_processor_count, "l2_mib": l2 / 2**20, "command": command,
              "git_commit": os.environ.get("LSTM_CHECK_GIT_COMMIT") or None,
              "suites_file": args.suites_file, "suites": suites, "dtypes": dtypes, "modes": modes,
              "repeats": repeats, "warmup": warmup, "budget_s": args.budget_s, "quick": args.quick,
              "graphs": args.graphs, "cooldown_ms": args.cooldown_ms, "pad_mib": args.pad_mib,
              "cells": len(cells)}
    emit(header)
    print(f"bench_gpu_torch: {header['gpu']}; {header['versions']}; {len(cases)} cases, {len(cells)} cells; "
          f"warm-up {warmup}, median of {repeats}")
    sys.stdout.flush()

    def sm_clock_mhz():
        # The SM clock now: torch.cuda._sleep spins one thread for a number of clock cycles (as
        # bench_gpu_lstm's sm_clock_mhz does), timed with events.
        cycles = 2_000_000
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        ms = a.elapsed_time(b)
        return cycles / (ms * 1e3) if ms > 0 else 0.0

    torch_dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

    def slot(c, train):
        align = lambda n: (n + 127) // 128 * 128  # noqa: E731
        d = 2 if c["bidirectional"] else 1
        return align(c["T"] * c["B"] * c["I"]) + (align(c["T"] * c["B"] * d * c["H"]) if train else 0)

    pools, cursor = {}, {}

    def pool(tdt):
        if tdt not in pools:
            n = max([4 * l2 // torch.tensor([], dtype=tdt).element_size()] + [2 * slot(c, True) for c in cases])
            g = torch.Generator(device=dev)
            g.manual_seed(1000)
            pools[tdt] = torch.rand(n, device=dev, dtype=torch.float32, generator=g).mul_(2).sub_(1).to(tdt)
            cursor[tdt] = 0
            torch.cuda.synchronize()
        return pools[tdt]

    busy = {"ms": 0.0}  # GPU time of the previous cell's calls (--cooldown-ms)

    def run_cell(c, mode, dtype, row):
        train = mode == "train"
        tdt = torch_dtype[dtype]
        allow = dtype == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = allow
        torch.backends.cudnn.allow_tf32 = allow
        p = pool(tdt)
        s = slot(c, train)
        es = p.element_size()
        # Each call reads its own slot, taken in turn from a cursor that runs through the whole
        # pool (>= 4x L2) across cells, so no call finds its inputs in L2 from an earlier call.
        nbuf = min(p.numel() // s, warmup + repeats + 1)
        d = 2 if c["bidirectional"] else 1
        nx, nd = c["T"] * c["B"] * c["I"], c["T"] * c["B"] * d * c["H"]
        xs, douts = [], []
        for k in range(nbuf):
            if cursor[tdt] + s > p.numel():
                cursor[tdt] = 0
            off = cursor[tdt]
            cursor[tdt] += s
            x = p[off:off + nx].view(c["T"], c["B"], c["I"])
            if train:
                x = x.detach().requires_grad_(True)
                doff = off + (nx + 127) // 128 * 128
                douts.append(p[doff:doff + nd].view(c["T"], c["B"], d * c["H"]))
            xs.append(x)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(1)
        lstm = torch.nn.LSTM(c["I"], c["H"], num_layers=c["L"], bidirectional=c["bidirectional"]).to(dev, tdt)
        lstm.flatten_parameters()
        lstm.train(train)
        state = {}

        def prepare(i):
            if train:
                lstm.zero_grad(set_to_none=True)
                xs[i % nbuf].grad = None

        graph = None
        if args.graphs:
            # torch.cuda.graphs' recipe: warm up on a side stream, capture, replay with a static input.
            static_x = xs[0].clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(2):
                    lstm(static_x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(graph):
                static_y, _ = lstm(static_x)

        def run(i):
            b = i % nbuf
            state.clear()
            if graph is not None:
                static_x.copy_(xs[b])
                graph.replay()
                state["y"], state["x"] = static_y, xs[b]
                return
            if train:
                y, _ = lstm(xs[b])
                y.backward(douts[b])
            else:
                with torch.no_grad():
                    y, _ = lstm(xs[b])
            state["y"], state["x"] = y, xs[b]

        def time_calls(first, count, host_us=None):
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
            for k in range(count):
                prepare(first + k)
                ev[k][0].record()
                t0 = time.perf_counter()
                run(first + k)
                if host_us is not None:
                    host_us.append((time.perf_counter() - t0) * 1e6)
                ev[k][1].record()
            ev[-1][1].synchronize()
            return [a.elapsed_time(b) for a, b in ev]

        cooldown = min(args.cooldown_ms, busy["ms"])
        if cooldown > 0:
            torch.cuda.synchronize()
            time.sleep(cooldown * 1e-3)
        busy["ms"] = 0.0
        wms = time_calls(0, warmup)
        host_us = []
        ms = time_calls(warmup, repeats, host_us)
        mhz = sm_clock_mhz()  # the clock the loop above ran at
        busy["ms"] = sum(wms) + sum(ms)
        y = state["y"]
        if not bool(torch.isfinite(y).all()):
            raise RuntimeError("non-finite output")
        if train:
            gx = state["x"].grad
            if gx is None or not bool(torch.isfinite(gx).all()):
                raise RuntimeError("non-finite (or missing) d_x")
            for prm in lstm.parameters():
                if prm.grad is None or not bool(torch.isfinite(prm.grad).all()):
                    raise RuntimeError("non-finite (or missing) weight gradient")
        torch.cuda.synchronize()
        peak = max(0, torch.cuda.max_memory_allocated() - base)
        med = percentile(ms, 0.5)
        row.update({"ms": med, "ms_min": min(ms), "ms_p90": percentile(ms, 0.9),
                    "us_per_step": med * 1e3 / c["T"], "tflops": row["gflop"] / (med * 1e-3) * 1e-3,
                    "peak_mib": (peak + (nx + (nd if train else 0)) * es) / 2**20, "repeats": repeats,
                    "warmup": warmup, "host_us_per_call": percentile(host_us, 0.5), "sm_mhz": mhz,
                    "first_call_ms": wms[0], "capped": False, "input_buffers": nbuf, "cooldown_ms": cooldown})

    t0 = time.monotonic()
    counts = {"measured": 0, "failed": 0, "not run": 0}
    for n, (ci, mode, dtype) in enumerate(cells):
        c = cases[ci]
        row = {"kind": "result", "impl": "torch", "suite": c["suites"][0], "case": case_id(c), "L": c["L"],
               "H": c["H"], "I": c["I"], "B": c["B"], "T": c["T"], "bidirectional": c["bidirectional"],
               "mode": mode, "dtype": dtype, "algo": "torch_graph" if args.graphs else "torch", "gflop": case_gflop(c, mode == "train")}
        if args.budget_s > 0 and time.monotonic() - t0 > args.budget_s:
            row["error"] = f"not run: the time budget (--budget-s {args.budget_s:.0f}) was spent"
            counts["not run"] += 1
        else:
            try:
                run_cell(c, mode, dtype, row)
                counts["measured"] += 1
            except Exception as e:  # a case torch rejects is recorded, not dropped
                row["error"] = f"{type(e).__name__}: {e}"
                counts["failed"] += 1
            torch.cuda.empty_cache()
        line = f"[{n + 1:4d}/{len(cells)}] {row['algo']} {row['case']:<26} {mode:<5} {dtype:<4} "
        if "error" in row:
            line += "error: " + row["error"][:160]
        else:
            line += (f"{row['ms']:9.3f} ms (min {row['ms_min']:.3f}, p90 {row['ms_p90']:.3f}, n={repeats}) "
                     f"{row['us_per_step']:8.2f} us/step {row['tflops']:7.2f} TFLOP/s {row['peak_mib']:8.1f} MiB"
                     f" host {row['host_us_per_call']:.0f} us/call @{row['sm_mhz']:.0f} MHz")
        print(line)
        sys.stdout.flush()
        for s in c["suites"]:
            row["suite"] = s
            emit(row)
    print(f"bench_gpu_torch: {len(cells)} cells in {time.monotonic() - t0:.1f} s: {counts['measured']} measured, "
          f"{counts['failed']} failed, {counts['not run']} not run")
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
