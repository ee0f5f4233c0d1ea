// Helpers of the LSTM conformance suite (tests/test_lstm_conformance.cpp): the targets it runs
// (registry row x device x precision x mode), random problems in float64 with NaN past each
// length, one forward (+ backward) of a problem through any backend with its outputs poisoned
// first, the float64 CPU reference of the same problem, and the comparisons. Nothing here names a
// backend other than the reference every backend is compared with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/rng.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/tensor.hpp"

namespace lstm::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A precision as a backend is asked for it: a storage dtype, TF32 or not, and the relative L2
// error against the float64 reference that docs/DESIGN.md allows.
struct Prec {
  const char* name;
  DType dtype;
  bool tf32;
  double tol;
};
// f64 has no stated tolerance: only summation order differs from the reference.
inline const std::vector<Prec>& all_precisions() {
  static const std::vector<Prec> p = {{"f64", DType::F64, false, 1e-9},
                                      {"f32", DType::F32, false, 1e-5},
                                      {"tf32", DType::F32, true, 1e-3},
                                      {"bf16", DType::BF16, false, 2e-2},
                                      {"f16", DType::F16, false, 2e-2}};
  return p;
}

// One instantiation of the suite: a registry row on a device at a precision, in inference or
// training.
struct Target {
  std::string row;
  Device device;
  Prec prec;
  bool training;

  const LstmBackendEntry& entry() const { return lstm_backend_entry(row); }
  LstmOptions options() const {
    LstmOptions o;
    o.allow_tf32 = prec.tf32;
    return o;
  }
  // The target that *is* the reference: comparing it with the reference checks nothing, so the
  // tests lean on properties (NaN, zeros, accumulation, the fixtures) for it.
  bool is_reference() const {
    return entry().algo == Algo::Reference && device == Device::CPU && prec.dtype == DType::F64;
  }
  ExecContext context() const { return ExecContext::current(device); }
};

inline std::string test_name_of(const Target& t) {
  std::string n = t.row + "_" + device_name(t.device) + "_" + t.prec.name + (t.training ? "_training" : "_inference");
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}
inline void PrintTo(const Target& t, std::ostream* os) { *os << test_name_of(t); }

// A spec every backend of the registry should take if it takes the dtype and device at all: one
// unidirectional layer with biases, hidden 64 (within every cuDNN persistent limit).
inline LstmSpec plain_spec() { return make_spec(32, 64, 1); }

struct Skipped {
  std::string row, prec, reason;
};
// Every (row, device, precision) the rows' why_not accepts for the plain spec, and the pairs no
// device accepts with the reasons. TF32 is a GPU matrix-unit mode: on the CPU it would repeat F32.
// Without a GPU, a GPU row's refusals may be only that (those precisions skip at run time).
struct TargetList {
  std::vector<Target> targets;  // one per mode
  std::vector<Skipped> skipped;
};
inline const TargetList& target_list() {
  static const TargetList list = [] {
    TargetList l;
    for (const auto& row : lstm_backends())
      for (const Prec& p : all_precisions()) {
        std::string reasons;
        bool any = false;
        for (Device dev : {Device::CPU, Device::CUDA}) {
          LstmOptions o;
          o.allow_tf32 = p.tf32;
          std::string why = row.why_not(plain_spec(), p.dtype, dev, o);
          // A row that refuses only because this machine has no GPU is instantiated all the same,
          // so that its tests exist everywhere and skip here saying why.
          if (dev == Device::CUDA && !cuda_available() && why.find(cuda_unavailable_reason()) != std::string::npos)
            why.clear();
          if (why.empty() && p.tf32 && dev == Device::CPU)
            why = "TF32 is a GPU tensor-core mode (on the CPU it is F32, tested as f32)";
          if (!why.empty()) {
            reasons += std::string(reasons.empty() ? "" : "; ") + device_name(dev) + ": " + why;
            continue;
          }
          any = true;
          for (bool training : {false, true}) l.targets.push_back({row.name, dev, p, training});
        }
        if (!any) l.skipped.push_back({row.name, p.name, reasons});
      }
    return l;
  }();
  return list;
}

// ---- Problems ----

struct Case {
  std::string name;
  LstmSpec spec;
  int64_t T = 0, B = 0;
  std::vector<int64_t> lengths;  // empty: all T
  bool h0 = false, c0 = false;
  bool d_output = true, d_h_n = true, d_c_n = true;

  bool variable_lengths() const {
    return std::any_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n != T; });
  }
};
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Why `t` does not run case `c` ("" when it does): the row's why_not for the case's spec, or a
// call the row declares it refuses.
inline std::string case_skip_reason(const Target& t, const LstmSpec& spec, bool variable_lengths, bool initial_state) {
  const LstmBackendEntry& e = t.entry();
  std::string why = e.why_not(spec, t.prec.dtype, t.device, t.options());
  if (!why.empty()) return why;
  if (variable_lengths && !e.variable_lengths) return "the row takes no variable lengths";
  if (initial_state && !e.initial_state) return "the row takes no h0/c0";
  return "";
}
inline std::string case_skip_reason(const Target& t, const Case& c) {
  return case_skip_reason(t, c.spec, c.variable_lengths(), c.h0 || c.c0);
}

// Everything one forward + backward reads, in float64 on the CPU, holding values representable
// in the target's dtype (so that the comparison measures the computation, not input rounding).
struct Problem {
  LstmSpec spec;
  std::vector<Tensor> w;
  LstmInput in;         // x NaN past each length
  LstmGradOutput grad;  // d_output NaN past each length
  std::vector<Tensor> dw0;  // what d_weights hold before the backward: gradients add into it

  int64_t T() const { return spec.batch_first ? in.x.size(1) : in.x.size(0); }
  int64_t B() const { return spec.batch_first ? in.x.size(0) : in.x.size(1); }
};

inline Shape seq_shape(const LstmSpec& s, int64_t T, int64_t B, int64_t F) {
  return s.batch_first ? Shape{B, T, F} : Shape{T, B, F};
}
inline Shape output_shape(const LstmSpec& s, int64_t T, int64_t B) {
  return seq_shape(s, T, B, s.directions() * s.out_size());
}
inline Shape h_shape(const LstmSpec& s, int64_t B) { return {s.num_layers * s.directions(), B, s.out_size()}; }
inline Shape c_shape(const LstmSpec& s, int64_t B) { return {s.num_layers * s.directions(), B, s.hidden_size}; }

// Whether flat row `row` of a [T, B, W] ([B, T, W] with batch_first) tensor is past its length.
inline bool past_length(const LstmSpec& s, const std::vector<int64_t>& len, int64_t T, int64_t B, int64_t row) {
  const int64_t t = s.batch_first ? row % T : row / B;
  const int64_t b = s.batch_first ? row / T : row % B;
  return !len.empty() && t >= len[static_cast<size_t>(b)];
}

inline void poison_past_lengths(Tensor& t, const LstmSpec& s, const std::vector<int64_t>& len, int64_t T, int64_t B) {
  const int64_t W = t.size(2);
  for (int64_t row = 0; row < T * B; ++row)
    if (past_length(s, len, T, B, row))
      for (int64_t j = 0; j < W; ++j) t.set(row * W + j, kNaN);
}

// U(lo, hi) in float64, rounded through `dt`.
inline Tensor uniform(const Shape& shape, Rng& rng, double lo, double hi, DType dt) {
  Tensor t = Tensor::empty(shape, DType::F64);
  rng.fill_uniform(t, lo, hi);
  return dt == DType::F64 ? t : t.to(dt).to(DType::F64);
}

// Weights from PyTorch's initialisation U(-1/sqrt(H), 1/sqrt(H)) (scaled by weight_scale),
// inputs, h0/c0 and cotangents U(-1, 1), starting gradients U(-0.01, 0.01): never zeros.
inline Problem make_problem(const Case& c, DType dt, uint64_t seed, double weight_scale = 1.0) {
  Rng rng(seed);
  Problem p;
  p.spec = c.spec;
  const LstmSpec& s = c.spec;
  const double k = weight_scale / std::sqrt(static_cast<double>(s.hidden_size));
  for (const auto& n : s.param_names()) {
    p.w.push_back(uniform(s.param_shape(n), rng, -k, k, dt));
    p.dw0.push_back(uniform(s.param_shape(n), rng, -0.01, 0.01, dt));
  }
  p.in.x = uniform(seq_shape(s, c.T, c.B, s.input_size), rng, -1, 1, dt);
  poison_past_lengths(p.in.x, s, c.lengths, c.T, c.B);
  p.in.lengths = c.lengths;
  if (c.h0) p.in.h0 = uniform(h_shape(s, c.B), rng, -1, 1, dt);
  if (c.c0) p.in.c0 = uniform(c_shape(s, c.B), rng, -1, 1, dt);
  if (c.d_output) {
    p.grad.d_output = uniform(output_shape(s, c.T, c.B), rng, -1, 1, dt);
    poison_past_lengths(p.grad.d_output, s, c.lengths, c.T, c.B);
  }
  if (c.d_h_n) p.grad.d_h_n = uniform(h_shape(s, c.B), rng, -1, 1, dt);
  if (c.d_c_n) p.grad.d_c_n = uniform(c_shape(s, c.B), rng, -1, 1, dt);
  return p;
}

// ---- Running ----

// What one forward (and, in training, backward) gave, in float64 on the CPU. dw is the gradient
// the backward added (d_weights after minus before).
struct Result {
  LstmOutput out;
  LstmGrads g;
  std::vector<Tensor> dw;
};

inline Tensor f64(const Tensor& t) { return t.defined() ? t.cpu().to(DType::F64) : Tensor(); }
inline Tensor on(const Tensor& t, DType dt, Device dev) { return t.defined() ? t.to(dt).to_device(dev) : Tensor(); }

// Leaves freed blocks of these shapes filled with NaN, so that the tensors a backend allocates
// next start as NaN and an element it never writes shows. On the GPU these are the caching
// arena's blocks; on the CPU the allocator's free lists, which reuse small blocks (best effort).
inline void poison_allocator(const std::vector<Shape>& shapes, DType dt, Device dev) {
  {
    std::vector<Tensor> keep;
    for (int rep = 0; rep < 2; ++rep)
      for (const auto& s : shapes) {
        Tensor t = Tensor::empty(s, dt, dev);
        t.fill_(kNaN);
        keep.push_back(t);
      }
    if (dev == Device::CUDA) cuda_synchronize();
  }
}

struct RunOptions {
  bool training = true;   // a training forward (dropout on), saving state for the backward
  bool flat = false;      // weights and d_weights as views into be.flat_layout()
  uint64_t rng_seed = 3;  // for dropout
  bool backward = true;   // in training: save the forward's state and run the backward
};

// Weights (or d_weights) of p in the backend's dtype on its device: views into one buffer laid
// out as flat_layout() when flat, separate tensors otherwise.
inline std::vector<Tensor> place_weights(LstmBackend& be, const std::vector<Tensor>& values, bool flat) {
  const LstmSpec& s = be.spec();
  const auto layout = flat ? be.flat_layout(be.dtype()) : LstmBackend::FlatLayout{};
  std::vector<Tensor> w = make_flat_weights(s, layout, be.dtype(), be.device());
  for (size_t i = 0; i < w.size(); ++i) w[i].copy_(values[i]);
  return w;
}

// p through `be` on ctx with weights w and d_weights dw already placed (holding p.w and p.dw0).
// Outputs and gradients are poisoned before each call.
inline Result run_placed(LstmBackend& be, const Problem& p, const std::vector<Tensor>& w, std::vector<Tensor>& dw,
                         const RunOptions& o, const ExecContext& ctx) {
  const LstmSpec& s = be.spec();
  const DType dt = be.dtype();
  const Device dev = be.device();
  const LstmInput in{on(p.in.x, dt, dev), p.in.lengths, on(p.in.h0, dt, dev), on(p.in.c0, dt, dev)};
  const int64_t T = p.T(), B = p.B();
  poison_allocator({output_shape(s, T, B), h_shape(s, B), c_shape(s, B)}, dt, dev);
  Rng rng(o.rng_seed);
  std::unique_ptr<LstmSaved> saved;
  const bool backward = o.training && o.backward;
  const LstmOutput out = be.forward(w, in, o.training, &rng, backward ? &saved : nullptr, ctx);
  Result r;
  r.out = {f64(out.output), f64(out.h_n), f64(out.c_n)};
  EXPECT_EQ(out.output.device(), dev);
  EXPECT_EQ(out.output.dtype(), dt);
  if (!backward) return r;
  EXPECT_TRUE(saved) << "a training forward saved nothing";
  if (!saved) return r;
  const LstmGradOutput grad{on(p.grad.d_output, dt, dev), on(p.grad.d_h_n, dt, dev), on(p.grad.d_c_n, dt, dev)};
  poison_allocator({p.in.x.shape(), h_shape(s, B), c_shape(s, B)}, dt, dev);
  const LstmGrads g = be.backward(w, *saved, grad, dw, ctx);
  r.g = {f64(g.d_x), f64(g.d_h0), f64(g.d_c0)};
  for (size_t i = 0; i < dw.size(); ++i) {
    Tensor d = f64(dw[i]);
    // The starting values exactly as the backend's dtype holds them (p.dw0 is representable).
    for (int64_t j = 0; j < d.numel(); ++j) d.set(j, d.get(j) - p.dw0[i].get(j));
    r.dw.push_back(d);
  }
  return r;
}

// p through `be` on ctx, its weights placed anew (flat or separate).
inline Result run_backend(LstmBackend& be, const Problem& p, const RunOptions& o, const ExecContext& ctx) {
  const std::vector<Tensor> w = place_weights(be, p.w, o.flat);
  std::vector<Tensor> dw = place_weights(be, p.dw0, o.flat);
  return run_placed(be, p, w, dw, o, ctx);
}

inline std::unique_ptr<LstmBackend> make_target_backend(const Target& t, const LstmSpec& spec,
                                                        const LstmOptions& options) {
  return make_lstm_backend(t.row, options, spec, t.prec.dtype, t.device);
}

// The float64 CPU reference of p (dropout off unless the spec asks for it).
inline Result run_reference(const Problem& p, bool training = true) {
  auto be = make_lstm_backend("reference", LstmOptions{}, p.spec, DType::F64, Device::CPU);
  return run_backend(*be, p, {training, false, 3, true}, ExecContext::cpu());
}

// ---- Comparing ----

inline void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << ": nothing returned";
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_FALSE(has_non_finite(got)) << what << ": non-finite values (an element not written, or NaN let through)";
  const double err = rel_l2_error(got, want);
  EXPECT_LE(err, tol) << what << ": relative L2 error " << err << ", max abs diff " << max_abs_diff(got, want);
}

// Rows past each length of a [T, B, W] (or [B, T, W]) tensor are exactly zero.
inline void expect_zero_past_lengths(const Tensor& t, const LstmSpec& s, const std::vector<int64_t>& len, int64_t T,
                                     int64_t B, const std::string& what) {
  const int64_t W = t.size(2);
  for (int64_t row = 0; row < T * B; ++row) {
    if (!past_length(s, len, T, B, row)) continue;
    for (int64_t j = 0; j < W; ++j) ASSERT_EQ(t.get(row * W + j), 0.0) << what << " past its length: row " << row << " col " << j;
  }
}

// A weight gradient is a sum over every step and sequence, formed in another order by each
// backend: in f32 its rounding grows past DESIGN.md's 1e-5 (stated for layer outputs) on small
// gradients. cuDNN's f32 weight gradients measured 2.0e-5 on the H200 on the golden case
// lstm_input_gt_hidden (every cuDNN algorithm alike), so f32 weight gradients get 5e-5; the
// other precisions' tolerances already cover it.
inline double weight_grad_tol(double tol) { return tol == 1e-5 ? 5e-5 : tol; }

// got against want (the reference or PyTorch's numbers) for everything the problem defines.
inline void compare(const Result& got, const Result& want, const Problem& p, bool training, double tol) {
  const LstmSpec& s = p.spec;
  expect_close(got.out.output, want.out.output, tol, "output");
  expect_close(got.out.h_n, want.out.h_n, tol, "h_n");
  expect_close(got.out.c_n, want.out.c_n, tol, "c_n");
  if (got.out.output.defined()) expect_zero_past_lengths(got.out.output, s, p.in.lengths, p.T(), p.B(), "output");
  if (!training) return;
  expect_close(got.g.d_x, want.g.d_x, tol, "d_x");
  if (got.g.d_x.defined()) expect_zero_past_lengths(got.g.d_x, s, p.in.lengths, p.T(), p.B(), "d_x");
  if (p.in.h0.defined()) {
    expect_close(got.g.d_h0, want.g.d_h0, tol, "d_h0");
  } else {
    EXPECT_FALSE(got.g.d_h0.defined()) << "d_h0 without h0";
  }
  if (p.in.c0.defined()) {
    expect_close(got.g.d_c0, want.g.d_c0, tol, "d_c0");
  } else {
    EXPECT_FALSE(got.g.d_c0.defined()) << "d_c0 without c0";
  }
  const auto names = s.param_names();
  ASSERT_EQ(got.dw.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) expect_close(got.dw[i], want.dw[i], weight_grad_tol(tol), "d_" + names[i]);
}

// ---- PyTorch's golden files (tests/fixtures/lstm_*.safetensors, scripts/make_fixtures.py) ----

inline std::vector<std::string> lstm_fixture_paths() {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(LSTM_FIXTURE_DIR, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind("lstm_", 0) == 0 && e.path().extension() == ".safetensors")
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

inline Tensor fixture_f64(const SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors.find(name);
  return it == f.tensors.end() ? Tensor() : it->second.to(DType::F64);
}

inline LstmSpec fixture_spec(const SafetensorsFile& f) {
  auto meta = [&](const char* k) -> const std::string& {
    auto it = f.metadata.find(k);
    LSTM_REQUIRE(it != f.metadata.end(), "fixture has no metadata '" << k << "'");
    return it->second;
  };
  LstmSpec s;
  s.input_size = std::stoll(meta("input_size"));
  s.hidden_size = std::stoll(meta("hidden_size"));
  s.num_layers = std::stoll(meta("num_layers"));
  s.proj_size = std::stoll(meta("proj_size"));
  s.bidirectional = meta("bidirectional") == "1";
  s.batch_first = meta("batch_first") == "1";
  s.bias = meta("bias") == "1";
  return s;
}

// A golden file as a problem (inputs rounded through dt; d_weights start at 0.01) and PyTorch's
// results as a Result.
struct FixtureCase {
  Problem p;
  Result torch;
  bool f32_file = false;  // PyTorch's float32 results: good to about 1e-6 whatever we compute in
};
inline FixtureCase load_fixture(const std::string& path, DType dt) {
  const SafetensorsFile f = read_safetensors(path);
  FixtureCase fc;
  fc.f32_file = f.metadata.count("dtype") && f.metadata.at("dtype") == "F32";
  Problem& p = fc.p;
  p.spec = fixture_spec(f);
  auto rounded = [&](const std::string& n) {
    Tensor t = fixture_f64(f, n);
    return t.defined() && dt != DType::F64 ? t.to(dt).to(DType::F64) : t;
  };
  for (const auto& n : p.spec.param_names()) {
    p.w.push_back(rounded(n));
    p.dw0.push_back(Tensor::full(p.spec.param_shape(n), 0.01, DType::F64).to(dt).to(DType::F64));
  }
  p.in.x = rounded("input");  // NaN past each length, as stored
  if (auto it = f.tensors.find("lengths"); it != f.tensors.end())
    for (int64_t i = 0; i < it->second.numel(); ++i) p.in.lengths.push_back(static_cast<int64_t>(it->second.get(i)));
  p.in.h0 = rounded("h0");
  p.in.c0 = rounded("c0");
  p.grad = {rounded("r_output"), rounded("r_h_n"), rounded("r_c_n")};
  Result& r = fc.torch;
  r.out = {fixture_f64(f, "output"), fixture_f64(f, "h_n"), fixture_f64(f, "c_n")};
  r.g = {fixture_f64(f, "grad_input"), fixture_f64(f, "grad_h0"), fixture_f64(f, "grad_c0")};
  for (const auto& n : p.spec.param_names()) r.dw.push_back(fixture_f64(f, "grad." + n));
  return fc;
}

}  // namespace lstm::testing
