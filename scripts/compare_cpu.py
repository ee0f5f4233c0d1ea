#!/usr/bin/env python3
"""Pairs bench_cpu_lstm rows with bench_cpu_torch rows and judges them against the CPU goal.

Goal: lstm-engine on the CPU is no slower than 1.5x torch.nn.LSTM on the same machine, same
thread count, same case. Rows pair on (L, H, B, T, mode, threads); the ratio is ours / torch on
the medians. Only a torch run from the same machine and session is a fair yardstick, so the
verdict uses --torch rows only; --baseline rows (e.g. /work/shared/bench/pytorch_cpu_baseline.jsonl,
field "ms") are shown as context and never judged against.

  python3 scripts/compare_cpu.py --ours ours.jsonl --torch torch.jsonl [--md report.md]
                                 [--png ratios.png] [--json-out compare.json] [--baseline FILE]

Each of --ours/--torch/--baseline may be given more than once (e.g. one file per thread count).
Exit status 0 whatever the verdicts (the check script must not fail on performance);
--strict makes a missed goal exit 1.
"""
import argparse
import json
import sys

GOAL = 1.5
KEY_FIELDS = ("L", "H", "B", "T", "mode", "threads")


def read_jsonl(paths, what):
    rows = []
    for path in paths or []:
        try:
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        print(f"compare_cpu: {path}:{n}: not JSON ({e}); line skipped", file=sys.stderr)
        except OSError as e:
            print(f"compare_cpu: cannot read {what} file {path}: {e}", file=sys.stderr)
    return rows


def key_of(row):
    return tuple(row.get(k) for k in KEY_FIELDS)


def index(rows, value_field):
    out = {}
    for r in rows:
        k = key_of(r)
        if None in k or r.get(value_field) is None:
            continue
        # A later row for the same case wins: reruns append, and the newest is the one meant.
        out[k] = float(r[value_field])
    return out


def compare(ours_rows, torch_rows, baseline_rows):
    ours = index(ours_rows, "ms_median")
    torch = index(torch_rows, "ms_median")
    base = index(baseline_rows, "ms")
    keys = sorted(set(ours) | set(torch), key=lambda k: (k[5], k[0], k[1], k[2], k[3], k[4]))
    result = []
    for k in keys:
        row = dict(zip(KEY_FIELDS, k))
        o, t = ours.get(k), torch.get(k)
        row["ours_ms"] = o
        row["torch_ms"] = t
        row["baseline_ms"] = base.get(k)
        row["ratio"] = o / t if (o is not None and t) else None
        if o is None:
            row["verdict"] = "no ours"
        elif t is None:
            row["verdict"] = "no torch"
        else:
            row["verdict"] = "meets" if row["ratio"] <= GOAL else "MISSES"
        result.append(row)
    return result


def fmt_ms(v):
    return "-" if v is None else f"{v:.3f}"


def markdown(rows, show_baseline):
    head = ["case", "threads", "ours ms", "torch ms", "ours/torch", f"goal <= {GOAL}x"]
    if show_baseline:
        head.insert(4, "torch baseline ms")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + [":---:"]) + "|"]
    for r in rows:
        case = f"L{r['L']} H{r['H']} B{r['B']} T{r['T']} {r['mode']}"
        cells = [case, str(r["threads"]), fmt_ms(r["ours_ms"]), fmt_ms(r["torch_ms"]),
                 "-" if r["ratio"] is None else f"{r['ratio']:.2f}", r["verdict"]]
        if show_baseline:
            cells.insert(4, fmt_ms(r["baseline_ms"]))
        lines.append("| " + " | ".join(cells) + " |")
    judged = [r for r in rows if r["ratio"] is not None]
    met = sum(1 for r in judged if r["verdict"] == "meets")
    lines.append("")
    if judged:
        worst = max(judged, key=lambda r: r["ratio"])
        lines.append(f"{met} of {len(judged)} paired cases meet the goal (ours <= {GOAL}x torch); "
                     f"worst ratio {worst['ratio']:.2f} (L{worst['L']} H{worst['H']} B{worst['B']} "
                     f"{worst['mode']}, {worst['threads']} threads).")
    else:
        lines.append("No case has both an lstm-engine and a torch timing; nothing judged.")
    if show_baseline:
        lines.append("")
        lines.append("The baseline column is a PyTorch run from another session and is context only.")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"compare_cpu: matplotlib is not importable; no plot written to {path}")
        return False
    judged = [r for r in rows if r["ratio"] is not None]
    if not judged:
        print(f"compare_cpu: no paired cases; no plot written to {path}")
        return False
    labels = [f"L{r['L']} H{r['H']} B{r['B']}\n{r['mode']} {r['threads']}t" for r in judged]
    ratios = [r["ratio"] for r in judged]
    colors = ["tab:green" if v <= GOAL else "tab:red" for v in ratios]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(judged)), 4.5))
    ax.bar(range(len(judged)), ratios, color=colors)
    ax.axhline(GOAL, color="black", linestyle="--", linewidth=1, label=f"goal {GOAL}x")
    ax.axhline(1.0, color="gray", linestyle=":", linewidth=1, label="parity")
    ax.set_xticks(range(len(judged)))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("time ratio lstm-engine / PyTorch (lower is better)")
    if max(ratios) / max(min(ratios), 1e-9) > 20:
        ax.set_yscale("log")
    ax.set_title("CPU LSTM, fp32, T=100, input = hidden")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", action="append", required=True, help="bench_cpu_lstm --json output")
    ap.add_argument("--torch", action="append", default=[], help="bench_cpu_torch.py --json output")
    ap.add_argument("--baseline", action="append", default=[], help="context-only torch rows with field 'ms'")
    ap.add_argument("--md", help="write the Markdown table here instead of stdout")
    ap.add_argument("--png", help="plot the ratios here (needs matplotlib)")
    ap.add_argument("--json-out", help="write the paired rows as a JSON list here")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a paired case misses the goal")
    args = ap.parse_args()

    rows = compare(read_jsonl(args.ours, "ours"), read_jsonl(args.torch, "torch"),
                   read_jsonl(args.baseline, "baseline"))
    md = markdown(rows, show_baseline=bool(args.baseline))
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    if args.png:
        plot(rows, args.png)
    missed = any(r["verdict"] == "MISSES" for r in rows)
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
