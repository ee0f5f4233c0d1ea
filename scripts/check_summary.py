#!/usr/bin/env python3
"""Gathers what scripts/gpu_check.sh left in OUT_DIR into results.json and report.md.

Reads, all optional:
  OUT_DIR/sections.tsv       one line per section: name, exit code, seconds, note (tab-separated)
  OUT_DIR/ctest.xml          ctest --output-junit
  OUT_DIR/gtest/*.xml        gtest --gtest_output=xml (when tests ran without ctest)
  OUT_DIR/bench/*.jsonl      benchmark rows, any impl; each row gets "file" added
  OUT_DIR/compare/*.json     paired comparisons (compare_cpu.py --json-out), keyed by file stem
  OUT_DIR/report.d/*.md      report fragments, concatenated in name order
Writes OUT_DIR/results.json and OUT_DIR/report.md and prints one summary line.
Exit status: 0 when every section passed, 1 when the tests section failed or found no tests,
2 when the tests passed (or were not selected) but another section failed.

  python3 scripts/check_summary.py OUT_DIR
"""
import glob
import json
import os
import socket
import sys
import time
import xml.etree.ElementTree as ET


def read_sections(out_dir):
    sections = []
    path = os.path.join(out_dir, "sections.tsv")
    if not os.path.exists(path):
        return sections
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3:
                continue
            sections.append({"name": parts[0], "rc": int(parts[1]), "seconds": float(parts[2]),
                             "note": parts[3] if len(parts) > 3 else ""})
    return sections


def count_junit(paths):
    """Counts testcases across JUnit-style files from ctest or gtest."""
    counts = {"total": 0, "passed": 0, "failed": 0, "skipped": 0, "failed_names": [], "files": []}
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError) as e:
            counts.setdefault("errors", []).append(f"{path}: {e}")
            continue
        counts["files"].append(os.path.basename(path))
        for tc in root.iter("testcase"):
            counts["total"] += 1
            status = tc.get("status", "")
            # ctest marks status="fail" / "notrun" / "disabled"; gtest uses result="skipped" and
            # <failure> children. Either may carry <skipped>.
            if tc.find("failure") is not None or tc.find("error") is not None or status == "fail":
                counts["failed"] += 1
                name = tc.get("name", "?")
                cls = tc.get("classname")
                counts["failed_names"].append(f"{cls}.{name}" if cls and cls != name else name)
            elif (tc.find("skipped") is not None or status in ("notrun", "disabled")
                  or tc.get("result") in ("skipped", "suppressed")):
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return counts


def read_bench(out_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "bench", "*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                row["file"] = os.path.relpath(path, out_dir)
                rows.append(row)
    return rows


def read_comparisons(out_dir):
    comps = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "compare", "*.json"))):
        try:
            with open(path) as f:
                comps[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
        except (OSError, json.JSONDecodeError):
            pass
    return comps


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    sections = read_sections(out_dir)
    by_name = {s["name"]: s for s in sections}

    junit = [p for p in [os.path.join(out_dir, "ctest.xml")] if os.path.exists(p)]
    junit += sorted(glob.glob(os.path.join(out_dir, "gtest", "*.xml")))
    tests = count_junit(junit)
    test_section = by_name.get("tests")
    tests["exit_code"] = test_section["rc"] if test_section else None
    # A run that left the tests section out on purpose (LSTM_CHECK_SECTIONS) is judged on the rest;
    # a tests section that ran and found no tests is a failure.
    tests_ok = test_section is None or (test_section["rc"] == 0 and tests["failed"] == 0 and tests["total"] > 0)
    others_ok = all(s["rc"] == 0 for s in sections if s["name"] != "tests")
    status = "pass" if tests_ok and others_ok else ("fail" if not tests_ok else "section-error")

    bench_rows = read_bench(out_dir)
    comparisons = read_comparisons(out_dir)
    results = {
        "status": status,
        "host": {"hostname": socket.gethostname(), "nproc": os.cpu_count(),
                 "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "git_commit": os.environ.get("LSTM_CHECK_GIT_COMMIT") or None,
        "tests": tests,
        "sections": sections,
        "bench_rows": bench_rows,
        "comparisons": comparisons,
    }
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    parts = ["# lstm-engine machine check", "",
             f"Host {results['host']['hostname']} ({results['host']['nproc']} CPUs), "
             f"{results['host']['date']}" + (f", commit {results['git_commit']}" if results["git_commit"] else "")
             + f". Status: **{status}**.", "",
             "| section | exit | seconds | note |", "|---|---:|---:|---|"]
    for s in sections:
        parts.append(f"| {s['name']} | {s['rc']} | {s['seconds']:.0f} | {s['note']} |")
    parts.append("")
    for frag in sorted(glob.glob(os.path.join(out_dir, "report.d", "*.md"))):
        with open(frag) as f:
            parts.append(f.read().rstrip("\n"))
            parts.append("")
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(parts) + "\n")

    summary = [f"gpu_check: {status.upper()}",
               "tests not run (section not selected)" if test_section is None else
               f"tests {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"
               f" (exit {tests['exit_code']})"]
    for name, rows in comparisons.items():
        judged = [r for r in rows if r.get("ratio") is not None]
        met = sum(1 for r in judged if r.get("verdict") == "meets")
        if judged:
            worst = max(r["ratio"] for r in judged)
            summary.append(f"{name}: {met}/{len(judged)} cases meet the 1.5x goal, worst {worst:.2f}x")
        else:
            summary.append(f"{name}: {len(rows)} rows, none paired")
    failed_sections = [s["name"] for s in sections if s["rc"] != 0 and s["name"] != "tests"]
    if failed_sections:
        summary.append("sections failed: " + ", ".join(failed_sections))
    summary.append(f"{len(bench_rows)} bench rows; {os.path.join(out_dir, 'report.md')}")
    print("; ".join(summary))
    return 0 if status == "pass" else (1 if status == "fail" else 2)


if __name__ == "__main__":
    sys.exit(main())
