#!/usr/bin/env python3
"""Merges GPU benchmark JSON lines (bench_gpu_lstm = ours, bench_gpu_torch.py = torch) into one
JSON file, a Markdown report with one table per suite / mode / dtype, the issue's performance
checks, and PNG plots.

  python3 scripts/gpu_report.py --in ours.jsonl --in torch.jsonl [--suites-file bench/suites.json]
          [--json gpu_results.json] [--md gpu_report.md] [--png-dir DIR]

Table columns: case; ms of each of our backends (the rows of the LSTM registry that
bench_gpu_lstm timed: "cudnn" = cuDNN with PyTorch's algorithm rule, each pinned cuDNN algorithm
"cudnn:<algo>", our own kernels, "auto", and the baselines such as "naive" on `paper`); the best of
ours (baselines excluded: rows with "baseline": true, and "naive" in older files) and which it is;
torch ms; torch/ours for cuDNN standard and for the best; TFLOP/s of the best and its fraction of
the cuBLAS GEMM rate measured in the same run for that dtype; peak MiB (ours best / torch).
Row names are stable across versions of the harness (old rows' "cudnn:standard" is the new
"cudnn:standard"), so raw files of older runs merge with new ones.
"rej." = the algorithm rejected the case, "err" = it failed, "n/r" = not run (time budget),
"-" = no row; a "*" marks a row whose repeats were capped (an algorithm > 3x slower than the best).

Checks (each case listed with PASS / FAIL / MISSING; none left out):
  parity   deepbench_train and throughput, every mode and dtype: ours within 5% of torch
           (ours_ms <= 1.05 * torch_ms) with the cuDNN algorithm PyTorch's rule picks for the case:
           the "cudnn" row (which runs that rule; its "ran" says which algorithm), else, in older
           files, the pinned row their "cudnn_heuristic" names, else cuDNN standard
  latency  latency suite, infer, every dtype: ours with cuDNN's best algorithm faster than torch
A "cuda_graphs" table counts our rows per suite and mode by how they ran their calls (replayed, or
eager and why, from each row's "ran" and "log"; older files: "graph" and "graph_decisions").
Rows repeated over rounds (LSTM_GPU_ROUNDS of gpu_check.sh): each cell keeps its fastest round,
for ours and torch alike, with every round's ms in "ms_rounds".
A missed goal is reported, never an error: the exit status is 0 unless the inputs cannot be read.
Plots need matplotlib; without it the report says so and no PNG is written.
"""
import argparse
import datetime
import json
import math
import os
import sys

DTYPE_ORDER = ["fp32", "tf32", "bf16", "fp16"]
MODE_ORDER = ["infer", "train"]
CUDNN_ORDER = ["cudnn", "cudnn:standard", "cudnn:persist_static", "cudnn:persist_dynamic",
               "cudnn:persist_static_small_h"]
SHORT = {"cudnn": "cudnn", "cudnn:standard": "std", "cudnn:persist_static": "p_static",
         "cudnn:persist_dynamic": "p_dynamic", "cudnn:persist_static_small_h": "p_small_h"}
# Baselines of files written before rows carried "baseline".
OLD_BASELINES = {"naive"}
PARITY_SUITES = ["deepbench_train", "throughput"]
PARITY_LIMIT = 1.05
LATENCY_SUITE = "latency"
GEMM_FOR_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16"}


def read_lines(paths):
    headers, ceilings, rows = [], [], []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"gpu_report: {path}:{n}: not JSON ({e}); line skipped", file=sys.stderr)
                    continue
                r.setdefault("source", os.path.basename(path))
                kind = r.get("kind", "result")
                (headers if kind == "header" else ceilings if kind == "ceiling" else rows).append(r)
    return headers, ceilings, rows


def baseline_algos(rows):
    """Names of our baseline rows: kept for comparison, never "the best of ours"."""
    return OLD_BASELINES | {r["algo"] for r in rows if r.get("baseline") and r.get("algo")}


def is_cudnn(a):
    return a == "cudnn" or a.startswith("cudnn:")


def algo_sort_key(a, baselines=frozenset(OLD_BASELINES)):
    if a in CUDNN_ORDER:
        return (0, CUDNN_ORDER.index(a))
    if a.startswith("cudnn:"):
        return (1, a)
    if a in baselines:
        return (4, a)
    if a == "auto":
        return (3, a)
    return (2, a)


def is_ok(r):
    return r is not None and "error" not in r and r.get("ms") is not None


def fmt_ms(v):
    if v is None:
        return "-"
    if v < 10:
        return f"{v:.3f}"
    if v < 100:
        return f"{v:.2f}"
    return f"{v:.1f}"


def cell_text(r):
    if r is None:
        return "-"
    if "error" in r:
        e = r["error"]
        if e.startswith("not run"):
            return "n/r"
        return "rej." if r.get("rejected") or is_rejection(e) else "err"
    return fmt_ms(r["ms"]) + ("*" if r.get("capped") else "")


def is_rejection(e):
    """For rows without the "rejected" flag (older files, torch): a refusal, not a crash."""
    e = e.lower()
    return any(s in e for s in ("cannot run this case", "not supported", "not_supported", "unsupported",
                                "is not built", "bad_param", "3000"))


def short_case(c):
    """L1-H512-I512-B16-T25 -> L1 H512 B16 T25 (input size shown only when it is not H)."""
    parts = c.split("-")
    h = next((p[1:] for p in parts if p.startswith("H")), None)
    return " ".join(p for p in parts if not (p.startswith("I") and p[1:] == h))


def ceiling_rates(ceilings):
    """{'gemm': {dtype: tflops}, 'copy_gbs': x} from ours' ceiling rows (the last of each)."""
    gemm, copy = {}, None
    for c in ceilings:
        if "error" in c:
            continue
        if c.get("what") == "gemm":
            gemm[c["dtype"]] = c["tflops"]
        elif c.get("what") == "copy":
            copy = c["gbs"]
    return {"gemm": gemm, "copy_gbs": copy}


def load_suites(path):
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def case_id_of(c):
    h = int(c["hidden"])
    return (f"L{int(c.get('layers', 1))}-H{h}-I{int(c.get('input', h))}-B{int(c['batch'])}-T{int(c['steps'])}"
            + ("-bi" if c.get("bidirectional") else ""))


def build(headers, ceilings, rows, suites_doc):
    # Index rows; for a repeated key (rounds of gpu_check.sh) keep a measured row over an error
    # row and, of measured rows, the fastest (ours and torch alike), noting every round's ms.
    index = {}
    round_ms = {}
    for r in rows:
        key = (r.get("suite"), r.get("case"), r.get("mode"), r.get("dtype"), r.get("algo"))
        old = index.get(key)
        if is_ok(r):
            round_ms.setdefault(key, []).append(r["ms"])
        if old is None or (is_ok(r) and (not is_ok(old) or r["ms"] < old["ms"])) or (not is_ok(r) and not is_ok(old)):
            index[key] = r
    for key, ms in round_ms.items():
        if len(ms) > 1:
            index[key] = dict(index[key], ms_rounds=ms)

    # Suites and their cases: the suites file's order and every case it lists, plus any rows
    # for suites/cases it does not list.
    suite_cases = {}
    if suites_doc:
        for s, sd in suites_doc["suites"].items():
            suite_cases[s] = [case_id_of(c) for c in sd["cases"]]
    for (s, c, _, _, _) in index:
        if s is None or c is None:
            continue
        suite_cases.setdefault(s, [])
        if c not in suite_cases[s]:
            suite_cases[s].append(c)
    # Only suites something was measured (or attempted) for, unless nothing at all was.
    seen_suites = {k[0] for k in index}
    suites = [s for s in suite_cases if s in seen_suites] or list(suite_cases)

    modes = [m for m in MODE_ORDER if any(k[2] == m for k in index)] or MODE_ORDER
    dtypes = [d for d in DTYPE_ORDER if any(k[3] == d for k in index)]
    if not dtypes:
        dtypes = list(suites_doc.get("dtypes", DTYPE_ORDER)) if suites_doc else DTYPE_ORDER
    baselines = baseline_algos(rows)
    ours_algos = sorted({k[4] for k, r in index.items() if r.get("impl", "ours") != "torch" and k[4]},
                        key=lambda a: algo_sort_key(a, baselines))
    rates = ceiling_rates(ceilings)

    tables = []
    for s in suites:
        for m in modes:
            for d in dtypes:
                algos_here = [a for a in ours_algos if any(index.get((s, c, m, d, a)) for c in suite_cases[s])]
                lines = []
                for c in suite_cases[s]:
                    per = {a: index.get((s, c, m, d, a)) for a in algos_here}
                    torch_row = index.get((s, c, m, d, "torch"))
                    # torch.cuda.CUDAGraph replays of nn.LSTM (bench_gpu_torch.py --graphs): context only.
                    tgraph_row = index.get((s, c, m, d, "torch_graph"))
                    std = per.get("cudnn:standard")
                    cands = [(r["ms"], a) for a, r in per.items() if a not in baselines and is_ok(r)]
                    cudnn_cands = [(r["ms"], a) for a, r in per.items() if is_cudnn(a) and is_ok(r)]
                    best = min(cands) if cands else None
                    best_cudnn = min(cudnn_cands) if cudnn_cands else None
                    best_row = per[best[1]] if best else None
                    t_ms = torch_row["ms"] if is_ok(torch_row) else None
                    gemm = rates["gemm"].get(GEMM_FOR_DTYPE.get(d, d))
                    lines.append({
                        "case": c,
                        "ms": {a: (r["ms"] if is_ok(r) else None) for a, r in per.items()},
                        "cells": {a: cell_text(r) for a, r in per.items()},
                        "errors": {a: r["error"] for a, r in per.items() if r is not None and "error" in r},
                        "best_algo": best[1] if best else None,
                        "best_ms": best[0] if best else None,
                        "best_cudnn_algo": best_cudnn[1] if best_cudnn else None,
                        "best_cudnn_ms": best_cudnn[0] if best_cudnn else None,
                        "torch_ms": t_ms,
                        "ms_rounds": {a: r["ms_rounds"] for a, r in list(per.items()) + [("torch", torch_row)]
                                      if r is not None and "ms_rounds" in r},
                        "torch_cell": cell_text(torch_row),
                        "torch_graph_ms": tgraph_row["ms"] if is_ok(tgraph_row) else None,
                        "torch_graph_cell": cell_text(tgraph_row) if tgraph_row else None,
                        "torch_error": torch_row.get("error") if torch_row else None,
                        "torch_over_std": (t_ms / std["ms"]) if (t_ms and is_ok(std)) else None,
                        "torch_over_best": (t_ms / best[0]) if (t_ms and best) else None,
                        "tflops_best": best_row.get("tflops") if best_row else None,
                        "gemm_peak_tflops": gemm,
                        "fraction_of_gemm_peak": (best_row["tflops"] / gemm) if (best_row and gemm) else None,
                        "peak_mib_best": best_row.get("peak_mib") if best_row else None,
                        "peak_mib_torch": torch_row.get("peak_mib") if is_ok(torch_row) else None,
                        "capped": sorted(a for a, r in per.items() if is_ok(r) and r.get("capped")),
                    })
                tables.append({"suite": s, "mode": m, "dtype": d, "algos": algos_here, "rows": lines})
    return {"suites": suites, "modes": modes, "dtypes": dtypes, "ours_algos": ours_algos, "rates": rates,
            "tables": tables, "index": index, "suite_cases": suite_cases}


def run_checks(model, headers):
    """Every case of the claim's suites (from the suites file, measured or not) gets a verdict."""
    index, suite_cases = model["index"], model["suite_cases"]
    # Why an implementation has no rows at all: its header's error, or no input from it.
    no_rows = {}
    for impl in ("ours", "torch"):
        hs = [h for h in headers if h.get("impl") == impl]
        errs = [h["error"] for h in hs if "error" in h]
        no_rows[impl] = (f"no row ({impl} measured nothing: {errs[0]})" if errs else
                         "no row" if hs else f"no row (no {impl} results among the inputs)")

    def ms_of(s, c, m, d, a):
        r = index.get((s, c, m, d, a))
        if is_ok(r):
            return r["ms"], None
        return None, (r["error"] if r else no_rows["torch" if a == "torch" else "ours"])

    parity, latency = [], []
    for s in PARITY_SUITES:
        for m in model["modes"]:
            for d in model["dtypes"]:
                for c in suite_cases.get(s, []):
                    # Same cuDNN algorithm on both sides: the "cudnn" row runs PyTorch's rule;
                    # older files name the rule's pick in cudnn_heuristic; else standard.
                    ours_algo = "cudnn:standard"
                    if (s, c, m, d, "cudnn") in index:
                        ours_algo = "cudnn"
                    else:
                        for (ss, cc, mm, dd, a), r in index.items():
                            if (ss, cc, mm, dd) == (s, c, m, d) and r.get("cudnn_heuristic"):
                                ours_algo = "cudnn:" + r["cudnn_heuristic"]
                                break
                    ours, ours_err = ms_of(s, c, m, d, ours_algo)
                    torch_ms, torch_err = ms_of(s, c, m, d, "torch")
                    item = {"suite": s, "case": c, "mode": m, "dtype": d, "ours_algo": ours_algo,
                            "ours_ms": ours, "torch_ms": torch_ms}
                    ran = (index.get((s, c, m, d, ours_algo)) or {}).get("ran")
                    if ran:
                        item["ours_ran"] = ran
                    if ours is None or torch_ms is None:
                        why = ([f"ours: {ours_err}"] if ours is None else []) + \
                              ([f"torch: {torch_err}"] if torch_ms is None else [])
                        item.update(verdict="MISSING", why="; ".join(why))
                    else:
                        item.update(ratio=ours / torch_ms,
                                    verdict="PASS" if ours <= PARITY_LIMIT * torch_ms else "FAIL")
                        if item["verdict"] == "FAIL":
                            # PyTorch picks cuDNN's persist_static for some fp16 shapes: say which of
                            # our algorithms ran closest to torch's time, so such a row reads right.
                            near = [(abs(r["ms"] - torch_ms), a, r["ms"]) for (ss, cc, mm, dd, a), r in index.items()
                                    if (ss, cc, mm, dd) == (s, c, m, d) and is_cudnn(a) and is_ok(r)]
                            if near and min(near)[1] != ours_algo:
                                _, a, v = min(near)
                                item["closest_ours"] = f"{a} {fmt_ms(v)} ms"
                    parity.append(item)
    for d in model["dtypes"]:
        for c in suite_cases.get(LATENCY_SUITE, []):
            cands = []
            for (s, cc, m, dd, a), r in index.items():
                if (s, cc, m, dd) == (LATENCY_SUITE, c, "infer", d) and is_cudnn(a) and is_ok(r):
                    cands.append((r["ms"], a))
            best = min(cands) if cands else None
            torch_ms, torch_err = ms_of(LATENCY_SUITE, c, "infer", d, "torch")
            item = {"suite": LATENCY_SUITE, "case": c, "mode": "infer", "dtype": d,
                    "ours_algo": best[1] if best else None, "ours_ms": best[0] if best else None,
                    "torch_ms": torch_ms}
            if best is None or torch_ms is None:
                why = (["ours: no cuDNN algorithm measured this case"] if best is None else []) + \
                      ([f"torch: {torch_err}"] if torch_ms is None else [])
                item.update(verdict="MISSING", why="; ".join(why))
            else:
                item.update(ratio=best[0] / torch_ms, verdict="PASS" if best[0] < torch_ms else "FAIL")
            latency.append(item)

    def summary(items):
        return {v: sum(1 for i in items if i["verdict"] == v) for v in ("PASS", "FAIL", "MISSING")}

    return {
        "parity": {"rule": f"ours (cuDNN with the algorithm PyTorch's rule picks: the cudnn row; standard "
                           f"when older files do not say) ms <= {PARITY_LIMIT} x torch ms, suites {', '.join(PARITY_SUITES)}, "
                           "every mode and dtype", "counts": summary(parity), "cases": parity},
        "latency": {"rule": "ours with cuDNN's best algorithm per case faster than torch, suite latency, infer, "
                            "every dtype", "counts": summary(latency), "cases": latency},
    }


def check_line(name, i):
    head = f"{i['verdict']:<7} {name:<7} {i['suite']} {i['case']} {i['mode']} {i['dtype']}: "
    if i["verdict"] == "MISSING":
        return head + i["why"]
    algo = i["ours_algo"] + (f", ran {i['ours_ran']}" if i.get("ours_ran") else "")
    return (head + f"ours ({algo}) {fmt_ms(i['ours_ms'])} ms, torch {fmt_ms(i['torch_ms'])} ms, "
            f"ours/torch {i['ratio']:.3f}"
            + (f" (closest of ours: {i['closest_ours']})" if i.get("closest_ours") else ""))


def counts_text(c):
    total = sum(c.values())
    return f"{c['PASS']}/{total} PASS, {c['FAIL']} FAIL, {c['MISSING']} MISSING"


def header_lines(headers):
    out = []
    for h in headers:
        impl = h.get("impl", "?")
        if "error" in h:
            out.append(f"- {impl}: nothing measured: {h['error']} (`{h.get('command', '')}`)")
            continue
        parts = [h.get("date", "?"), h.get("gpu", "?"), h.get("versions", "")]
        if h.get("git_commit"):
            parts.append(f"commit {h['git_commit']}")
        parts.append(f"warm-up {h.get('warmup')}, median of {h.get('repeats')}")
        if h.get("budget_s"):
            parts.append(f"budget {h['budget_s']:.0f} s")
        if h.get("quick"):
            parts.append("**--quick: smoke test, not a measurement to quote**")
        out.append(f"- {impl}: " + "; ".join(p for p in parts if p) + f". Command: `{h.get('command', '')}`")
    return out


# Each verdict with the test that gives it, in the order they are tried (the columns' order).
GRAPH_RULES = [
    ("replayed", lambda r, dec: graph_state(r) == "replayed"),
    ("eager: gave up (capture failed or buffers kept changing)",
     lambda r, dec: any("eager from now on" in d for d in dec)),
    ("eager: the trial's replays were slower",
     lambda r, dec: any(d.endswith(": eager") and "replays took" in d for d in dec)),
    ("eager: no trial (copies too dear, host not the bottleneck)",
     lambda r, dec: any(d.endswith(": eager") and "eager calls" in d for d in dec)),
    ("eager: graphs off", lambda r, dec: r.get("graphs") == "off"),
    ("eager: other (e.g. dropout between layers, or undecided)", lambda r, dec: True),
]
GRAPH_VERDICTS = [v for v, _ in GRAPH_RULES]


def graph_state(r):
    """"replayed", "eager" or None (the backend does not say: it has no CUDA graphs). Older rows
    say it in "graph"; newer ones in "ran", the backend's last_run(), e.g.
    "cudnn:persist_static, replayed"."""
    if "graph" in r:
        return r["graph"] or None
    parts = [p.strip() for p in (r.get("ran") or "").split(",")]
    return next((p for p in parts if p in ("replayed", "eager")), None)


def graph_verdict(r):
    """How one of our rows ran its calls under cuda_graphs, from its "ran" and "log" (older rows:
    "graph" and "graph_decisions"): replayed, or eager and why. None for rows without graphs."""
    if graph_state(r) is None:
        return None
    dec = r.get("log") if "log" in r else r.get("graph_decisions")
    return next(v for v, test in GRAPH_RULES if test(r, dec or []))


def graph_lines(rows):
    """A table of our rows per suite and mode by graph_verdict (nothing when no row has one)."""
    counts = {}
    for r in rows:
        if r.get("impl") != "ours" or r.get("kind") != "result" or not is_ok(r):
            continue
        v = graph_verdict(r)
        if v is None:
            continue
        counts.setdefault((r["suite"], r["mode"]), {}).setdefault(v, 0)
        counts[(r["suite"], r["mode"])][v] += 1
    if not counts:
        return []
    verdicts = [v for v in GRAPH_VERDICTS if any(v in c for c in counts.values())]
    md = ["### cuda_graphs", "",
          "How our measured rows ran their calls, for backends with CUDA graphs (`ran`: the last timed "
          "call, its backward in training; for an eager row the first reason its cell's `log` gives, in the "
          "order of the columns after replayed: a cell's forward and backward decide apart).", "",
          "| suite | mode | " + " | ".join(verdicts) + " |",
          "|---|---|" + "---:|" * len(verdicts)]
    for (suite, mode), c in sorted(counts.items()):
        md.append(f"| {suite} | {mode} | " + " | ".join(str(c.get(v, 0)) for v in verdicts) + " |")
    md.append("")
    return md


def markdown(model, checks, headers, ceilings, plots, plot_note):
    md = ["## GPU LSTM benchmarks", ""]
    md += header_lines(headers) or ["- (no header lines in the inputs)"]
    md.append("")
    md.append("Ceilings measured in the same run (cuBLAS GEMM on random data; device-to-device copy counting "
              "bytes read + written):")
    md.append("")
    md.append("| what | dtype | size | ms | rate |")
    md.append("|---|---|---|---:|---:|")
    for c in ceilings:
        if "error" in c:
            md.append(f"| {c.get('what')} | {c.get('dtype', '')} | | | error: {c['error']} |")
        elif c.get("what") == "gemm":
            md.append(f"| GEMM | {c['dtype']} | {c['m']}x{c['n']}x{c['k']} | {fmt_ms(c['ms'])} | "
                      f"{c['tflops']:.1f} TFLOP/s |")
        else:
            md.append(f"| copy | | {c['bytes'] / 2**20:.0f} MiB | {fmt_ms(c['ms'])} | {c['gbs']:.0f} GB/s |")
    if not ceilings:
        md.append("| (none measured) | | | | |")
    md.append("")

    md.append("### Checks")
    md.append("")
    for name in ("parity", "latency"):
        md.append(f"- **{name}** ({checks[name]['rule']}): {counts_text(checks[name]['counts'])}")
    md.append("")
    for name in ("parity", "latency"):
        items = checks[name]["cases"]
        if not items:
            continue
        md.append(f"<details><summary>{name}: every case</summary>")
        md.append("")
        md.append("| verdict | suite | case | mode | dtype | ours algo | ours ms | torch ms | ours/torch |")
        md.append("|---|---|---|---|---|---|---:|---:|---:|")
        for i in items:
            ratio = f"{i['ratio']:.3f}" if "ratio" in i else i.get("why", "")
            if i.get("closest_ours"):
                ratio += f" (closest of ours: {i['closest_ours']})"
            md.append(f"| {i['verdict']} | {i['suite']} | {i['case']} | {i['mode']} | {i['dtype']} | "
                      f"{i['ours_algo'] or '-'} | {fmt_ms(i['ours_ms'])} | {fmt_ms(i['torch_ms'])} | {ratio} |")
        md.append("")
        md.append("</details>")
        md.append("")

    if plots:
        md.append("Plots: " + ", ".join(f"`{os.path.basename(p)}`" for p in plots) + ".")
    elif plot_note:
        md.append(f"Plots: none ({plot_note}).")
    md.append("")

    md.extend(graph_lines(model.get("raw_rows", [])))

    md.append("### Tables")
    md.append("")
    md.append("ms = median per call. rej. = rejected by the algorithm, err = failed, n/r = not run (time budget), "
              "- = no row, * = capped repeats. torch/x > 1: ours faster. % peak = TFLOP/s of the best over the "
              "cuBLAS GEMM rate of that dtype (fp32: plain fp32 GEMM).")
    md.append("")
    for t in model["tables"]:
        if not t["rows"]:
            continue
        cols = t["algos"]
        graphed = any(r.get("torch_graph_cell") for r in t["rows"])
        md.append(f"#### {t['suite']} / {t['mode']} / {t['dtype']}")
        md.append("")
        head = (["case"] + [SHORT.get(a, a) + " ms" for a in cols]
                + ["best", "torch ms"] + (["torch graph ms", "torch graph/best"] if graphed else [])
                + ["torch/std", "torch/best", "TFLOP/s", "% peak", "peak MiB ours/torch"])
        md.append("| " + " | ".join(head) + " |")
        md.append("|" + "|".join(["---"] + ["---:"] * len(cols) + ["---", "---:"] + (["---:", "---:"] if graphed else [])
                                 + ["---:", "---:", "---:", "---:", "---:"]) + "|")
        for r in t["rows"]:
            pct = f"{100 * r['fraction_of_gemm_peak']:.1f}" if r["fraction_of_gemm_peak"] is not None else "-"
            mem = (f"{r['peak_mib_best']:.0f}" if r["peak_mib_best"] is not None else "-") + " / " + \
                  (f"{r['peak_mib_torch']:.0f}" if r["peak_mib_torch"] is not None else "-")
            md.append("| " + " | ".join(
                [r["case"]] + [r["cells"].get(a, "-") for a in cols]
                + [SHORT.get(r["best_algo"], r["best_algo"] or "-"), r["torch_cell"]]
                + ([r["torch_graph_cell"] or "-",
                    f"{r['torch_graph_ms'] / r['best_ms']:.3f}" if r["torch_graph_ms"] and r["best_ms"] else "-"]
                   if graphed else [])
                + [f"{r['torch_over_std']:.3f}" if r["torch_over_std"] else "-",
                   f"{r['torch_over_best']:.3f}" if r["torch_over_best"] else "-",
                   f"{r['tflops_best']:.2f}" if r["tflops_best"] is not None else "-", pct, mem]) + " |")
        # Why cells are empty: one line per algorithm and message.
        why = {}
        for r in t["rows"]:
            for a, e in r["errors"].items():
                why.setdefault((a, e), []).append(r["case"])
            if r["torch_error"]:
                why.setdefault(("torch", r["torch_error"]), []).append(r["case"])
        if why:
            md.append("")
            for (a, e), cases in sorted(why.items()):
                which = "every case" if len(cases) == len(t["rows"]) else ", ".join(cases)
                md.append(f"- {a} ({which}): {e}")
        md.append("")
    return "\n".join(md) + "\n"


def plot_all(model, png_dir):
    """Returns (list of PNG paths, note). Never raises for a missing matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # ImportError, or a broken backend
        return [], f"matplotlib is not usable here: {e}"
    os.makedirs(png_dir, exist_ok=True)
    tables = model["tables"]
    suites, modes, dtypes = model["suites"], model["modes"], model["dtypes"]
    colors = {"fp32": "tab:blue", "tf32": "tab:orange", "bf16": "tab:green", "fp16": "tab:red"}
    markers = {"fp32": "o", "tf32": "s", "bf16": "^", "fp16": "D"}
    paths = []

    def grid(title):
        fig, axes = plt.subplots(len(suites), len(modes), figsize=(7.5 * len(modes), 3.2 * len(suites) + 1),
                                 squeeze=False)
        fig.suptitle(title)
        return fig, axes

    def xlabels(ax, cases):
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([short_case(c) for c in cases], rotation=70, fontsize=6)

    def finish(fig, name):
        fig.tight_layout()
        p = os.path.join(png_dir, name)
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)

    def table(s, m, d):
        for t in tables:
            if (t["suite"], t["mode"], t["dtype"]) == (s, m, d):
                return t
        return None

    # 1. Speed-up against torch per shape: torch_ms / ours_ms (> 1: ours faster).
    fig, axes = grid("Speed-up vs PyTorch nn.LSTM (torch ms / ours ms); filled: best of ours, hollow: cuDNN standard")
    for i, s in enumerate(suites):
        for j, m in enumerate(modes):
            ax = axes[i][j]
            cases = model["suite_cases"][s]
            for k, d in enumerate(dtypes):
                t = table(s, m, d)
                if not t:
                    continue
                off = (k - (len(dtypes) - 1) / 2) * 0.12
                xs_b = [n + off for n, r in enumerate(t["rows"]) if r["torch_over_best"]]
                ys_b = [r["torch_over_best"] for r in t["rows"] if r["torch_over_best"]]
                xs_s = [n + off for n, r in enumerate(t["rows"]) if r["torch_over_std"]]
                ys_s = [r["torch_over_std"] for r in t["rows"] if r["torch_over_std"]]
                ax.scatter(xs_b, ys_b, marker=markers[d], color=colors[d], s=18, label=f"{d} best")
                ax.scatter(xs_s, ys_s, marker=markers[d], facecolors="none", edgecolors=colors[d], s=18,
                           label=f"{d} std")
            ax.axhline(1.0, color="black", lw=0.8)
            ax.axhline(1 / PARITY_LIMIT, color="gray", lw=0.6, ls="--")
            ax.set_yscale("log")
            ax.set_title(f"{s} / {m}", fontsize=9)
            xlabels(ax, cases)
            ax.grid(True, which="both", axis="y", alpha=0.3)
            if i == 0 and j == 0 and ax.get_legend_handles_labels()[1]:
                ax.legend(fontsize=6, ncol=2)
    finish(fig, "gpu_speedup_torch.png")

    # 2. Speed-up against cuDNN standard per shape, for every other algorithm of ours.
    others = [a for a in model["ours_algos"] if a != "cudnn:standard"]
    acolors = {a: plt.cm.tab10(n % 10) for n, a in enumerate(others)}
    fig, axes = grid("Speed-up vs cuDNN standard through our backend (std ms / algo ms); colour = algorithm, "
                     "marker = dtype (" + ", ".join(f"{markers[d]} {d}" for d in dtypes) + ")")
    for i, s in enumerate(suites):
        for j, m in enumerate(modes):
            ax = axes[i][j]
            cases = model["suite_cases"][s]
            for k, d in enumerate(dtypes):
                t = table(s, m, d)
                if not t:
                    continue
                off = (k - (len(dtypes) - 1) / 2) * 0.12
                for a in others:
                    xs, ys = [], []
                    for n, r in enumerate(t["rows"]):
                        std, v = r["ms"].get("cudnn:standard"), r["ms"].get(a)
                        if std and v:
                            xs.append(n + off)
                            ys.append(std / v)
                    if xs:
                        ax.scatter(xs, ys, marker=markers[d], color=acolors[a], s=16,
                                   label=f"{SHORT.get(a, a)}" if k == 0 else None)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_yscale("log")
            ax.set_title(f"{s} / {m}", fontsize=9)
            xlabels(ax, cases)
            ax.grid(True, which="both", axis="y", alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            if labels:
                ax.legend(fontsize=6)
    finish(fig, "gpu_speedup_cudnn.png")

    # 3. TFLOP/s against the measured GEMM peak, per dtype, every case sorted by work.
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5.5 * len(dtypes), 4.5), squeeze=False)
    fig.suptitle("TFLOP/s (2*4H*(I+H)*B*T per layer and direction, x3 train) vs the cuBLAS GEMM rate of the same run")
    for k, d in enumerate(dtypes):
        ax = axes[0][k]
        for m, mk in zip(modes, ("o", "^")):
            pts = []
            for t in tables:
                if t["mode"] != m or t["dtype"] != d:
                    continue
                for r in t["rows"]:
                    row = model["index"].get((t["suite"], r["case"], m, d, r["best_algo"])) if r["best_algo"] else None
                    if row and is_ok(row):
                        trow = model["index"].get((t["suite"], r["case"], m, d, "torch"))
                        pts.append((row["gflop"], row["tflops"], trow["tflops"] if is_ok(trow) else None))
            pts.sort(key=lambda p: p[0])
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=mk, s=14, label=f"ours best, {m}")
                tp = [(p[0], p[2]) for p in pts if p[2]]
                if tp:
                    ax.scatter([p[0] for p in tp], [p[1] for p in tp], marker="x", s=14, label=f"torch, {m}")
        peak = model["rates"]["gemm"].get(GEMM_FOR_DTYPE.get(d, d))
        if peak:
            ax.axhline(peak, color="black", lw=0.8, ls="--")
            ax.text(0.02, 0.97, f"GEMM {peak:.0f} TFLOP/s", transform=ax.transAxes, fontsize=7, va="top")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("GFLOP per call")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(d)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=6)
    finish(fig, "gpu_tflops.png")
    return paths, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in", dest="inputs", action="append", required=True, help="JSON lines file (repeatable)")
    ap.add_argument("--suites-file", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                          "bench", "suites.json"))
    ap.add_argument("--json", help="merged JSON output")
    ap.add_argument("--md", help="Markdown report output")
    ap.add_argument("--png-dir", help="folder for the PNG plots (none when omitted)")
    args = ap.parse_args()

    paths = [p for p in args.inputs if os.path.exists(p)]
    for p in args.inputs:
        if p not in paths:
            print(f"gpu_report: {p} does not exist; left out", file=sys.stderr)
    if not paths:
        print("gpu_report: no input file exists", file=sys.stderr)
        return 2
    headers, ceilings, rows = read_lines(paths)
    suites_doc = load_suites(args.suites_file)
    model = build(headers, ceilings, rows, suites_doc)
    model["raw_rows"] = rows
    checks = run_checks(model, headers)

    plots, plot_note = [], "no --png-dir"
    if args.png_dir:
        try:
            plots, plot_note = plot_all(model, args.png_dir)
        except Exception as e:  # a plot must never cost the report
            plots, plot_note = [], f"plotting failed: {type(e).__name__}: {e}"
            print(f"gpu_report: {plot_note}", file=sys.stderr)

    for name in ("parity", "latency"):
        for i in checks[name]["cases"]:
            print(check_line(name, i))
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(model, checks, headers, ceilings, plots, plot_note))
    if args.json:
        merged = {"generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "inputs": paths, "headers": headers, "ceilings": ceilings, "rates": model["rates"],
                  "checks": checks,
                  "tables": [{k: v for k, v in t.items()} for t in model["tables"]],
                  "rows": rows}
        with open(args.json, "w") as f:
            json.dump(merged, f, indent=1)
    n_ok = sum(1 for r in rows if is_ok(r))
    print(f"gpu_report: parity {counts_text(checks['parity']['counts'])}; latency "
          f"{counts_text(checks['latency']['counts'])}; {n_ok}/{len(rows)} rows measured; "
          f"{len(plots)} plot(s){'' if plots else ' (' + plot_note + ')'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
