#!/usr/bin/env python3
"""Writes the small synthetic data sets of the task examples (docs/guide/tasks.md).

    python3 examples/data/make_data.py [OUT_DIR]      # default: examples/data

regress.csv   id,sequence,sum,max: 4..20 steps of two features "x|w" each; sum = the sum of
              x*w over the steps, max = the largest x (two regression targets).
forecast.csv  time,signal,aux: 2000 steps of two noisy periodic signals (periods 50 and 13);
              the example predicts the next 5 steps of `signal` from 48 steps of both.
classify.csv  id,sequence,label: 3..12 tokens from {a, b, c}; the label says which of a and b occurs
              more often ("more_a" / "more_b"; c is noise).
tag.csv       id,sequence,tags: 4..24 tokens from {a, b, c}; the tag of each step is "odd" or
              "even", the parity of how many a's were seen so far (needs memory, not just the
              token).

Plain Python 3 (no numpy), seeded: the same files every time.
"""
import math
import os
import random
import sys


def write_regress(path, rows=4000, seed=1):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write("id,sequence,sum,max\n")
        for i in range(rows):
            n = rng.randint(4, 20)
            xs = [rng.uniform(-1, 1) for _ in range(n)]
            ws = [rng.uniform(0, 1) for _ in range(n)]
            seq = " ".join(f"{x:.4f}|{w:.4f}" for x, w in zip(xs, ws))
            s = sum(round(x, 4) * round(w, 4) for x, w in zip(xs, ws))
            f.write(f"{i},{seq},{s:.6f},{max(round(x, 4) for x in xs):.4f}\n")


def write_forecast(path, steps=2000, seed=2):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write("time,signal,aux\n")
        for t in range(steps):
            signal = math.sin(2 * math.pi * t / 50) + 0.5 * math.sin(2 * math.pi * t / 13) + rng.gauss(0, 0.05)
            aux = 10 + 3 * math.cos(2 * math.pi * t / 50) + rng.gauss(0, 0.1)
            f.write(f"{t},{signal:.5f},{aux:.5f}\n")


def write_classify(path, rows=3000, seed=4):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write("id,sequence,label\n")
        for i in range(rows):
            toks = [rng.choice("abc") for _ in range(rng.randint(3, 12))]
            if toks.count("a") == toks.count("b"):
                toks.append(rng.choice("ab"))
            label = "more_a" if toks.count("a") > toks.count("b") else "more_b"
            f.write(f"{i},{' '.join(toks)},{label}\n")


def write_tag(path, rows=3000, seed=3):
    rng = random.Random(seed)
    with open(path, "w") as f:
        f.write("id,sequence,tags\n")
        for i in range(rows):
            n = rng.randint(4, 24)
            toks = [rng.choice("abc") for _ in range(n)]
            tags, count = [], 0
            for tok in toks:
                count += tok == "a"
                tags.append("odd" if count % 2 else "even")
            f.write(f"{i},{' '.join(toks)},{' '.join(tags)}\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    write_regress(os.path.join(out, "regress.csv"))
    write_forecast(os.path.join(out, "forecast.csv"))
    write_classify(os.path.join(out, "classify.csv"))
    write_tag(os.path.join(out, "tag.csv"))
    print(f"wrote regress.csv, forecast.csv, classify.csv and tag.csv to {out}")


if __name__ == "__main__":
    main()
