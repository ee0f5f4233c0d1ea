// GPU LSTM benchmark harness: the cases of bench/suites.json on every GPU backend of the LSTM
// registry (lstm_backends(): one row each, e.g. cuDNN with each of its algorithms, our own
// kernels, the naive per-gate baseline of Appleyard et al. 2016), plus "auto" (the fastest row
// by measurement), plus the GPU's own ceilings (cuBLAS GEMM rates, device-to-device copy
// bandwidth) measured in the same run. The harness knows no backend by name: what a row is,
// whether it is a baseline and what it accepts come from the registry, how a call ran from the
// backend's last_run(), settled(), graph_counts() and log().
// scripts/bench_gpu_torch.py measures torch.nn.LSTM on the same cases and scripts/gpu_report.py
// merges both into tables, checks and plots. bench/README.md says how to run them.
//
//   bench_gpu_lstm [--suites-file FILE] [--suite NAME]... [--dtype fp32|tf32|bf16|fp16]...
//                  [--mode infer|train]... [--algos LIST] [--baseline-suite NAME]... [--repeats N]
//                  [--warmup N] [--out FILE] [--quick] [--check | --check-suite NAME...]
//                  [--budget-s S] [--max-cell-s S] [--no-ceilings] [--list] [--graphs auto|on|off]
//
// --algos: registry row names and "auto" (make_lstm_backend with Algo::Auto); "PREFIX*" names
// every row whose name starts with PREFIX. Default: every row that accepts at least one cell of
// the plan on the GPU (a row's why_not; all rows when no GPU is usable, e.g. for --list), then
// "auto". Passes run in that order (the registry's), cheapest cell first within each pass.
// Baseline rows (LstmBackendEntry::baseline) run only on the suites --baseline-suite names
// (default paper; --naive-suite is the old spelling).
//
// --graphs sets LstmOptions::cuda_graphs for every cell (default auto, the library's default): a
// backend may then replay its calls as CUDA graphs, and a cell warms up until the backend has
// settled how the cell's calls run (LstmBackend::settled(); under auto a few measured eager
// calls, a capture and a few measured replays; at most 30 extra calls).
//
// What one timed repeat is: infer = forward with nothing saved; train = training forward (saving
// for backward) + backward of a random d_output, weight gradients included (accumulated into
// weight-gradient buffers zeroed outside the timed region). Weights are views into the backend's
// flat buffer (make_flat_weights with flat_layout, as flatten_parameters does), U(-1/sqrt(H),
// 1/sqrt(H)); x and d_output ~ U(-1, 1) rotate through a pool beyond the L2 (InputRotation in
// gpu_bench_util.hpp, where every timing-fairness rule lives). Each repeat is timed with CUDA
// events on the engine stream (the calls get ExecContext::current(Device::CUDA)); the row carries
// the median, min and p90.
//
// Output (--out): JSON lines.
//   {"kind": "header", "impl": "ours", "date", "gpu", "gpus", "versions", "command", "backends", ...}
//   {"kind": "ceiling", "what": "gemm", "dtype", "m", "n", "k", "ms", "tflops", ...}
//   {"kind": "ceiling", "what": "copy", "bytes", "ms", "gbs" (read + write), ...}
//   {"kind": "result", "impl": "ours", "suite", "case", "L", "H", "I", "B", "T", "bidirectional",
//    "mode", "dtype", "algo" (the registry row's name, or "auto"), "baseline" (the row is a
//    baseline), "ms", "ms_min", "ms_p90", "us_per_step", "tflops", "gflop", "peak_mib", "repeats",
//    "warmup", "capped", "host_us_per_call" (median host time to issue one call), "sm_mhz" (SM
//    clock measured right after the timed loop), "ran" (the backend's last_run() after the last
//    timed call, e.g. "cudnn:persist_static, replayed"), "graphs" (the --graphs setting),
//    "settled", "graph_captures", "graph_replays" (over the whole cell, warm-up included), "log"
//    (the backend's log(), one string per line: auto's timings and pick, CUDA-graph decisions)
//    [, "check"]}
//   A case a row rejects (or that failed) is a result row with "error" instead of timings
//   ("rejected": true when the row refused it before running: make_lstm_backend threw).
// peak_mib: the arena's peak in-use bytes over the case (weights, gradients, outputs, saved
// activations, workspaces) above what was in use before it, plus one x (and one d_output).
// gflop: 2*4H*(I_l+H)*B*T per layer l and direction forward, x3 for train (I_l = the layer's
// input size); tflops = gflop / median.
//
// Time limits: --budget-s caps the LSTM part of the run (cells not started in time are recorded
// with "error": "not run: ..."). --max-cell-s caps the repeats of a cell whose warm-up call
// already took more than 3x the fastest algorithm of the same case, mode and dtype (such a row
// says "capped": true and may have fewer than 10 repeats; it can never be the fastest).
//
// --cooldown-ms N (default 0): before a cell's warm-up the GPU idles for as long as the previous
// cell kept it busy, at most N ms ("cooldown_ms"); a cell whose warm-up went on while the
// backend settled idles once more and warms up again ("settle_cooldown_ms"). Why: Cooldown in
// gpu_bench_util.hpp.
// --pad-mib N: N MiB of device memory held for the run before anything else, so that every later
// buffer lands elsewhere; --pad-weights-mib N holds N MiB in each cell just before its weights
// are made (weights, workspaces and outputs move, the rotating inputs do not), --pad-work-mib N
// just after (only what the backend allocates at its first calls moves): to tell which buffers
// a time hangs on. The header says all three.
// --l2-whh: each cell sets an L2 persisting access window on the engine stream over layer 0's
// weight_hh and clears it after, to tell whether that placement dependence is the recurrent
// weights' L2 hits. Needs LSTM_CUDA_STREAM=own; the row says "l2_window".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.hpp"
#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

#if LSTM_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/cuda_rt.hpp"
#include "cuda/cublas_util.hpp"
#include "gpu_bench_util.hpp"
#endif

#ifndef LSTM_BENCH_SUITES
#define LSTM_BENCH_SUITES "bench/suites.json"
#endif

namespace {

using json = nlohmann::ordered_json;

// Warm-up calls a cell may add to --warmup while the backend settles how its calls run.
constexpr int kMaxExtraWarmup = 30;
// The --algos name of make_lstm_backend with Algo::Auto (not a registry row).
const std::string kAuto = "auto";

struct Options {
  std::string suites_file = LSTM_BENCH_SUITES;
  std::vector<std::string> suites;  // empty: every suite of the file, in file order
  std::vector<std::string> dtypes;  // empty: the file's "dtypes"
  std::vector<std::string> modes;   // empty: infer, train
  std::vector<std::string> algos;   // empty: every row that accepts a cell, then auto
  std::vector<std::string> baseline_suites{"paper"};
  bool baseline_suites_given = false;
  std::vector<std::string> check_suites;
  bool check_all = false;
  double check_max_gflop = 1000;  // train GFLOP above which the CPU float64 reference is skipped
  int repeats = 20;
  int warmup = 3;
  bool repeats_given = false, warmup_given = false;
  double max_cell_s = 1.0;
  double budget_s = 0;  // 0: no limit
  bool quick = false;
  int cases_per_suite = 0;  // 0: all
  std::vector<std::string> case_ids;  // empty: all; else only these case ids (CaseSpec::id)
  bool ceilings = true;
  int64_t gemm_n = 8192;
  int64_t copy_mib = 2048;
  bool list = false;
  std::string out;
  lstm::GraphMode graphs = lstm::GraphMode::Auto;  // LstmOptions::cuda_graphs of every cell
  double cooldown_ms = 0;       // idle before a cell, up to the previous cell's busy time
  int64_t pad_mib = 0;          // device memory held from the start, to move every later buffer
  int64_t pad_weights_mib = 0;  // held in each cell before its weights (moves weights and work buffers)
  int64_t pad_work_mib = 0;     // held in each cell after its weights (moves workspaces and outputs)
  bool l2_whh = false;          // an L2 persisting window over layer 0's weight_hh (an experiment)
};

std::string row_names() {
  std::string s;
  for (const auto& r : lstm::lstm_backends()) s += r.name + ", ";
  return s + kAuto;
}

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "bench_gpu_lstm: " << msg << "\n"
            << "usage: bench_gpu_lstm [--suites-file FILE] [--suite NAME]... [--dtype fp32|tf32|bf16|fp16]...\n"
            << "         [--mode infer|train]... [--algos LIST] [--baseline-suite NAME]... [--repeats N>=10]\n"
            << "         [--warmup N>=1] [--out FILE] [--quick] [--cases-per-suite N] [--check]\n"
            << "         [--check-suite NAME]... [--check-max-gflop G] [--budget-s S] [--max-cell-s S]\n"
            << "         [--no-ceilings] [--gemm-size N] [--copy-mib N] [--case ID]... [--list]\n"
            << "         [--graphs auto|on|off] [--cooldown-ms N] [--pad-mib N] [--pad-weights-mib N]\n"
            << "         [--pad-work-mib N] [--l2-whh]\n"
            << "  --algos: comma list of backend names (this binary: " << row_names() << "),\n"
            << "           or PREFIX* for every backend whose name starts with PREFIX; baselines run\n"
            << "           only on --baseline-suite suites (default paper)\n";
  std::exit(2);
}

using lstm::bench::split_commas;
int64_t parse_int(const std::string& flag, const std::string& s, int64_t min_value) {
  return lstm::bench::parse_int(flag, s, min_value, usage_error);
}
double parse_double(const std::string& flag, const std::string& s) { return lstm::bench::parse_double(flag, s, usage_error); }

// The suite file's dtype names; f32/f16 are accepted as aliases.
std::string normalize_dtype(const std::string& d) {
  if (d == "fp32" || d == "f32") return "fp32";
  if (d == "tf32") return "tf32";
  if (d == "bf16") return "bf16";
  if (d == "fp16" || d == "f16") return "fp16";
  usage_error("unknown dtype '" + d + "' (expected fp32, tf32, bf16 or fp16)");
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// --algos items as names: row names and auto as given, PREFIX* expanded in registry order.
std::vector<std::string> expand_algos(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  auto add = [&](const std::string& n) {
    if (!contains(out, n)) out.push_back(n);
  };
  for (const auto& a : items) {
    if (a == kAuto) {
      add(a);
    } else if (!a.empty() && a.back() == '*') {
      const std::string prefix = a.substr(0, a.size() - 1);
      bool any = false;
      for (const auto& r : lstm::lstm_backends())
        if (r.name.compare(0, prefix.size(), prefix) == 0) {
          add(r.name);
          any = true;
        }
      if (!any)
        usage_error("--algos: no backend name starts with '" + prefix + "' (this binary: " + row_names() + ")");
    } else {
      try {
        add(lstm::lstm_backend_entry(a).name);
      } catch (const std::exception&) {
        usage_error("--algos: unknown backend '" + a + "' (this binary: " + row_names() + ")");
      }
    }
  }
  return out;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto append = [&](std::vector<std::string>& v) {
      for (auto& s : split_commas(value())) v.push_back(s);
    };
    if (a == "--suites-file") {
      o.suites_file = value();
    } else if (a == "--suite") {
      append(o.suites);
    } else if (a == "--dtype") {
      std::vector<std::string> d;
      append(d);
      for (auto& s : d) o.dtypes.push_back(normalize_dtype(s));
    } else if (a == "--mode") {
      std::vector<std::string> m;
      append(m);
      for (auto& s : m) {
        if (s != "infer" && s != "train") usage_error("--mode accepts infer and train, got '" + s + "'");
        o.modes.push_back(s);
      }
    } else if (a == "--algos") {
      append(o.algos);
    } else if (a == "--baseline-suite" || a == "--naive-suite") {
      if (!o.baseline_suites_given) o.baseline_suites.clear();
      o.baseline_suites_given = true;
      append(o.baseline_suites);
    } else if (a == "--repeats") {
      o.repeats = static_cast<int>(parse_int(a, value(), 10));
      o.repeats_given = true;
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(parse_int(a, value(), 1));
      o.warmup_given = true;
    } else if (a == "--out") {
      o.out = value();
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--cases-per-suite") {
      o.cases_per_suite = static_cast<int>(parse_int(a, value(), 1));
    } else if (a == "--check") {
      o.check_all = true;
    } else if (a == "--check-suite") {
      append(o.check_suites);
    } else if (a == "--check-max-gflop") {
      o.check_max_gflop = parse_double(a, value());
    } else if (a == "--budget-s") {
      o.budget_s = parse_double(a, value());
    } else if (a == "--max-cell-s") {
      o.max_cell_s = parse_double(a, value());
    } else if (a == "--no-ceilings") {
      o.ceilings = false;
    } else if (a == "--gemm-size") {
      o.gemm_n = parse_int(a, value(), 256);
    } else if (a == "--copy-mib") {
      o.copy_mib = parse_int(a, value(), 1);
    } else if (a == "--case") {
      append(o.case_ids);
    } else if (a == "--list") {
      o.list = true;
    } else if (a == "--graphs") {
      const std::string v = value();
      try {
        o.graphs = lstm::graph_mode_from_name(v, "--graphs");
      } catch (const std::exception& e) {
        usage_error(e.what());
      }
    } else if (a == "--cooldown-ms") {
      o.cooldown_ms = parse_double(a, value());  // rejects negative numbers
    } else if (a == "--l2-whh") {
      o.l2_whh = true;
    } else if (a == "--pad-mib") {
      o.pad_mib = parse_int(a, value(), 0);
    } else if (a == "--pad-weights-mib") {
      o.pad_weights_mib = parse_int(a, value(), 0);
    } else if (a == "--pad-work-mib") {
      o.pad_work_mib = parse_int(a, value(), 0);
    } else if (a == "-h" || a == "--help") {
      usage_error("help");
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  o.algos = expand_algos(o.algos);
  // --quick is a smoke test of the harness: the first case of each suite, two dtypes, the
  // smallest repeat count the suites allow, small ceilings. Its numbers are not to be quoted.
  if (o.quick) {
    if (!o.repeats_given) o.repeats = 10;
    if (!o.warmup_given) o.warmup = 1;
    if (o.cases_per_suite == 0) o.cases_per_suite = 1;
    if (o.dtypes.empty()) o.dtypes = {"fp32", "bf16"};
    o.gemm_n = std::min<int64_t>(o.gemm_n, 4096);
    o.copy_mib = std::min<int64_t>(o.copy_mib, 256);
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// The plan: cases, dtypes, modes, backends (host only; --list prints it without a GPU)
// ---------------------------------------------------------------------------------------------
struct CaseSpec {
  int64_t L = 1, H = 0, I = 0, B = 0, T = 0;
  bool bidir = false;
  std::vector<std::string> suites;  // every selected suite that lists this shape

  std::string id() const {
    return "L" + std::to_string(L) + "-H" + std::to_string(H) + "-I" + std::to_string(I) + "-B" + std::to_string(B) +
           "-T" + std::to_string(T) + (bidir ? "-bi" : "");
  }
  lstm::LstmSpec spec() const {
    lstm::LstmSpec s;
    s.input_size = I;
    s.hidden_size = H;
    s.num_layers = L;
    s.bidirectional = bidir;
    return s;
  }
  int64_t D() const { return bidir ? 2 : 1; }
  lstm::Shape x_shape() const { return {T, B, I}; }
  lstm::Shape out_shape() const { return {T, B, D() * H}; }
  double gflop(bool train) const {
    double f = 0;
    for (int64_t l = 0; l < L; ++l) {
      const double in = static_cast<double>(l == 0 ? I : D() * H);
      f += 2.0 * 4.0 * static_cast<double>(H) * (in + static_cast<double>(H)) * static_cast<double>(B) *
           static_cast<double>(T) * static_cast<double>(D());
    }
    return f * (train ? 3.0 : 1.0) * 1e-9;
  }
};

struct DtypeSel {
  lstm::DType dtype;
  bool tf32;
};
DtypeSel dtype_sel(const std::string& d) {
  if (d == "fp32") return {lstm::DType::F32, false};
  if (d == "tf32") return {lstm::DType::F32, true};
  if (d == "bf16") return {lstm::DType::BF16, false};
  return {lstm::DType::F16, false};
}

// The options of every cell: only the dtype's math mode and --graphs vary.
lstm::LstmOptions cell_options(const Options& opt, const DtypeSel& ds) {
  lstm::LstmOptions o;
  o.algo = lstm::Algo::Auto;  // read only by "auto"; a named row ignores it
  o.allow_tf32 = ds.tf32;
  o.cuda_graphs = opt.graphs;
  // auto measures in this process, so that a run's picks never hang on an earlier run's cache.
  o.auto_cache = "-";
  return o;
}

bool is_baseline(const std::string& algo) { return algo != kAuto && lstm::lstm_backend_entry(algo).baseline; }

// Baselines are kept for comparison on the suites that compare with them, not timed everywhere.
bool runs_case(const Options& opt, const std::string& algo, const CaseSpec& c) {
  if (!is_baseline(algo)) return true;
  for (const auto& s : c.suites)
    if (contains(opt.baseline_suites, s)) return true;
  return false;
}

struct Cell {
  size_t c;
  std::string mode, dtype, algo;
};

struct Plan {
  std::vector<CaseSpec> cases;
  std::vector<std::string> suites, dtypes, modes, algos;
  std::string algos_note;  // how the default algos were chosen
  std::vector<Cell> cells;
  std::set<size_t> check_cases;
};

int64_t get_int(const json& c, const char* key, int64_t dflt) {
  if (!c.contains(key)) return dflt;
  if (!c[key].is_number_integer() || c[key].get<int64_t>() < 1)
    throw lstm::Error(std::string("suites file: '") + key + "' must be a positive integer in " + c.dump());
  return c[key].get<int64_t>();
}

// Every registry row that accepts at least one cell of the plan on the GPU (its why_not, host-side
// checks only), then auto. Without a usable GPU the rows cannot say, so every row is listed.
std::vector<std::string> default_algos(const Options& opt, Plan& p) {
  std::vector<std::string> algos;
  const bool gpu = lstm::cuda_available();
  for (const auto& r : lstm::lstm_backends()) {
    bool any = !gpu;
    for (size_t c = 0; c < p.cases.size() && !any; ++c) {
      if (!runs_case(opt, r.name, p.cases[c])) continue;
      for (const auto& d : p.dtypes) {
        const DtypeSel ds = dtype_sel(d);
        if (r.why_not(p.cases[c].spec(), ds.dtype, lstm::Device::CUDA, cell_options(opt, ds)).empty()) {
          any = true;
          break;
        }
      }
    }
    if (any) algos.push_back(r.name);
  }
  algos.push_back(kAuto);
  p.algos_note = gpu ? "every backend that accepts a cell, then auto"
                     : "no usable GPU (" + lstm::cuda_unavailable_reason() +
                           "): every backend listed, whether it accepts the cells or not";
  return algos;
}

Plan make_plan(const Options& opt) {
  std::ifstream f(opt.suites_file);
  if (!f) throw lstm::Error("cannot read the suites file '" + opt.suites_file + "' (give --suites-file)");
  json doc;
  try {
    doc = json::parse(f);
  } catch (const std::exception& e) {
    throw lstm::Error("suites file '" + opt.suites_file + "' is not JSON: " + e.what());
  }
  if (!doc.contains("suites") || !doc["suites"].is_object())
    throw lstm::Error("suites file '" + opt.suites_file + "' has no \"suites\" object");
  Plan p;
  if (opt.suites.empty()) {
    for (auto it = doc["suites"].begin(); it != doc["suites"].end(); ++it) p.suites.push_back(it.key());
  } else {
    for (const auto& s : opt.suites) {
      if (!doc["suites"].contains(s)) {
        std::string names;
        for (auto it = doc["suites"].begin(); it != doc["suites"].end(); ++it) names += " " + it.key();
        usage_error("unknown suite '" + s + "' (the suites file has:" + names + ")");
      }
      if (!contains(p.suites, s)) p.suites.push_back(s);
    }
  }
  if (!opt.dtypes.empty()) {
    p.dtypes = opt.dtypes;
  } else if (doc.contains("dtypes")) {
    for (const auto& d : doc["dtypes"]) p.dtypes.push_back(normalize_dtype(d.get<std::string>()));
  } else {
    p.dtypes = {"fp32", "tf32", "bf16", "fp16"};
  }
  p.modes = opt.modes.empty() ? std::vector<std::string>{"infer", "train"} : opt.modes;

  std::map<std::string, size_t> by_id;
  for (const auto& s : p.suites) {
    const json& cases = doc["suites"][s]["cases"];
    int taken = 0;
    for (const auto& c : cases) {
      if (opt.cases_per_suite > 0 && taken >= opt.cases_per_suite) break;
      ++taken;
      CaseSpec cs;
      cs.L = get_int(c, "layers", 1);
      cs.H = get_int(c, "hidden", 0);
      cs.I = get_int(c, "input", cs.H);
      cs.B = get_int(c, "batch", 0);
      cs.T = get_int(c, "steps", 0);
      cs.bidir = c.value("bidirectional", false);
      if (cs.H < 1 || cs.B < 1 || cs.T < 1)
        throw lstm::Error("suites file: case without hidden/batch/steps: " + c.dump());
      if (!opt.case_ids.empty() && !contains(opt.case_ids, cs.id())) continue;
      auto it = by_id.find(cs.id());
      size_t idx;
      if (it == by_id.end()) {
        idx = p.cases.size();
        by_id[cs.id()] = idx;
        p.cases.push_back(cs);
      } else {
        idx = it->second;
      }
      if (!contains(p.cases[idx].suites, s)) p.cases[idx].suites.push_back(s);
      if (opt.check_all || contains(opt.check_suites, s))
        if (p.cases[idx].gflop(true) <= opt.check_max_gflop) p.check_cases.insert(idx);
    }
  }

  for (const auto& id : opt.case_ids) {
    bool found = false;
    for (const auto& c : p.cases) found = found || c.id() == id;
    if (!found) usage_error("--case: no case of the chosen suites has the id '" + id + "' (see --list)");
  }

  p.algos = opt.algos.empty() ? default_algos(opt, p) : opt.algos;
  if (!opt.algos.empty()) p.algos_note = "--algos";
  // Cells: one pass per backend in the order of p.algos; within a pass, the cheapest cells first,
  // so that a time budget cuts the most expensive measurements of the last backends.
  for (const auto& algo : p.algos) {
    std::vector<Cell> pass;
    for (size_t c = 0; c < p.cases.size(); ++c) {
      if (!runs_case(opt, algo, p.cases[c])) continue;
      for (const auto& d : p.dtypes)
        for (const auto& m : p.modes) pass.push_back({c, m, d, algo});
    }
    std::stable_sort(pass.begin(), pass.end(), [&](const Cell& a, const Cell& b) {
      return p.cases[a.c].gflop(a.mode == "train") < p.cases[b.c].gflop(b.mode == "train");
    });
    p.cells.insert(p.cells.end(), pass.begin(), pass.end());
  }
  return p;
}

[[maybe_unused]] json case_row(const CaseSpec& c, const Cell& cell) {
  json r;
  r["kind"] = "result";
  r["impl"] = "ours";
  r["suite"] = c.suites.front();
  r["case"] = c.id();
  r["L"] = c.L;
  r["H"] = c.H;
  r["I"] = c.I;
  r["B"] = c.B;
  r["T"] = c.T;
  r["bidirectional"] = c.bidir;
  r["mode"] = cell.mode;
  r["dtype"] = cell.dtype;
  r["algo"] = cell.algo;
  r["baseline"] = is_baseline(cell.algo);
  r["gflop"] = c.gflop(cell.mode == "train");
  return r;
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s += ' ';
    s += argv[i];
  }
  return s;
}

void write_line(std::ofstream& out, const json& j) {
  // Flushed per line so that a run cut short by a time limit keeps what it measured.
  if (out.is_open()) out << j.dump() << "\n" << std::flush;
}

// One string per non-empty line of a backend's log().
[[maybe_unused]] std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) v.push_back(line);
  return v;
}

#if LSTM_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// The GPU part
// ---------------------------------------------------------------------------------------------
using lstm::DType;
using lstm::Device;
using lstm::Tensor;
using lstm::bench::percentile;

// Relative L2 tolerances against the float64 CPU reference: DESIGN.md's per-layer output
// tolerance times the layer count (errors compound through a stack); gradients, which also sum
// over every step and flow back through every layer, 5x that. The check is there to show that
// a baseline computes a real LSTM on the benchmark's data (any indexing or transpose bug gives
// errors near 1); the tests hold the backends to DESIGN.md's numbers.
std::pair<double, double> tolerances(const std::string& d, int64_t layers) {
  const double base = d == "fp32" ? 1e-5 : d == "tf32" ? 1e-3 : 2e-2;
  const double out = base * static_cast<double>(layers);
  return {out, std::min(5 * out, 0.2)};
}

uint64_t seed_of(size_t a, size_t b, size_t c = 0) {
  return 0x5eedULL + 1000003ULL * a + 7919ULL * b + 104729ULL * c;
}

int64_t largest_slot(const Plan& plan) {
  int64_t n = 0;
  for (const auto& c : plan.cases)
    n = std::max(n, lstm::bench::InputRotation::slot_elems(c.x_shape(), c.out_shape()));
  return n;
}

class GpuBench {
 public:
  GpuBench(const Options& opt, const Plan& plan, std::ofstream& out)
      : opt_(opt), plan_(plan), out_(out), inputs_(largest_slot(plan)), cooldown_(opt.cooldown_ms) {}

  json header(int argc, char** argv) {
    json h;
    h["kind"] = "header";
    h["impl"] = "ours";
    h["date"] = now_iso();
    auto gpus = lstm::cuda_devices();
    h["gpu"] = gpus.empty() ? "" : gpus[0].name;
    json list = json::array();
    for (const auto& g : gpus)
      list.push_back({{"index", g.index},
                      {"name", g.name},
                      {"cc", std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor)},
                      {"sms", g.sms},
                      {"memory_gib", static_cast<double>(g.memory_bytes) / (1 << 30)},
                      {"clock_ghz", g.clock_ghz},
                      {"memory_bandwidth_gbs", g.memory_bandwidth_gbs}});
    h["gpus"] = list;
    h["l2_mib"] = static_cast<double>(inputs_.l2_bytes()) / (1 << 20);
    h["versions"] = lstm::cuda_versions();
    h["command"] = command_line(argc, argv);
    h["engine_stream"] = lstm::cuda::stream() == cudaStreamLegacy ? "legacy default stream" : "own non-blocking stream";
    if (const char* g = std::getenv("LSTM_CHECK_GIT_COMMIT")) h["git_commit"] = g;
    json backends = json::array();
    for (const auto& r : lstm::lstm_backends())
      backends.push_back({{"name", r.name}, {"summary", r.summary}, {"baseline", r.baseline}});
    h["backends"] = backends;
    h["suites_file"] = opt_.suites_file;
    h["suites"] = plan_.suites;
    h["dtypes"] = plan_.dtypes;
    h["modes"] = plan_.modes;
    h["algos"] = plan_.algos;
    h["algos_chosen"] = plan_.algos_note;
    h["baseline_suites"] = opt_.baseline_suites;
    h["repeats"] = opt_.repeats;
    h["warmup"] = opt_.warmup;
    h["cuda_graphs"] = lstm::graph_mode_name(opt_.graphs);
    h["max_cell_s"] = opt_.max_cell_s;
    h["cooldown_ms"] = opt_.cooldown_ms;
    h["pad_mib"] = opt_.pad_mib;
    h["pad_weights_mib"] = opt_.pad_weights_mib;
    h["pad_work_mib"] = opt_.pad_work_mib;
    h["budget_s"] = opt_.budget_s;
    h["quick"] = opt_.quick;
    h["cells"] = plan_.cells.size();
    return h;
  }

  // ---- the GPU's ceilings ----
  void ceilings() {
    for (const std::string d : {"bf16", "fp16", "tf32", "fp32"}) {
      json row;
      try {
        row = gemm_ceiling(d, opt_.gemm_n);
      } catch (const std::exception& e) {
        row = {{"kind", "ceiling"}, {"impl", "ours"}, {"what", "gemm"}, {"dtype", d}, {"error", e.what()}};
      }
      print_ceiling(row);
      write_line(out_, row);
    }
    json row;
    try {
      row = copy_ceiling(static_cast<size_t>(opt_.copy_mib) << 20);
    } catch (const std::exception& e) {
      row = {{"kind", "ceiling"}, {"impl", "ours"}, {"what", "copy"}, {"error", e.what()}};
    }
    print_ceiling(row);
    write_line(out_, row);
    lstm::arena_release_cached();
  }

  // ---- the LSTM cells ----
  // Returns the number of failed correctness checks.
  int run_cells() {
    const auto t0 = std::chrono::steady_clock::now();
    size_t ok = 0, errors = 0, not_run = 0, capped = 0;
    for (size_t i = 0; i < plan_.cells.size(); ++i) {
      const Cell& cell = plan_.cells[i];
      const CaseSpec& c = plan_.cases[cell.c];
      json row = case_row(c, cell);
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!fatal_.empty()) {
        row["error"] = "not run: an earlier CUDA error left the device unusable: " + fatal_;
      } else if (opt_.budget_s > 0 && elapsed > opt_.budget_s) {
        row["error"] = "not run: the time budget (--budget-s " + fmt(opt_.budget_s, 0) + ") was spent";
      } else {
        run_cell(cell, row);
      }
      if (row.contains("error")) {
        const std::string e = row["error"].get<std::string>();
        (e.rfind("not run:", 0) == 0 ? not_run : errors)++;
      } else {
        ok++;
        if (row.value("capped", false)) capped++;
      }
      print_row(i, row);
      for (const auto& s : c.suites) {
        row["suite"] = s;
        write_line(out_, row);
      }
    }
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("bench_gpu_lstm: %zu cells in %.1f s: %zu measured (%zu with capped repeats), %zu rejected or failed, "
                "%zu not run; %d failed correctness check(s)\n",
                plan_.cells.size(), total, ok, capped, errors, not_run, check_failures_);
    return check_failures_;
  }

 private:
  static std::string fmt(double v, int prec) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.*f", prec, v);
    return b;
  }

  void print_ceiling(const json& r) {
    if (r.contains("error")) {
      std::printf("ceiling %-4s %-5s error: %s\n", r["what"].get<std::string>().c_str(),
                  r.value("dtype", std::string("")).c_str(), r["error"].get<std::string>().c_str());
    } else if (r["what"] == "gemm") {
      std::printf("ceiling gemm %-5s %lldx%lldx%lld: %.3f ms, %.1f TFLOP/s\n", r["dtype"].get<std::string>().c_str(),
                  static_cast<long long>(r["m"].get<int64_t>()), static_cast<long long>(r["n"].get<int64_t>()),
                  static_cast<long long>(r["k"].get<int64_t>()), r["ms"].get<double>(), r["tflops"].get<double>());
    } else {
      std::printf("ceiling copy %.0f MiB device-to-device: %.3f ms, %.0f GB/s (read + write)\n",
                  r["bytes"].get<double>() / (1 << 20), r["ms"].get<double>(), r["gbs"].get<double>());
    }
    std::fflush(stdout);
  }

  void print_row(size_t i, const json& r) {
    std::printf("[%4zu/%zu] %-28s %-26s %-5s %-4s ", i + 1, plan_.cells.size(), r["algo"].get<std::string>().c_str(),
                r["case"].get<std::string>().c_str(), r["mode"].get<std::string>().c_str(),
                r["dtype"].get<std::string>().c_str());
    if (r.contains("error")) {
      std::string e = r["error"].get<std::string>();
      if (e.size() > 160) e = e.substr(0, 157) + "...";
      std::printf("error: %s\n", e.c_str());
    } else {
      std::printf("%9.3f ms (min %.3f, p90 %.3f, n=%d%s) %8.2f us/step %7.2f TFLOP/s %8.1f MiB", r["ms"].get<double>(),
                  r["ms_min"].get<double>(), r["ms_p90"].get<double>(), r["repeats"].get<int>(),
                  r["capped"].get<bool>() ? ", capped" : "", r["us_per_step"].get<double>(), r["tflops"].get<double>(),
                  r["peak_mib"].get<double>());
      if (r.contains("host_us_per_call")) std::printf(" host %.0f us/call", r["host_us_per_call"].get<double>());
      if (r.contains("sm_mhz")) std::printf(" @%.0f MHz", r["sm_mhz"].get<double>());
      if (r.contains("ran") && !r["ran"].get<std::string>().empty())
        std::printf(" [%s]", r["ran"].get<std::string>().c_str());
      if (r.contains("check")) std::printf(" check %s", r["check"]["pass"].get<bool>() ? "ok" : "FAILED");
      std::printf("\n");
    }
    std::fflush(stdout);
  }

  // GEMM rate through cuBLAS on random data: C = A B, n x n x n; bf16/fp16 in and out with fp32
  // accumulation, tf32 = fp32 data on TF32 tensor cores, fp32 = plain fp32 (no TF32).
  json gemm_ceiling(const std::string& d, int64_t n) {
    DType dt = d == "bf16" ? DType::BF16 : d == "fp16" ? DType::F16 : DType::F32;
    cudaDataType_t ct = d == "bf16" ? CUDA_R_16BF : d == "fp16" ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t comp = d == "tf32" ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    Tensor A = Tensor::empty({n, n}, dt, Device::CUDA), B = Tensor::empty({n, n}, dt, Device::CUDA);
    Tensor C = Tensor::empty({n, n}, dt, Device::CUDA);
    lstm::bench::fill_uniform(A.raw(), dt, A.numel(), -1.0f, 1.0f, 11);
    lstm::bench::fill_uniform(B.raw(), dt, B.numel(), -1.0f, 1.0f, 12);
    // Our own handle with a workspace as large as PyTorch gives cuBLAS on Hopper, and default
    // math (no TF32 unless the compute type asks for it).
    cublasHandle_t h = nullptr;
    LSTM_CUDA_CHECK(cublasCreate(&h));
    std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, decltype(&cublasDestroy)> guard(h, &cublasDestroy);
    lstm::cuda::DeviceBuffer ws(size_t(64) << 20);
    LSTM_CUDA_CHECK(cublasSetStream(h, lstm::cuda::stream()));
    LSTM_CUDA_CHECK(cublasSetWorkspace(h, ws.get(), ws.size()));
    LSTM_CUDA_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    const float alpha = 1.0f, beta = 0.0f;
    const int ni = static_cast<int>(n);
    auto run = [&](int) {
      LSTM_CUDA_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, A.raw(), ct, ni, B.raw(), ct, ni,
                                   &beta, C.raw(), ct, ni, comp, CUBLAS_GEMM_DEFAULT));
    };
    timer_.time(0, 3, nullptr, run);
    std::vector<double> ms = timer_.time(0, 20, nullptr, run);
    const double med = percentile(ms, 0.5);
    LSTM_REQUIRE(lstm::bench::count_non_finite(C.raw(), dt, C.numel()) == 0, "GEMM ceiling: non-finite result");
    return {{"kind", "ceiling"},
            {"impl", "ours"},
            {"what", "gemm"},
            {"dtype", d},
            {"m", n},
            {"n", n},
            {"k", n},
            {"ms", med},
            {"ms_min", percentile(ms, 0)},
            {"repeats", ms.size()},
            {"tflops", 2.0 * std::pow(static_cast<double>(n), 3) / (med * 1e-3) * 1e-12},
            {"note", d == "fp32" ? "cublasGemmEx, fp32 compute without TF32"
                                 : d == "tf32" ? "cublasGemmEx, fp32 data, CUBLAS_COMPUTE_32F_FAST_TF32"
                                               : "cublasGemmEx, " + d + " in and out, fp32 accumulation"}};
  }

  json copy_ceiling(size_t bytes) {
    Tensor src = Tensor::empty({static_cast<int64_t>(bytes / 4)}, DType::F32, Device::CUDA);
    Tensor dst = Tensor::empty({static_cast<int64_t>(bytes / 4)}, DType::F32, Device::CUDA);
    lstm::bench::fill_uniform(src.raw(), DType::F32, src.numel(), -1.0f, 1.0f, 13);
    auto run = [&](int) {
      LSTM_CUDA_CHECK(
          cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, lstm::cuda::stream()));
    };
    timer_.time(0, 3, nullptr, run);
    std::vector<double> ms = timer_.time(0, 20, nullptr, run);
    const double med = percentile(ms, 0.5);
    return {{"kind", "ceiling"},
            {"impl", "ours"},
            {"what", "copy"},
            {"bytes", static_cast<double>(src.nbytes())},
            {"ms", med},
            {"ms_min", percentile(ms, 0)},
            {"repeats", ms.size()},
            {"gbs", 2.0 * static_cast<double>(src.nbytes()) / (med * 1e-3) * 1e-9},
            {"note", "cudaMemcpyAsync device to device; bytes read + written"}};
  }

  // The float64 CPU reference of a case in one storage dtype (same weights and inputs as every
  // row of that case and dtype; cached, as the values depend on the case and dtype only).
  struct Reference {
    Tensor out, dx;
    std::vector<Tensor> dw;
  };
  const Reference& reference(size_t case_index, DType dt, const std::vector<Tensor>& w, const Tensor& x,
                             const Tensor& dout) {
    auto key = std::make_pair(case_index, static_cast<int>(dt));
    auto it = refs_.find(key);
    const bool needs_grads = dout.defined() && dout.numel() > 0;
    if (it != refs_.end() && (!needs_grads || it->second.dx.defined())) return it->second;
    if (it != refs_.end()) refs_.erase(it);
    const lstm::LstmSpec spec = plan_.cases[case_index].spec();
    std::vector<Tensor> w64, dw64;
    for (const auto& t : w) {
      w64.push_back(t.cpu().to(DType::F64));
      dw64.push_back(Tensor::zeros(t.shape(), DType::F64));
    }
    lstm::LstmOptions o;
    o.algo = lstm::Algo::Reference;
    auto rb = lstm::make_lstm_backend(o, spec, DType::F64, Device::CPU);
    const lstm::ExecContext cpu = lstm::ExecContext::cpu();
    lstm::LstmInput in;
    in.x = x.cpu().to(DType::F64);
    lstm::Rng rng(1);
    std::unique_ptr<lstm::LstmSaved> saved;
    Reference r;
    r.out = rb->forward(w64, in, true, &rng, &saved, cpu).output;
    // An inference cell has no d_output; a training cell of the same case computes the gradients
    // when it comes (the entry is made again then).
    if (dout.defined() && dout.numel() > 0) {
      lstm::LstmGradOutput g;
      g.d_output = dout.cpu().to(DType::F64);
      r.dx = rb->backward(w64, *saved, g, dw64, cpu).d_x;
      r.dw = dw64;
    }
    return refs_.emplace(key, std::move(r)).first->second;
  }

  void run_cell(const Cell& cell, json& row) {
    const CaseSpec& c = plan_.cases[cell.c];
    const bool train = cell.mode == "train";
    const DtypeSel ds = dtype_sel(cell.dtype);
    try {
      const lstm::LstmSpec spec = c.spec();
      const lstm::ExecContext ctx = lstm::ExecContext::current(Device::CUDA);
      // Views into the pool (made on first use), one per call the cell can make.
      lstm::bench::InputRotation::Views in =
          inputs_.take(ds.dtype, c.x_shape(), train ? c.out_shape() : lstm::Shape{},
                       2 * opt_.warmup + kMaxExtraWarmup + opt_.repeats + 1);
      lstm::cuda_synchronize();
      const size_t base = lstm::arena_stats().in_use_bytes;
      lstm::arena_reset_peak();

      std::unique_ptr<lstm::LstmBackend> be;
      lstm::LstmBackend::FlatLayout layout;
      try {
        const lstm::LstmOptions o = cell_options(opt_, ds);
        be = cell.algo == kAuto ? lstm::make_lstm_backend(o, spec, ds.dtype, Device::CUDA)
                                : lstm::make_lstm_backend(cell.algo, o, spec, ds.dtype, Device::CUDA);
        layout = be->flat_layout(ds.dtype);
      } catch (const std::exception&) {
        row["rejected"] = true;  // the backend refused the case up front (not a failure while running)
        throw;
      }
      const Tensor pad_w = lstm::bench::held_mib(opt_.pad_weights_mib);
      std::vector<Tensor> w = lstm::make_flat_weights(spec, layout, ds.dtype, Device::CUDA);
      const Tensor pad_work = lstm::bench::held_mib(opt_.pad_work_mib);
      const float k = 1.0f / std::sqrt(static_cast<float>(c.H));
      if (!layout.offsets.empty())  // the gaps of the flat buffer too, so nothing is uninitialised
        lstm::bench::fill_uniform(static_cast<char*>(w[0].raw()) - layout.offsets[0], ds.dtype,
                                  static_cast<int64_t>(layout.bytes / lstm::dtype_size(ds.dtype)), -k, k, 77);
      for (size_t i = 0; i < w.size(); ++i)
        lstm::bench::fill_uniform(w[i].raw(), ds.dtype, w[i].numel(), -k, k, seed_of(cell.c, i));
      std::vector<Tensor> dw;
      if (train) dw = lstm::make_flat_weights(spec, layout, ds.dtype, Device::CUDA);
      lstm::bench::L2Window l2win;
      if (opt_.l2_whh) {
        const Tensor& whh = w[static_cast<size_t>(spec.slots(0, 0).w_hh)];
        const auto set = l2win.set(whh.raw(), whh.nbytes());
        row["l2_window"] = {{"persisting_bytes", set.persisting_bytes},
                            {"window_bytes", set.window_bytes},
                            {"hit_ratio", set.hit_ratio}};
      }
      auto zero_dw = [&](int) {
        if (!train) return;
        if (!layout.offsets.empty())
          LSTM_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(dw[0].raw()) - layout.offsets[0], 0, layout.bytes,
                                          lstm::cuda::stream()));
        else
          for (auto& t : dw) t.zero_();
      };

      lstm::LstmInput lin;
      lstm::LstmGradOutput gout;
      lstm::LstmOutput out;
      lstm::LstmGrads grads;
      lstm::Rng rng(seed_of(cell.c, 999));
      const size_t nbuf = in.xs.size();
      auto run = [&](int i) {
        const size_t b = static_cast<size_t>(i) % nbuf;
        out = lstm::LstmOutput{};
        grads = lstm::LstmGrads{};
        lin.x = in.xs[b];
        if (train) {
          std::unique_ptr<lstm::LstmSaved> saved;
          out = be->forward(w, lin, true, &rng, &saved, ctx);
          gout.d_output = in.douts[b];
          grads = be->backward(w, *saved, gout, dw, ctx);
        } else {
          out = be->forward(w, lin, false, nullptr, nullptr, ctx);
        }
      };

      const double cooldown = cooldown_.before_cell();
      // Warm-up (also builds plans, JIT-compiled kernels and arena blocks), then the repeats. The
      // warm-up goes on until the backend has settled how the cell's calls run (CUDA graphs under
      // "auto": a few measured eager calls, a capture and a few measured replays; auto's timing
      // of every backend), at most kMaxExtraWarmup more calls.
      std::vector<double> wms = timer_.time(0, opt_.warmup, zero_dw, run);
      int warmup = opt_.warmup;
      while (!be->settled() && warmup < opt_.warmup + kMaxExtraWarmup) {
        wms.push_back(timer_.time(warmup, 1, zero_dw, run)[0]);
        ++warmup;
      }
      // Settling took calls bench_gpu_torch.py does not make: idle again and warm up afresh, so
      // the timed calls start from the same history as PyTorch's (Cooldown::after_settling).
      double settle_cooldown = 0;
      if (cooldown_.limit_ms() > 0 && warmup > opt_.warmup) {
        double settle_busy = 0;
        for (double t : wms) settle_busy += t;
        settle_cooldown = cooldown_.after_settling(settle_busy);
        for (double t : timer_.time(warmup, opt_.warmup, zero_dw, run)) wms.push_back(t);
        warmup += opt_.warmup;
      }
      const double probe = wms.back();
      int repeats = opt_.repeats;
      bool capped = false;
      const std::string best_key = c.id() + "/" + cell.mode + "/" + cell.dtype;
      auto best = best_ms_.find(best_key);
      if (opt_.max_cell_s > 0 && best != best_ms_.end() && probe > 3.0 * best->second &&
          probe * repeats > opt_.max_cell_s * 1e3) {
        repeats = std::clamp(static_cast<int>(opt_.max_cell_s * 1e3 / probe), 1, opt_.repeats);
        capped = repeats < opt_.repeats;
      }
      std::vector<double> host_us;
      std::vector<double> ms = timer_.time(warmup, repeats, zero_dw, run, &host_us);
      const double sm_mhz = lstm::bench::sm_clock_mhz(timer_);  // the clock the loop above ran at
      for (double t : wms) cooldown_.busy(t);
      for (double t : ms) cooldown_.busy(t);

      // A timing of a computation that went non-finite is no timing.
      const Tensor& o = out.output;
      LSTM_REQUIRE(o.defined() && lstm::bench::count_non_finite(o.raw(), o.dtype(), o.numel()) == 0,
                   "non-finite (or missing) output");
      if (train) {
        const Tensor& dx = grads.d_x;
        LSTM_REQUIRE(dx.defined() && lstm::bench::count_non_finite(dx.raw(), dx.dtype(), dx.numel()) == 0,
                     "non-finite (or missing) d_x");
        for (const auto& t : dw)
          LSTM_REQUIRE(lstm::bench::count_non_finite(t.raw(), t.dtype(), t.numel()) == 0,
                       "non-finite weight gradient");
      }
      const lstm::ArenaStats st = lstm::arena_stats();
      const size_t peak = st.peak_in_use_bytes > base ? st.peak_in_use_bytes - base : 0;

      const double med = percentile(ms, 0.5);
      row["ms"] = med;
      row["ms_min"] = percentile(ms, 0);
      row["ms_p90"] = percentile(ms, 0.9);
      row["us_per_step"] = med * 1e3 / static_cast<double>(c.T);
      row["tflops"] = row["gflop"].get<double>() / (med * 1e-3) * 1e-3;
      row["peak_mib"] = static_cast<double>(peak + in.x_bytes + in.dout_bytes) / (1 << 20);
      row["repeats"] = repeats;
      row["warmup"] = warmup;
      // How the backend ran the cell, in its own words: the last timed call (its backward, in
      // training), whether its decisions were made, its graphs over the whole cell (warm-up
      // included) and what it measured and decided (the backend is the cell's own).
      row["ran"] = be->last_run();
      row["graphs"] = lstm::graph_mode_name(opt_.graphs);
      row["settled"] = be->settled();
      const auto gc = be->graph_counts();
      row["graph_captures"] = gc.captures;
      row["graph_replays"] = gc.replays;
      row["log"] = lines_of(be->log());
      row["host_us_per_call"] = percentile(host_us, 0.5);
      row["sm_mhz"] = sm_mhz;
      row["first_call_ms"] = wms.front();
      row["capped"] = capped;
      row["cooldown_ms"] = cooldown;
      row["settle_cooldown_ms"] = settle_cooldown;
      row["input_buffers"] = nbuf;
      if (!best_ms_.count(best_key) || med < best_ms_[best_key]) best_ms_[best_key] = med;

      if (plan_.check_cases.count(cell.c)) {
        const Reference& ref = reference(cell.c, ds.dtype, w, in.x0, in.dout0);
        in.xs[0] = in.x0;
        if (train) in.douts[0] = in.dout0;
        zero_dw(0);
        run(0);
        lstm::cuda_synchronize();
        const auto tol = tolerances(cell.dtype, c.L);
        json chk;
        const double e_out = lstm::rel_l2_error(out.output, ref.out);
        bool pass = e_out < tol.first;
        chk["output_rel_l2"] = e_out;
        if (train) {
          const double e_dx = lstm::rel_l2_error(grads.d_x, ref.dx);
          double e_dw = 0;
          for (size_t i = 0; i < dw.size(); ++i) e_dw = std::max(e_dw, lstm::rel_l2_error(dw[i], ref.dw[i]));
          chk["d_x_rel_l2"] = e_dx;
          chk["d_weights_rel_l2_max"] = e_dw;
          pass = pass && e_dx < tol.second && e_dw < tol.second;
        }
        chk["tolerance_output"] = tol.first;
        if (train) chk["tolerance_grads"] = tol.second;
        chk["reference"] = "CPU float64 reference backend, same weights, x and d_output";
        chk["pass"] = pass;
        if (!pass) ++check_failures_;
        row["check"] = chk;
      }
    } catch (const std::exception& e) {
      row["error"] = e.what();
      recover();
    }
  }

  // After a failed cell: clear a non-sticky error; a sticky one ends the measurements.
  void recover() {
    cudaError_t e = cudaStreamSynchronize(lstm::cuda::stream());
    (void)cudaGetLastError();
    if (e != cudaSuccess) {
      e = cudaStreamSynchronize(lstm::cuda::stream());
      (void)cudaGetLastError();
      if (e != cudaSuccess) fatal_ = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    }
  }

  const Options& opt_;
  const Plan& plan_;
  std::ofstream& out_;
  lstm::bench::EventTimer timer_;
  lstm::bench::InputRotation inputs_;
  lstm::bench::Cooldown cooldown_;
  std::map<std::pair<size_t, int>, Reference> refs_;
  std::map<std::string, double> best_ms_;
  std::string fatal_;
  int check_failures_ = 0;
};
#endif  // LSTM_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse_args(argc, argv);
  try {
    Plan plan = make_plan(opt);
    if (opt.list) {
      std::printf("%zu cases, %zu cells (suites:", plan.cases.size(), plan.cells.size());
      for (const auto& s : plan.suites) std::printf(" %s", s.c_str());
      std::printf("; checked cases: %zu; backends: %s)\n", plan.check_cases.size(), plan.algos_note.c_str());
      for (const auto& cell : plan.cells)
        std::printf("%-28s %-26s %-5s %-4s %10.2f GFLOP\n", cell.algo.c_str(), plan.cases[cell.c].id().c_str(),
                    cell.mode.c_str(), cell.dtype.c_str(), plan.cases[cell.c].gflop(cell.mode == "train"));
      return 0;
    }
    std::ofstream out;
    if (!opt.out.empty()) {
      out.open(opt.out, std::ios::out | std::ios::trunc);
      if (!out) {
        std::cerr << "bench_gpu_lstm: cannot write " << opt.out << "\n";
        return 2;
      }
    }
    if (!lstm::cuda_available()) {
      // Not an error: a CPU-only build or machine has nothing to measure; the header says why.
      const std::string why = lstm::cuda_unavailable_reason();
      std::printf("bench_gpu_lstm: nothing measured: %s\n", why.c_str());
      write_line(out, json{{"kind", "header"},
                           {"impl", "ours"},
                           {"date", now_iso()},
                           {"command", command_line(argc, argv)},
                           {"error", why}});
      return 0;
    }
#if LSTM_HAVE_CUDA
    // --pad-mib: held for the whole run, so every buffer after it lands elsewhere in memory.
    const Tensor pad = lstm::bench::held_mib(opt.pad_mib);
    GpuBench bench(opt, plan, out);
    json h = bench.header(argc, argv);
    write_line(out, h);
    std::printf("bench_gpu_lstm: %s; %s\n%zu cases x modes x dtypes x backends = %zu cells; warm-up %d, "
                "median of %d; budget %s, cap %.2f s per slow cell\n",
                h["gpu"].get<std::string>().c_str(), h["versions"].get<std::string>().c_str(), plan.cases.size(),
                plan.cells.size(), opt.warmup, opt.repeats,
                opt.budget_s > 0 ? (std::to_string(static_cast<int>(opt.budget_s)) + " s").c_str() : "none",
                opt.max_cell_s);
    std::fflush(stdout);
    if (opt.ceilings) bench.ceilings();
    const int failed_checks = bench.run_cells();
    return failed_checks ? 3 : 0;
#endif
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu_lstm: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
