// Algo::Auto: the first call with a shape (batch, steps, variable lengths or not, training or
// inference, h0/c0 or not) times every registered backend that accepts it on the device and keeps
// the fastest. On a GPU the candidates are cuDNN's algorithms and our kernels; on the CPU the
// reference and onednn (which wins moves with the shape, the thread count and the oneDNN version:
// the reference's per-thread blocks of W_hh won some batch-1 shapes, docs/DESIGN.md).
// Where one backend alone accepts the case (F64 on the CPU: the reference), it runs unmeasured.
//
// Why measure rather than rule: which backend wins moves with the shape, the dtype and the GPU
// (cuDNN's persistent algorithms win small batches in fp16 and refuse bf16; our fused kernels win
// stacks; the standard algorithm wins large batches), and a rule written today is wrong on the
// next GPU or library. The choice is kept in a file per GPU, library versions and build of the
// engine (engine_build(): a build with other kernels measures again), so a process that meets
// the same shape again measures nothing.
//
// What is timed: each candidate warms up until it has settled (its CUDA-graph decision, at most
// kMaxWarmup calls), then kTimed calls are timed (GPU: events; CPU: the wall clock) and the fastest
// counts; a training
// call is a training forward plus a backward of a fixed random d_output into scratch gradients.
// Trials read the caller's weights and inputs and write only their own outputs; dropout draws
// from a copy of the caller's Rng, so measuring changes no result and no random stream.
#include "model/lstm_auto.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cpu/lstm_onednn.hpp"
#include "lstm/device.hpp"
#include "lstm/parallel.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/exec.hpp"
#include "cuda/timing.hpp"
#endif

namespace lstm {

std::string auto_cache_path(const std::string& setting) {
  if (setting == "-") return "";
  if (!setting.empty()) return setting;
  if (const char* e = std::getenv("LSTM_AUTO_CACHE"); e && *e) return std::string(e) == "-" ? "" : e;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/lstm-engine/auto.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/lstm-engine/auto.json";
  return "";
}

std::string auto_spec_key(const LstmSpec& s) {
  std::ostringstream os;
  os << "I" << s.input_size << " H" << s.hidden_size << " L" << s.num_layers << (s.bidirectional ? " bi" : "") << " P"
     << s.proj_size << (s.bias ? "" : " nobias") << (s.batch_first ? " batch_first" : "") << " dropout" << s.dropout;
  return os.str();
}

std::vector<std::string> lstm_auto_choices(const LstmSpec& spec, const std::string& auto_cache) {
  std::vector<std::string> lines;
  const std::string path = auto_cache_path(auto_cache);
  if (path.empty()) return lines;
  std::ifstream in(path);
  if (!in) return lines;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object()) return lines;
  const std::string want = " | " + auto_spec_key(spec) + " ";
  for (const auto& [key, v] : j.items()) {
    if (key.find(want) == std::string::npos || !v.is_object() || !v.contains("pick") || !v["pick"].is_string())
      continue;
    std::string line = key + ": " + v["pick"].get<std::string>();
    if (v.contains("us") && v["us"].is_object()) {
      std::string times;
      for (const auto& [row, us] : v["us"].items())
        if (us.is_number()) times += (times.empty() ? "" : ", ") + row + " " + std::to_string(us.get<double>()) + " us";
      if (!times.empty()) line += " (" + times + ")";
    }
    lines.push_back(line);
  }
  return lines;
}

namespace {

// The CPU's model name (from /proc/cpuinfo), "cpu" where it cannot be read.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "cpu";
}

constexpr int kMaxWarmup = 12;
constexpr int kTimed = 3;

// The choices file: one JSON object of key -> {"pick": row name, "us": {row: time}}. Read once per
// process and path; written whole (temporary file, then rename) after each new choice, so a
// crash leaves the old file or the new one, never half of one.
class ChoiceFile {
 public:
  static ChoiceFile& at(const std::string& path) {
    static std::mutex mu;
    static std::map<std::string, std::unique_ptr<ChoiceFile>> files;
    std::lock_guard<std::mutex> lock(mu);
    auto& f = files[path];
    if (!f) f.reset(new ChoiceFile(path));
    return *f;
  }
  std::string find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_object() || !it->contains("pick") || !(*it)["pick"].is_string()) return "";
    return (*it)["pick"].get<std::string>();
  }
  // Returns "" on success, else why the file could not be written (the choice still holds for
  // this process).
  std::string put(const std::string& key, const nlohmann::json& entry) {
    std::lock_guard<std::mutex> lock(mu_);
    j_[key] = entry;
    if (path_.empty()) return "";
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(fs::path(path_).parent_path(), ec);
    const std::string tmp = path_ + ".tmp." + std::to_string(reinterpret_cast<uintptr_t>(this));
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << j_.dump(1) << '\n';
      if (!out.good()) return "cannot write " + tmp;
    }
    fs::rename(tmp, path_, ec);
    if (ec) {
      fs::remove(tmp, ec);
      return "cannot replace " + path_;
    }
    return "";
  }

 private:
  explicit ChoiceFile(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    std::ifstream in(path_);
    if (!in) return;
    // A damaged file is measured over, not trusted: parse without exceptions and keep objects only.
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_object()) j_ = std::move(j);
  }
  std::mutex mu_;
  std::string path_;
  nlohmann::json j_ = nlohmann::json::object();
};

struct AutoSaved : LstmSaved {
  LstmBackend* backend = nullptr;
  std::unique_ptr<LstmSaved> inner;
};

class AutoBackend final : public LstmBackend {
 public:
  AutoBackend(const LstmOptions& o, const LstmSpec& spec, DType dtype, Device device)
      : LstmBackend(spec, dtype, device), options_(o), path_(auto_cache_path(o.auto_cache)) {
    options_.algo = Algo::Auto;
  }

  Algo algo() const override { return Algo::Auto; }
  std::string name() const override { return "auto"; }
  std::string last_run() const override {
    return last_ ? "auto: " + (last_->last_run().empty() ? last_->name() : last_->last_run()) : "";
  }
  std::string log() const override {
    std::string s = log_;
    for (const auto& [n, be] : chosen_) s += be->log();
    return s;
  }
  bool settled() const override { return last_ && last_->settled(); }
  GraphCounts graph_counts() const override {
    GraphCounts c;
    for (const auto& [n, be] : chosen_) {
      const GraphCounts g = be->graph_counts();
      c.captures += g.captures;
      c.replays += g.replays;
    }
    return c;
  }
  // The weights go where cuDNN wants them when cuDNN can run the case (the likeliest pick, and
  // the backend that gains from in-place weights); other backends read them where they are.
  FlatLayout flat_layout(DType dtype) const override {
    for (const auto& r : lstm_backends())
      if (r.algo == Algo::Cudnn && r.why_not(spec(), this->dtype(), device(), options_).empty())
        return r.make(spec(), this->dtype(), device(), options_)->flat_layout(dtype);
    return {};
  }

  LstmOutput forward(const std::vector<Tensor>& weights, const LstmInput& in, bool training, Rng* rng,
                     std::unique_ptr<LstmSaved>* saved, const ExecContext& ctx) override {
    auto [T, B] = check_call(in, weights, ctx);
    bool varlen = false;
    for (int64_t l : in.lengths) varlen = varlen || l < T;
    const bool train_mode = saved != nullptr;
    const Shape key{B, T, varlen, train_mode, in.h0.defined() || in.c0.defined()};
    auto it = picks_.find(key);
    LstmBackend* be = it != picks_.end() ? it->second : choose(key, weights, in, training, rng, ctx);
    last_ = be;
    if (!saved) return be->forward(weights, in, training, rng, nullptr, ctx);
    auto sv = std::make_unique<AutoSaved>();
    sv->backend = be;
    LstmOutput out = be->forward(weights, in, training, rng, &sv->inner, ctx);
    *saved = std::move(sv);
    return out;
  }

  LstmGrads backward(const std::vector<Tensor>& weights, const LstmSaved& saved, const LstmGradOutput& grad,
                     std::vector<Tensor>& d_weights, const ExecContext& ctx) override {
    const auto* sv = dynamic_cast<const AutoSaved*>(&saved);
    LSTM_REQUIRE(sv && sv->inner, "LSTM auto backward: the saved state does not come from this backend's forward");
    last_ = sv->backend;
    return sv->backend->backward(weights, *sv->inner, grad, d_weights, ctx);
  }

 private:
  std::string file_key(const Shape& k, const ExecContext& ctx) const {
    std::ostringstream os;
    if (device() == Device::CPU) {
      // The thread count decides as much as the CPU does.
      static const std::string model = cpu_model();
      os << model << " | lstm-engine " << engine_build() << ", " << num_threads() << " threads, oneDNN "
         << (cpu::onednn_built() ? cpu::onednn_version() : std::string("none")) << " | ";
    } else {
      std::string gpu = "?";
#if LSTM_HAVE_CUDA
      for (const GpuInfo& g : cuda_devices())
        if (g.index == ctx.device_index) gpu = g.name;
#endif
      os << gpu << " | lstm-engine " << engine_build() << ", " << cuda_versions() << " | ";
    }
    os << auto_spec_key(spec()) << ' ' << dtype_name(dtype())
       << (options_.allow_tf32 ? " tf32" : "") << " graphs:" << graph_mode_name(options_.cuda_graphs) << " | B" << k[0]
       << " T" << k[1] << (k[2] ? " varlen" : "") << (k[3] ? " train" : " infer") << (k[4] ? " h0" : "");
    return os.str();
  }

  // The instance of a row, made once and kept (saved states of its forwards point at it).
  LstmBackend* instance(const LstmBackendEntry& row) {
    auto& be = chosen_[row.name];
    if (!be) be = row.make(spec(), dtype(), device(), options_);
    return be.get();
  }

  // Whether a row may run this call: its spec check, and the call's lengths and initial state.
  std::string refusal(const LstmBackendEntry& row, const Shape& k) const {
    if (row.baseline) return "a baseline";
    if (!row.variable_lengths && k[2]) return "no variable lengths";
    if (!row.initial_state && k[4]) return "no h0/c0";
    return row.why_not(spec(), dtype(), device(), options_);
  }

  LstmBackend* choose(const Shape& k, const std::vector<Tensor>& weights, const LstmInput& in, bool training,
                      Rng* rng, const ExecContext& ctx) {
    const std::string fk = file_key(k, ctx);
    ChoiceFile& file = ChoiceFile::at(path_);
    const std::string cached = file.find(fk);
    if (!cached.empty()) {
      for (const auto& r : lstm_backends())
        if (r.name == cached && refusal(r, k).empty()) {
          log_ += "auto (" + fk + "): " + cached + ", measured earlier (" + path_ + ")\n";
          return picks_[k] = instance(r);
        }
    }
#if LSTM_HAVE_CUDA
    // Timing needs events and waits, which a stream under capture refuses (and would break the
    // caller's capture): the shape must have been run once before, as torch.cuda.graph's
    // warm-up does.
    if (device() == Device::CUDA)
      LSTM_REQUIRE(!cuda::stream_capturing(cuda::stream_of(ctx)),
                   "LSTM algo 'auto': the first call with this shape (" << fk
                       << ") came under CUDA graph capture, where nothing can be measured; run the same call once "
                          "before capturing (a warm-up), or choose a backend by name");
#endif
    std::ostringstream log;
    log << "auto (" << fk << "):";
    if (device() == Device::CPU) {
      // One candidate: nothing to measure (and nothing worth a line in the file).
      const LstmBackendEntry* only = nullptr;
      int n = 0;
      for (const auto& r : lstm_backends())
        if (refusal(r, k).empty()) only = &r, ++n;
      if (n == 1) {
        log_ += log.str() + " " + only->name + ", the only backend that runs it\n";
        return picks_[k] = instance(*only);
      }
    }
    nlohmann::json times = nlohmann::json::object();
    const LstmBackendEntry* best = nullptr;
    double best_us = 0;
    for (const auto& r : lstm_backends()) {
      const std::string why = refusal(r, k);
      if (!why.empty()) {
        if (!r.baseline) log << ' ' << r.name << " cannot (" << why << ");";
        continue;
      }
      try {
        LstmBackend* be = instance(r);
        const double us = time_calls(*be, weights, in, k[3] != 0, training, rng, ctx);
        log << ' ' << r.name << ' ' << us << " us;";
        times[r.name] = us;
        const LstmBackendEntry* loser = &r;
        if (!best || us < best_us) {
          loser = best;
          best = &r;
          best_us = us;
        }
        // At most two candidates hold workspaces at a time, so that measuring costs little more
        // device memory than running the winner.
        if (loser) drop_unless_picked(loser->name);
      } catch (const Error& e) {
        log << ' ' << r.name << " failed (" << e.what() << ");";
        drop_unless_picked(r.name);
      }
    }
    LSTM_REQUIRE(best, "LSTM auto: no registered backend runs this case:" << log.str().substr(log.str().find(':') + 1));
    // A backend may draw from the Rng once per instance (cuDNN seeds its dropout state on its
    // first training call); the trials drew from a copy, so the caller's Rng would never be drawn
    // from. A fresh instance of the winner draws at the real call, as it would without Auto.
    if (training && rng) drop_unless_picked(best->name);
    instance(*best);
    log << " picked " << best->name << '\n';
    const std::string file_err = file.put(fk, {{"pick", best->name}, {"us", times}});
    log_ += log.str();
    if (!file_err.empty()) log_ += "auto: " + file_err + " (the choice holds for this process)\n";
    return picks_[k] = chosen_.at(best->name).get();
  }

  // Frees the instance of a row unless a shape's pick is that instance (saved forwards may
  // point at it).
  void drop_unless_picked(const std::string& name) {
    auto it = chosen_.find(name);
    if (it == chosen_.end()) return;
    for (const auto& [kk, be] : picks_)
      if (be == it->second.get()) return;
    chosen_.erase(it);
  }

  // The fastest of kTimed calls after warm-up, in microseconds of GPU time.
  double time_calls(LstmBackend& be, const std::vector<Tensor>& weights, const LstmInput& in, bool train_mode,
                    bool training, Rng* rng, const ExecContext& ctx) {
    Rng trial_rng = rng ? *rng : Rng(7);
    std::vector<Tensor> dw;
    Tensor dy;
    if (train_mode) {
      for (const auto& w : weights) dw.push_back(Tensor::zeros(w.shape(), w.dtype(), w.device()));
    }
    auto once = [&] {
      if (!train_mode) {
        be.forward(weights, in, training, &trial_rng, nullptr, ctx);
        return;
      }
      std::unique_ptr<LstmSaved> sv;
      LstmOutput out = be.forward(weights, in, training, &trial_rng, &sv, ctx);
      if (!dy.defined()) {
        Rng g(11);
        Tensor h = Tensor::empty(out.output.shape(), DType::F32);
        g.fill_uniform(h, -1, 1);
        dy = h.to(dtype()).to_device(device());
      }
      LstmGradOutput grad;
      grad.d_output = dy;
      be.backward(weights, *sv, grad, dw, ctx);
    };
    once();
    for (int i = 0; i < kMaxWarmup && !be.settled(); ++i) once();
    double best = 0;
    for (int i = 0; i < kTimed; ++i) {
      double us = 0;
      if (device() == Device::CPU) {
        const auto t0 = std::chrono::steady_clock::now();
        once();
        us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      } else {
#if LSTM_HAVE_CUDA
        us = cuda::time_us(cuda::stream_of(ctx), once);
#endif
      }
      best = i == 0 ? us : std::min(best, us);
    }
    return best;
  }

  LstmOptions options_;
  std::string path_;
  std::map<std::string, std::unique_ptr<LstmBackend>> chosen_;  // instances by row name
  std::map<Shape, LstmBackend*> picks_;                          // shape key -> one of chosen_
  LstmBackend* last_ = nullptr;
  std::string log_;
};

}  // namespace

std::unique_ptr<LstmBackend> make_auto_lstm_backend(const LstmOptions& options, const LstmSpec& spec, DType dtype,
                                                    Device device) {
  if (device == Device::CUDA) require_cuda("LSTM algo 'auto' on the GPU");
  return std::make_unique<AutoBackend>(options, spec, dtype, device);
}

}  // namespace lstm
