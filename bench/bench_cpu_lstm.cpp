// CPU LSTM benchmark: the LSTM stack on the CPU, inference forward and training forward+backward,
// over the cases scripts/bench_cpu_torch.py runs with torch.nn.LSTM, so that
// scripts/compare_cpu.py can pair the rows one to one.
//
//   bench_cpu_lstm [--threads N] [--repeats N] [--warmup N] [--json FILE] [--quick]
//                  [--hidden 128,512] [--batch 1,32] [--layers 1,2] [--steps 100]
//                  [--modes fwd,fwdbwd] [--algo reference[,onednn,...]]
//
// Input size = hidden size, fp32, unidirectional, no bias-free or projection variants, equal
// lengths, h0/c0 zero (undefined), as nn.LSTM's defaults. Each timed repeat is one call (fwd) or
// one training forward plus one backward (fwdbwd); the weight gradients are zeroed before each
// repeat outside the timed region, as the torch script zeroes .grad. --algo takes a list: each case
// runs every algorithm in turn before the next case, so that they meet the same machine load.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.hpp"
#include "lstm/lstm.hpp"
#include "lstm/parallel.hpp"
#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

namespace {

struct Options {
  int threads = 0;  // 0: leave the library default (OMP_NUM_THREADS or the core count)
  int repeats = 7;
  int warmup = 2;
  bool repeats_given = false;
  bool warmup_given = false;
  bool quick = false;
  std::string json_path;
  std::vector<int64_t> hidden{128, 512};
  std::vector<int64_t> batch{1, 32};
  std::vector<int64_t> layers{1, 2};
  std::vector<int64_t> steps{100};
  std::vector<std::string> modes{"fwd", "fwdbwd"};
  std::string algo = "reference";
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "bench_cpu_lstm: " << msg << "\n"
            << "usage: bench_cpu_lstm [--threads N] [--repeats N] [--warmup N] [--json FILE] [--quick]\n"
            << "                      [--hidden LIST] [--batch LIST] [--layers LIST] [--steps LIST]\n"
            << "                      [--modes fwd,fwdbwd] [--algo NAME[,NAME...]]\n";
  std::exit(2);
}

using lstm::bench::split_commas;
int64_t parse_int(const std::string& flag, const std::string& s, int64_t min_value) {
  return lstm::bench::parse_int(flag, s, min_value, usage_error);
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  for (const auto& item : split_commas(s)) out.push_back(parse_int(flag, item, 1));
  if (out.empty()) usage_error(flag + " expects a comma-separated list of positive integers");
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
    if (a == "--threads") {
      o.threads = static_cast<int>(parse_int(a, value(), 0));
    } else if (a == "--repeats") {
      o.repeats = static_cast<int>(parse_int(a, value(), 1));
      o.repeats_given = true;
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(parse_int(a, value(), 0));
      o.warmup_given = true;
    } else if (a == "--json") {
      o.json_path = value();
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--hidden") {
      o.hidden = parse_int_list(a, value());
    } else if (a == "--batch") {
      o.batch = parse_int_list(a, value());
    } else if (a == "--layers") {
      o.layers = parse_int_list(a, value());
    } else if (a == "--steps") {
      o.steps = parse_int_list(a, value());
    } else if (a == "--modes") {
      o.modes = split_commas(value());
      for (const auto& m : o.modes)
        if (m != "fwd" && m != "fwdbwd") usage_error("--modes accepts fwd and fwdbwd, got '" + m + "'");
      if (o.modes.empty()) usage_error("--modes needs fwd, fwdbwd or both");
    } else if (a == "--algo") {
      o.algo = value();
    } else if (a == "-h" || a == "--help") {
      usage_error("help");
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  // --quick is a smoke test: enough repeats for a median, few enough to finish in seconds.
  if (o.quick) {
    if (!o.repeats_given) o.repeats = 3;
    if (!o.warmup_given) o.warmup = 1;
  }
  return o;
}

struct Case {
  int64_t H, B, T, L;
  std::string mode;
};

struct Timing {
  double median_ms, min_ms;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Counted as the suite counts it: 2*4H*(I+H)*B*T per layer forward, three times that for training.
double gflop(const Case& c) {
  double per_layer = 2.0 * 4.0 * static_cast<double>(c.H) * static_cast<double>(c.H + c.H) *
                     static_cast<double>(c.B) * static_cast<double>(c.T);
  return per_layer * static_cast<double>(c.L) * (c.mode == "fwdbwd" ? 3.0 : 1.0) * 1e-9;
}

Timing run_case(lstm::Algo algo, const Case& c, int warmup, int repeats, uint64_t seed) {
  lstm::LstmSpec spec;
  spec.input_size = c.H;
  spec.hidden_size = c.H;
  spec.num_layers = c.L;
  lstm::LstmOptions options;
  options.algo = algo;
  const std::unique_ptr<lstm::LstmBackend> be =
      lstm::make_lstm_backend(options, spec, lstm::DType::F32, lstm::Device::CPU);
  const lstm::ExecContext ctx = lstm::ExecContext::cpu();

  lstm::Rng rng(seed);
  std::vector<lstm::Tensor> weights;
  for (const auto& name : spec.param_names())
    weights.push_back(lstm::Tensor::empty(spec.param_shape(name), lstm::DType::F32));
  lstm::lstm_init_weights(spec, weights, rng);

  lstm::LstmInput in;
  in.x = lstm::Tensor::empty({c.T, c.B, c.H}, lstm::DType::F32);
  rng.fill_uniform(in.x, -1.0, 1.0);

  const bool train = c.mode == "fwdbwd";
  lstm::LstmGradOutput grad;
  std::vector<lstm::Tensor> d_weights;
  if (train) {
    grad.d_output = lstm::Tensor::empty({c.T, c.B, spec.out_size()}, lstm::DType::F32);
    rng.fill_uniform(grad.d_output, -1.0, 1.0);
    for (const auto& w : weights) d_weights.push_back(lstm::Tensor::zeros(w.shape(), lstm::DType::F32));
  }

  std::vector<double> times;
  times.reserve(static_cast<size_t>(repeats));
  lstm::LstmOutput last;
  for (int r = 0; r < warmup + repeats; ++r) {
    for (auto& g : d_weights) g.zero_();
    auto t0 = std::chrono::steady_clock::now();
    if (train) {
      std::unique_ptr<lstm::LstmSaved> saved;
      last = be->forward(weights, in, /*training=*/true, &rng, &saved, ctx);
      lstm::LstmGrads g = be->backward(weights, *saved, grad, d_weights, ctx);
      (void)g;
    } else {
      last = be->forward(weights, in, /*training=*/false, nullptr, nullptr, ctx);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (r >= warmup) times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  // A timing of a computation that went non-finite is no timing worth recording.
  if (lstm::has_non_finite(last.output))
    throw lstm::Error("bench_cpu_lstm: non-finite output for H=" + std::to_string(c.H) +
                      " B=" + std::to_string(c.B) + " L=" + std::to_string(c.L));
  for (const auto& g : d_weights)
    if (lstm::has_non_finite(g)) throw lstm::Error("bench_cpu_lstm: non-finite weight gradient");
  return {median_of(times), *std::min_element(times.begin(), times.end())};
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse_args(argc, argv);
  try {
    std::vector<lstm::Algo> algos;
    for (const auto& name : split_commas(opt.algo)) algos.push_back(lstm::algo_from_name(name));
    if (algos.empty()) usage_error("--algo expects one or more algorithm names");
    std::string algo_list;
    for (lstm::Algo a : algos) algo_list += std::string(algo_list.empty() ? "" : ",") + lstm::algo_name(a);
    if (opt.threads > 0) lstm::set_num_threads(opt.threads);
    const int threads = lstm::num_threads();

    std::ofstream json;
    if (!opt.json_path.empty()) {
      json.open(opt.json_path, std::ios::out | std::ios::trunc);
      if (!json) {
        std::cerr << "bench_cpu_lstm: cannot write " << opt.json_path << "\n";
        return 2;
      }
    }

    std::vector<Case> cases;
    for (int64_t L : opt.layers)
      for (int64_t H : opt.hidden)
        for (int64_t B : opt.batch)
          for (int64_t T : opt.steps)
            for (const auto& m : opt.modes) cases.push_back({H, B, T, L, m});

    std::printf("lstm-engine CPU LSTM (%s, f32), %d thread(s), warm-up %d, median of %d\n", algo_list.c_str(),
                threads, opt.warmup, opt.repeats);
    std::printf("%-10s %3s %5s %4s %5s %-7s %11s %11s %10s %9s\n", "algo", "L", "H", "B", "T", "mode", "median ms",
                "min ms", "us/step", "GFLOP/s");
    std::fflush(stdout);

    uint64_t seed = 1;
    for (const auto& c : cases) {
      ++seed;  // the same inputs and weights for every algorithm of a case
      for (lstm::Algo algo : algos) {
        Timing t = run_case(algo, c, opt.warmup, opt.repeats, seed);
        std::printf("%-10s %3lld %5lld %4lld %5lld %-7s %11.3f %11.3f %10.2f %9.2f\n", lstm::algo_name(algo),
                    static_cast<long long>(c.L), static_cast<long long>(c.H), static_cast<long long>(c.B),
                    static_cast<long long>(c.T), c.mode.c_str(), t.median_ms, t.min_ms,
                    1000.0 * t.median_ms / static_cast<double>(c.T), gflop(c) / (t.median_ms * 1e-3));
        std::fflush(stdout);
        if (json.is_open()) {
          nlohmann::json row = {{"impl", "lstm-engine"}, {"algo", lstm::algo_name(algo)},
                                {"dtype", "f32"},        {"H", c.H},
                                {"B", c.B},              {"T", c.T},
                                {"L", c.L},              {"mode", c.mode},
                                {"threads", threads},    {"ms_median", t.median_ms},
                                {"ms_min", t.min_ms},    {"repeats", opt.repeats}};
          // Flushed per row so that a run cut short by a time limit still leaves its finished rows.
          json << row.dump() << "\n" << std::flush;
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_cpu_lstm: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
