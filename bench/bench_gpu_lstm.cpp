// GPU LSTM benchmark harness: the cases of bench/suites.json on our GPU algorithms (cuDNN through
// our backend, with each of cuDNN's RNN algorithms; our own kernels when built; the naive
// per-gate baseline of Appleyard et al. 2016 on the `paper` suite), plus the GPU's own ceilings
// (cuBLAS GEMM rates, device-to-device copy bandwidth) measured in the same run.
// scripts/bench_gpu_torch.py measures torch.nn.LSTM on the same cases and scripts/gpu_report.py
// merges both into tables, checks and plots. bench/README.md says how to run them.
//
//   bench_gpu_lstm [--suites-file FILE] [--suite NAME]... [--dtype fp32|tf32|bf16|fp16]...
//                  [--mode infer|train]... [--algos LIST] [--repeats N] [--warmup N] [--out FILE]
//                  [--quick] [--check | --check-suite NAME...] [--budget-s S] [--max-cell-s S]
//                  [--no-ceilings] [--list] [--graphs auto|on|off]
//
// --graphs sets LstmOptions::cuda_graphs for every cell through our backend (default auto, the
// library's default): cuDNN calls may then be replayed as CUDA graphs, and such a cell warms
// up until the backend has settled how the cell's calls run (CudnnLstmBackend::graphs_settled:
// under auto a few measured eager calls, a capture and a few measured replays; at most 30 extra
// calls). The row says "graphs" (the setting), "graphs_settled"
// and "graph" (how its last timed call ran, its backward in training: "replayed" or "eager"),
// "graph_captures" and "graph_decisions" (the backend's graph_log for the cell: auto's measured
// eager and replayed times and its verdict per shape, or why a shape runs eagerly).
//
// What one timed repeat is: infer = forward with nothing saved; train = training forward (saving
// for backward) + backward of a random d_output, weight gradients included (accumulated into
// weight-gradient buffers zeroed outside the timed region). Weights are views into the backend's
// flat buffer (make_flat_weights with flat_layout, as flatten_parameters does), U(-1/sqrt(H),
// 1/sqrt(H)); x and d_output ~ U(-1, 1) are views into one random pool per dtype (>= 4x the GPU's
// L2), each call reading the next slot of it, so that no call finds its inputs in L2. Each repeat
// is timed with CUDA events on the engine stream; the row carries the median, min and p90.
//
// Output (--out): JSON lines.
//   {"kind": "header", "impl": "ours", "date", "gpu", "gpus", "versions", "command", ...}
//   {"kind": "ceiling", "what": "gemm", "dtype", "m", "n", "k", "ms", "tflops", ...}
//   {"kind": "ceiling", "what": "copy", "bytes", "ms", "gbs" (read + write), ...}
//   {"kind": "result", "impl": "ours", "suite", "case", "L", "H", "I", "B", "T", "bidirectional",
//    "mode", "dtype", "algo", "ms", "ms_min", "ms_p90", "us_per_step", "tflops", "gflop",
//    "peak_mib", "repeats", "warmup", "capped", "host_us_per_call" (median host time to issue one
//    call), "sm_mhz" (SM clock measured right after the timed loop)[, "check"]}
//   A case an algorithm rejects (or that failed) is a result row with "error" instead of timings
//   ("rejected": true when the algorithm refused it before running: make_lstm_backend threw).
// algo is "cudnn:<cuDNN algorithm>", "naive", or an lstm::Algo name (fused, persistent, ...).
// peak_mib: the arena's peak in-use bytes over the case (weights, gradients, outputs, saved
// activations, workspaces) above what was in use before it, plus one x (and one d_output).
// gflop: 2*4H*(I_l+H)*B*T per layer l and direction forward, x3 for train (I_l = the layer's
// input size); tflops = gflop / median.
//
// Time limits: --budget-s caps the LSTM part of the run (cells not started in time are recorded
// with "error": "not run: ..."); cells run cheapest first within each algorithm, cuDNN standard
// first. --max-cell-s caps the repeats of a cell whose warm-up call already took more than 3x the
// fastest algorithm of the same case, mode and dtype (such a row says "capped": true and may have
// fewer than 10 repeats; it can never be the fastest).
//
// --cooldown-ms N (default 0): before a cell's warm-up the GPU idles for as long as the previous
// cell kept it busy (its warm-up and timed calls), at most N ms; the row says "cooldown_ms". A
// cell whose warm-up went on while CUDA graphs settled idles once more (as long as that warm-up
// kept the GPU busy, at most N ms; "settle_cooldown_ms") and warms up again with --warmup calls
// before the timed ones, so that they start from the same history as bench_gpu_torch.py's. The
// H200 caps its clock by a power average over about a second (nvidia-smi's SW power cap): after
// a GEMM-heavy cell, the next one ran at 1450-1650 MHz instead of 1980, by an amount that hangs on
// how many calls came before, which differs between benches (bench_gpu_torch.py has the same
// option; docs/PERFORMANCE.md, 2026-12-01 third session).
//
// --pad-mib N (default 0): N MiB of device memory taken before anything else and held for the
// run, so that every later buffer (weights, workspaces, outputs, inputs) lands elsewhere in
// device memory: to tell whether a cell's time hangs on where its buffers are. --pad-weights-mib
// N holds N MiB in each cell just before its weights are made (so the weights, workspaces and
// outputs move, the rotating inputs do not), --pad-work-mib N just after (only what the backend
// allocates at its first calls moves: workspaces, outputs, graph buffers): with --pad-mib, they
// tell which buffers the time hangs on. The header says all three.
// --l2-whh: each cell sets an L2 persisting access window on the engine stream over layer 0's
// weight_hh (as much of the L2 as the device lets persist; hit ratio = that / the window) and
// clears it after: to tell whether that placement dependence is the recurrent weights' L2 hits.
// Needs a stream of our own (LSTM_CUDA_STREAM=own); the row says "l2_window".
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
#include <thread>
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
#include "cudnn/lstm_cudnn.hpp"
#include "cudnn/lstm_cudnn_backend.hpp"
#include "gpu_bench_util.hpp"
#include "naive_lstm.hpp"
#endif

#ifndef LSTM_BENCH_SUITES
#define LSTM_BENCH_SUITES "bench/suites.json"
#endif

namespace {

using json = nlohmann::ordered_json;

// Warm-up calls a cell may add to --warmup while the backend settles its CUDA graph decision.
constexpr int kMaxExtraWarmup = 30;

struct Options {
  std::string suites_file = LSTM_BENCH_SUITES;
  std::vector<std::string> suites;  // empty: every suite of the file, in file order
  std::vector<std::string> dtypes;  // empty: the file's "dtypes"
  std::vector<std::string> modes;   // empty: infer, train
  std::vector<std::string> algos;   // empty: default_algos()
  std::vector<std::string> naive_suites{"paper"};
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
  std::string graphs = "auto";  // LstmOptions::cuda_graphs of every cell through our backend
  double cooldown_ms = 0;       // idle before a cell, up to the previous cell's busy time
  int64_t pad_mib = 0;          // device memory held from the start, to move every later buffer
  int64_t pad_weights_mib = 0;  // held in each cell before its weights (moves weights and work buffers)
  int64_t pad_work_mib = 0;     // held in each cell after its weights (moves workspaces and outputs)
  bool l2_whh = false;          // an L2 persisting window over layer 0's weight_hh (an experiment)
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "bench_gpu_lstm: " << msg << "\n"
            << "usage: bench_gpu_lstm [--suites-file FILE] [--suite NAME]... [--dtype fp32|tf32|bf16|fp16]...\n"
            << "         [--mode infer|train]... [--algos LIST] [--naive-suite NAME]... [--repeats N>=10]\n"
            << "         [--warmup N>=1] [--out FILE] [--quick] [--cases-per-suite N] [--check]\n"
            << "         [--check-suite NAME]... [--check-max-gflop G] [--budget-s S] [--max-cell-s S]\n"
            << "         [--no-ceilings] [--gemm-size N] [--copy-mib N] [--case ID]... [--list]\n"
            << "         [--graphs auto|on|off] [--cooldown-ms N] [--pad-mib N] [--pad-weights-mib N]\n"
            << "         [--pad-work-mib N] [--l2-whh]\n"
            << "  --algos: comma list of cudnn (all four cuDNN algorithms), cudnn:standard,\n"
            << "           cudnn:persist_static, cudnn:persist_dynamic, cudnn:persist_static_small_h,\n"
            << "           naive (only on --naive-suite suites, default paper), or an LSTM algo name\n";
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
    } else if (a == "--naive-suite") {
      if (o.naive_suites.size() == 1 && o.naive_suites[0] == "paper") o.naive_suites.clear();
      append(o.naive_suites);
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
      o.graphs = value();
      try {
        lstm::check_cuda_graphs(o.graphs, "--graphs");
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
// The plan: cases, dtypes, modes, algorithms (host only; --list prints it without a GPU)
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

struct AlgoSel {
  std::string label;  // as recorded in the JSON
  bool naive = false;
  lstm::Algo algo = lstm::Algo::Cudnn;
  std::string cudnn_algo = "standard";
};

AlgoSel parse_algo(const std::string& label) {
  AlgoSel a;
  a.label = label;
  if (label == "naive") {
    a.naive = true;
  } else if (label.rfind("cudnn:", 0) == 0) {
    a.algo = lstm::Algo::Cudnn;
    a.cudnn_algo = label.substr(6);
  } else {
    try {
      a.algo = lstm::algo_from_name(label);
    } catch (const std::exception& e) {
      usage_error(std::string("--algos: ") + e.what());
    }
    if (a.algo == lstm::Algo::Cudnn) a.label = "cudnn:standard";
  }
  return a;
}

// Runs first: cuDNN standard (the parity claims need it), then the baseline and our kernels, then
// cuDNN's persistent algorithms, persist_dynamic last (it is the slowest at large batch).
int algo_priority(const std::string& label) {
  if (label == "cudnn:standard") return 0;
  if (label == "naive") return 1;
  if (label == "cudnn:persist_static") return 3;
  if (label == "cudnn:persist_static_small_h") return 4;
  if (label == "cudnn:persist_dynamic") return 5;
  if (label.rfind("cudnn:", 0) == 0) return 6;
  return 2;
}

std::vector<std::string> default_algos() {
  std::vector<std::string> v;
  for (const auto& n : lstm::cudnn_algo_names()) v.push_back("cudnn:" + n);
  for (lstm::Algo a : lstm::available_algos())
    if (a != lstm::Algo::Reference && a != lstm::Algo::Cudnn && a != lstm::Algo::Auto) v.push_back(lstm::algo_name(a));
  v.push_back("naive");
  return v;
}

struct Cell {
  size_t c;
  std::string mode, dtype, algo;
};

struct Plan {
  std::vector<CaseSpec> cases;
  std::vector<std::string> suites, dtypes, modes, algos;
  std::vector<Cell> cells;
  std::set<size_t> check_cases;
};

int64_t get_int(const json& c, const char* key, int64_t dflt) {
  if (!c.contains(key)) return dflt;
  if (!c[key].is_number_integer() || c[key].get<int64_t>() < 1)
    throw lstm::Error(std::string("suites file: '") + key + "' must be a positive integer in " + c.dump());
  return c[key].get<int64_t>();
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
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
  std::vector<std::string> algo_items = opt.algos.empty() ? default_algos() : opt.algos;
  for (const auto& a : algo_items) {
    if (a == "cudnn") {
      for (const auto& n : lstm::cudnn_algo_names())
        if (!contains(p.algos, "cudnn:" + n)) p.algos.push_back("cudnn:" + n);
      continue;
    }
    const std::string label = parse_algo(a).label;
    if (!contains(p.algos, label)) p.algos.push_back(label);
  }

  std::map<std::string, size_t> by_id;
  std::map<size_t, std::vector<std::string>> case_suites;
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

  // Cells: algorithm passes in priority order; within a pass, the cheapest cells first, so that
  // a time budget cuts the most expensive measurements of the least important algorithms.
  std::vector<std::string> order = p.algos;
  std::stable_sort(order.begin(), order.end(),
                   [](const std::string& a, const std::string& b) { return algo_priority(a) < algo_priority(b); });
  for (const auto& algo : order) {
    std::vector<Cell> pass;
    for (size_t c = 0; c < p.cases.size(); ++c) {
      if (algo == "naive") {
        bool any = false;
        for (const auto& s : p.cases[c].suites) any = any || contains(opt.naive_suites, s);
        if (!any) continue;
      }
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
  r["gflop"] = c.gflop(cell.mode == "train");
#if LSTM_HAVE_CUDA
  // The algorithm PyTorch's rule (cudnn_algo "heuristic") picks for this case: the report compares
  // PyTorch with that row, the same cuDNN algorithm on both sides.
  if (cell.algo.rfind("cudnn:", 0) == 0 && lstm::cuda_available()) {
    const lstm::LstmSpec spec = c.spec();
    const lstm::DType dt =
        cell.dtype == "bf16" ? lstm::DType::BF16 : (cell.dtype == "fp16" ? lstm::DType::F16 : lstm::DType::F32);
    const cudaDeviceProp& prop = lstm::cuda::device_prop();
    r["cudnn_heuristic"] = lstm::cudnn_heuristic_algo(spec, dt, c.T, c.B, false, cell.mode == "train", prop.major,
                                                      prop.minor, prop.multiProcessorCount);
  }
#endif
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

[[maybe_unused]] double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void write_line(std::ofstream& out, const json& j) {
  // Flushed per line so that a run cut short by a time limit keeps what it measured.
  if (out.is_open()) out << j.dump() << "\n" << std::flush;
}

#if LSTM_HAVE_CUDA
// ---------------------------------------------------------------------------------------------
// The GPU part
// ---------------------------------------------------------------------------------------------
using lstm::DType;
using lstm::Device;
using lstm::Tensor;

struct DtypeSel {
  DType dtype;
  bool tf32;
};
DtypeSel dtype_sel(const std::string& d) {
  if (d == "fp32") return {DType::F32, false};
  if (d == "tf32") return {DType::F32, true};
  if (d == "bf16") return {DType::BF16, false};
  return {DType::F16, false};
}

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

class Events {
 public:
  ~Events() {
    for (auto e : ev_) cudaEventDestroy(e);
  }
  cudaEvent_t operator[](size_t i) {
    while (ev_.size() <= i) {
      cudaEvent_t e;
      LSTM_CUDA_CHECK(cudaEventCreate(&e));
      ev_.push_back(e);
    }
    return ev_[i];
  }

 private:
  std::vector<cudaEvent_t> ev_;
};

// Times `count` calls of run(first + k), each between two events on the engine stream; prepare
// runs before each, outside the timed region. Returns milliseconds per call.
// host_us, when given, receives the host's time to issue each call (run only, microseconds): where
// it approaches the device time, the case is bound by the host, not the GPU.
std::vector<double> time_calls(Events& ev, int first, int count, const std::function<void(int)>& prepare,
                               const std::function<void(int)>& run, std::vector<double>* host_us = nullptr) {
  cudaStream_t s = lstm::cuda::stream();
  if (host_us) host_us->clear();
  for (int k = 0; k < count; ++k) {
    if (prepare) prepare(first + k);
    LSTM_CUDA_CHECK(cudaEventRecord(ev[2 * static_cast<size_t>(k)], s));
    const auto t0 = std::chrono::steady_clock::now();
    run(first + k);
    if (host_us)
      host_us->push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    LSTM_CUDA_CHECK(cudaEventRecord(ev[2 * static_cast<size_t>(k) + 1], s));
  }
  LSTM_CUDA_CHECK(cudaEventSynchronize(ev[2 * static_cast<size_t>(count) - 1]));
  std::vector<double> ms(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) {
    float t = 0;
    LSTM_CUDA_CHECK(cudaEventElapsedTime(&t, ev[2 * static_cast<size_t>(k)], ev[2 * static_cast<size_t>(k) + 1]));
    ms[static_cast<size_t>(k)] = t;
  }
  return ms;
}

// --l2-whh: an L2 persisting access window on the engine stream for the life of the object.
class L2Window {
 public:
  L2Window() = default;
  L2Window(const L2Window&) = delete;
  L2Window& operator=(const L2Window&) = delete;
  // What was set, as a JSON object (bytes persisting, window bytes, hit ratio).
  json set(const void* p, size_t bytes) {
    const cudaDeviceProp& prop = lstm::cuda::device_prop();
    const size_t carve = std::min<size_t>(static_cast<size_t>(prop.persistingL2CacheMaxSize), bytes);
    const size_t win = std::min<size_t>(static_cast<size_t>(prop.accessPolicyMaxWindowSize), bytes);
    LSTM_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, carve));
    cudaStreamAttrValue v{};
    v.accessPolicyWindow.base_ptr = const_cast<void*>(p);
    v.accessPolicyWindow.num_bytes = win;
    v.accessPolicyWindow.hitRatio = win ? std::min(1.0f, static_cast<float>(carve) / static_cast<float>(win)) : 0.0f;
    v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    LSTM_CUDA_CHECK(cudaStreamSetAttribute(lstm::cuda::stream(), cudaStreamAttributeAccessPolicyWindow, &v));
    set_ = true;
    return json{{"persisting_bytes", carve}, {"window_bytes", win}, {"hit_ratio", v.accessPolicyWindow.hitRatio}};
  }
  ~L2Window() {
    if (!set_) return;
    cudaStreamAttrValue v{};
    v.accessPolicyWindow.num_bytes = 0;
    (void)cudaStreamSetAttribute(lstm::cuda::stream(), cudaStreamAttributeAccessPolicyWindow, &v);
    (void)cudaCtxResetPersistingL2Cache();
    (void)cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
  }

 private:
  bool set_ = false;
};

// --pad-mib and the per-cell pads: N MiB of device memory, held while the tensor lives.
Tensor held_mib(int64_t mib) { return mib > 0 ? Tensor::empty({mib << 20}, DType::U8, Device::CUDA) : Tensor(); }

// --cooldown-ms: the GPU idles for `ms` (after finishing what is queued).
void idle_gpu(double ms) {
  if (ms <= 0) return;
  lstm::cuda_synchronize();
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

uint64_t seed_of(size_t a, size_t b, size_t c = 0) {
  return 0x5eedULL + 1000003ULL * a + 7919ULL * b + 104729ULL * c;
}

class GpuBench {
 public:
  GpuBench(const Options& opt, const Plan& plan, std::ofstream& out) : opt_(opt), plan_(plan), out_(out) {
    l2_bytes_ = static_cast<size_t>(std::max(lstm::cuda::device_prop().l2CacheSize, 1 << 20));
  }

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
    h["l2_mib"] = static_cast<double>(l2_bytes_) / (1 << 20);
    h["versions"] = lstm::cuda_versions();
    h["command"] = command_line(argc, argv);
    h["engine_stream"] = lstm::cuda::stream() == cudaStreamLegacy ? "legacy default stream" : "own non-blocking stream";
    if (const char* g = std::getenv("LSTM_CHECK_GIT_COMMIT")) h["git_commit"] = g;
    h["suites_file"] = opt_.suites_file;
    h["suites"] = plan_.suites;
    h["dtypes"] = plan_.dtypes;
    h["modes"] = plan_.modes;
    h["algos"] = plan_.algos;
    h["repeats"] = opt_.repeats;
    h["warmup"] = opt_.warmup;
    h["cuda_graphs"] = opt_.graphs;
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
    time_calls(events_, 0, 3, nullptr, run);
    std::vector<double> ms = time_calls(events_, 0, 20, nullptr, run);
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
    time_calls(events_, 0, 3, nullptr, run);
    std::vector<double> ms = time_calls(events_, 0, 20, nullptr, run);
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

  // One random pool per storage dtype, from which every case's x and d_output are views.
  Tensor& pool(DType dt) {
    auto it = pools_.find(dt);
    if (it != pools_.end()) return it->second;
    const size_t es = lstm::dtype_size(dt);
    int64_t elems = static_cast<int64_t>(4 * l2_bytes_ / es);
    for (const auto& c : plan_.cases) elems = std::max(elems, 2 * slot_elems(c, true));
    Tensor t = Tensor::empty({elems}, dt, Device::CUDA);
    lstm::bench::fill_uniform(t.raw(), dt, elems, -1.0f, 1.0f, 1000 + static_cast<uint64_t>(dt));
    return pools_.emplace(dt, t).first->second;
  }
  static int64_t align_up(int64_t n) { return (n + 127) / 128 * 128; }
  static int64_t slot_elems(const CaseSpec& c, bool train) {
    return align_up(c.T * c.B * c.I) + (train ? align_up(c.T * c.B * c.D() * c.H) : 0);
  }

  struct Inputs {
    std::vector<Tensor> xs, douts;  // one per call of the cell, cycled
    Tensor x0, dout0;               // at the start of the pool: the same values in every cell
    size_t x_bytes = 0, dout_bytes = 0;
  };
  // Each call of a cell reads its own slot of the pool, taken in turn from a cursor that runs
  // through the whole pool (>= 4x L2) across cells, so no call finds its inputs in L2 from an
  // earlier call.
  Inputs make_inputs(const CaseSpec& c, DType dt, bool train) {
    Tensor& p = pool(dt);
    const int64_t slot = slot_elems(c, train);
    const int64_t x_n = c.T * c.B * c.I, d_n = c.T * c.B * c.D() * c.H;
    const int64_t max_slots = p.numel() / slot;
    LSTM_CHECK(max_slots >= 1, "input pool too small");
    const int64_t nbuf = std::min<int64_t>(max_slots, 2 * opt_.warmup + kMaxExtraWarmup + opt_.repeats + 1);
    int64_t& cur = cursor_[dt];
    auto take = [&](int64_t off, Inputs& in) {
      in.xs.push_back(p.slice0(off, off + x_n).reshape({c.T, c.B, c.I}));
      if (train) {
        const int64_t doff = off + align_up(x_n);
        in.douts.push_back(p.slice0(doff, doff + d_n).reshape({c.T, c.B, c.D() * c.H}));
      }
    };
    Inputs in;
    for (int64_t k = 0; k < nbuf; ++k) {
      if (cur + slot > p.numel()) cur = 0;
      take(cur, in);
      cur += slot;
    }
    in.x0 = p.slice0(0, x_n).reshape({c.T, c.B, c.I});
    in.dout0 = p.slice0(align_up(x_n), align_up(x_n) + d_n).reshape({c.T, c.B, c.D() * c.H});
    in.x_bytes = in.xs[0].nbytes();
    in.dout_bytes = train ? in.douts[0].nbytes() : 0;
    return in;
  }

  // The float64 CPU reference of a case in one storage dtype (same weights and inputs as every
  // algorithm's cell: they are drawn from seeds that depend on the case and tensor only).
  struct Reference {
    Tensor out, dx;
    std::vector<Tensor> dw;
  };
  const Reference& reference(size_t case_index, DType dt, const std::vector<Tensor>& w, const Tensor& x,
                             const Tensor& dout) {
    auto key = std::make_pair(case_index, static_cast<int>(dt));
    auto it = refs_.find(key);
    if (it != refs_.end()) return it->second;
    const lstm::LstmSpec spec = plan_.cases[case_index].spec();
    std::vector<Tensor> w64, dw64;
    for (const auto& t : w) {
      w64.push_back(t.cpu().to(DType::F64));
      dw64.push_back(Tensor::zeros(t.shape(), DType::F64));
    }
    lstm::LstmBackend& rb = lstm::lstm_backend(lstm::Algo::Reference, spec, DType::F64, Device::CPU);
    lstm::LstmInput in;
    in.x = x.cpu().to(DType::F64);
    lstm::Rng rng(1);
    std::unique_ptr<lstm::LstmSaved> saved;
    Reference r;
    r.out = rb.forward(spec, w64, in, true, &rng, &saved).output;
    lstm::LstmGradOutput g;
    g.d_output = dout.cpu().to(DType::F64);
    r.dx = rb.backward(spec, w64, *saved, g, dw64).d_x;
    r.dw = dw64;
    return refs_.emplace(key, std::move(r)).first->second;
  }

  // The SM clock now, in MHz: a fixed number of clock64() cycles on one thread, timed with events
  // (bench_gpu_torch.py measures it alike with torch.cuda._sleep). Called right after a timed
  // loop, it reads the clock that loop ran at (boost and power limits move it between runs).
  double sm_clock_mhz() {
    constexpr long long kCycles = 2'000'000;  // about 1 ms at the H200's 1980 MHz boost
    const double ms = time_calls(events_, 0, 1, nullptr, [](int) { lstm::bench::spin_cycles(kCycles); })[0];
    return ms > 0 ? static_cast<double>(kCycles) / (ms * 1e3) : 0.0;
  }

  void run_cell(const Cell& cell, json& row) {
    const CaseSpec& c = plan_.cases[cell.c];
    const bool train = cell.mode == "train";
    const DtypeSel ds = dtype_sel(cell.dtype);
    const AlgoSel as = parse_algo(cell.algo);
    try {
      const lstm::LstmSpec spec = c.spec();
      Inputs in = make_inputs(c, ds.dtype, train);  // views into the pool (made on first use)
      lstm::cuda_synchronize();
      const size_t base = lstm::arena_stats().in_use_bytes;
      lstm::arena_reset_peak();

      std::unique_ptr<lstm::LstmBackend> be;
      std::unique_ptr<lstm::bench::NaiveLstm> naive;
      lstm::LstmBackend::FlatLayout layout;
      try {
        if (as.naive) {
          naive = std::make_unique<lstm::bench::NaiveLstm>(spec, ds.dtype, ds.tf32);
        } else {
          lstm::LstmOptions o;
          o.algo = as.algo;
          o.cudnn_algo = as.cudnn_algo;
          o.allow_tf32 = ds.tf32;
          o.cuda_graphs = opt_.graphs;
          be = lstm::make_lstm_backend(o, spec, ds.dtype, Device::CUDA);
          layout = be->flat_layout(spec, ds.dtype);
        }
      } catch (const std::exception&) {
        row["rejected"] = true;  // the algorithm refused the case up front (not a failure while running)
        throw;
      }
      const Tensor pad_w = held_mib(opt_.pad_weights_mib);
      std::vector<Tensor> w = lstm::make_flat_weights(spec, layout, ds.dtype, Device::CUDA);
      const Tensor pad_work = held_mib(opt_.pad_work_mib);
      const float k = 1.0f / std::sqrt(static_cast<float>(c.H));
      if (!layout.offsets.empty())  // the gaps of the flat buffer too, so nothing is uninitialised
        lstm::bench::fill_uniform(static_cast<char*>(w[0].raw()) - layout.offsets[0], ds.dtype,
                                  static_cast<int64_t>(layout.bytes / lstm::dtype_size(ds.dtype)), -k, k, 77);
      for (size_t i = 0; i < w.size(); ++i)
        lstm::bench::fill_uniform(w[i].raw(), ds.dtype, w[i].numel(), -k, k, seed_of(cell.c, i));
      std::vector<Tensor> dw;
      if (train) dw = lstm::make_flat_weights(spec, layout, ds.dtype, Device::CUDA);
      L2Window l2win;
      if (opt_.l2_whh) {
        const Tensor& whh = w[static_cast<size_t>(spec.slots(0, 0).w_hh)];
        row["l2_window"] = l2win.set(whh.raw(), whh.nbytes());
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
      Tensor nout, ndx;
      lstm::Rng rng(seed_of(cell.c, 999));
      const size_t nbuf = in.xs.size();
      auto run = [&](int i) {
        const size_t b = static_cast<size_t>(i) % nbuf;
        if (naive) {
          nout = Tensor();
          ndx = Tensor();
          nout = naive->forward(w, in.xs[b], train);
          if (train) ndx = naive->backward(w, in.douts[b], dw);
          return;
        }
        out = lstm::LstmOutput{};
        grads = lstm::LstmGrads{};
        lin.x = in.xs[b];
        if (train) {
          std::unique_ptr<lstm::LstmSaved> saved;
          out = be->forward(spec, w, lin, true, &rng, &saved);
          gout.d_output = in.douts[b];
          grads = be->backward(spec, w, *saved, gout, dw);
        } else {
          out = be->forward(spec, w, lin, false, nullptr, nullptr);
        }
      };
      auto result_out = [&]() -> const Tensor& { return naive ? nout : out.output; };
      auto result_dx = [&]() -> const Tensor& { return naive ? ndx : grads.d_x; };

      // --cooldown-ms: the GPU idles first, as long as the previous cell kept it busy.
      const double cooldown = std::min(opt_.cooldown_ms, busy_ms_);
      idle_gpu(cooldown);
      busy_ms_ = 0;
      // Warm-up (also builds plans, JIT-compiled kernels and arena blocks), then the repeats. With
      // CUDA graphs the warm-up goes on until the backend has settled how the cell's calls run
      // (under "auto" a few measured eager calls, a capture and a few measured replays), at most
      // kMaxExtraWarmup more calls.
      std::vector<double> wms = time_calls(events_, 0, opt_.warmup, zero_dw, run);
      int warmup = opt_.warmup;
      const auto* cb = dynamic_cast<const lstm::CudnnLstmBackend*>(be.get());
      while (cb && !cb->graphs_settled() && warmup < opt_.warmup + kMaxExtraWarmup) {
        wms.push_back(time_calls(events_, warmup, 1, zero_dw, run)[0]);
        ++warmup;
      }
      // --cooldown-ms: settling took extra calls (bench_gpu_torch.py has none), so the GPU idles
      // again for as long as the warm-up kept it busy and warms up afresh with --warmup calls;
      // the timed calls then start from the same history as PyTorch's: an idle GPU and --warmup
      // calls.
      double settle_cooldown = 0;
      if (opt_.cooldown_ms > 0 && warmup > opt_.warmup) {
        double settle_busy = 0;
        for (double t : wms) settle_busy += t;
        settle_cooldown = std::min(opt_.cooldown_ms, settle_busy);
        idle_gpu(settle_cooldown);
        for (double t : time_calls(events_, warmup, opt_.warmup, zero_dw, run)) wms.push_back(t);
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
      std::vector<double> ms = time_calls(events_, warmup, repeats, zero_dw, run, &host_us);
      const double sm_mhz = sm_clock_mhz();  // the clock the loop above ran at
      for (double t : wms) busy_ms_ += t;
      for (double t : ms) busy_ms_ += t;

      // A timing of a computation that went non-finite is no timing.
      const Tensor& o = result_out();
      LSTM_REQUIRE(o.defined() && lstm::bench::count_non_finite(o.raw(), o.dtype(), o.numel()) == 0,
                   "non-finite (or missing) output");
      if (train) {
        const Tensor& dx = result_dx();
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
      if (cb) {
        row["graphs"] = opt_.graphs;
        row["graphs_settled"] = cb->graphs_settled();
        row["graph_captures"] = cb->graph_counts().captures;  // over the whole cell, warm-up included
        row["graph"] = cb->last_graph();  // how the last timed call (its backward, in training) ran
        // auto's measurements and verdicts for this cell (the backend is the cell's own), or why
        // a shape runs eagerly: one string per line.
        std::vector<std::string> notes;
        std::istringstream log(cb->graph_log());
        for (std::string line; std::getline(log, line);)
          if (!line.empty()) notes.push_back(line);
        row["graph_decisions"] = notes;
      }
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
        const double e_out = lstm::rel_l2_error(result_out(), ref.out);
        bool pass = e_out < tol.first;
        chk["output_rel_l2"] = e_out;
        if (train) {
          const double e_dx = lstm::rel_l2_error(result_dx(), ref.dx);
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
  size_t l2_bytes_ = 0;
  Events events_;
  std::map<DType, Tensor> pools_;
  std::map<DType, int64_t> cursor_;  // next free element of each pool
  std::map<std::pair<size_t, int>, Reference> refs_;
  std::map<std::string, double> best_ms_;
  double busy_ms_ = 0;  // GPU time of the previous cell's calls (--cooldown-ms)
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
      std::printf("; checked cases: %zu)\n", plan.check_cases.size());
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
    const Tensor pad = held_mib(opt.pad_mib);
    GpuBench bench(opt, plan, out);
    json h = bench.header(argc, argv);
    write_line(out, h);
    std::printf("bench_gpu_lstm: %s; %s\n%zu cases x modes x dtypes x algorithms = %zu cells; warm-up %d, "
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
