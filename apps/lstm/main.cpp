// The `lstm` command line program: train, eval, predict, generate, info, forward, plot.
#include <CLI/CLI.hpp>
#include <malloc.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <new>
#include <iostream>

#include "lstm/checked.hpp"
#include "lstm/device.hpp"
#include "lstm/lstm.hpp"
#include "lstm/model.hpp"
#include "lstm/parallel.hpp"
#include "lstm/plot.hpp"
#include "lstm/predict.hpp"
#include "lstm/safetensors.hpp"
#include "lstm/train.hpp"

#ifndef LSTM_DEFAULT_CORPUS_DIR
#define LSTM_DEFAULT_CORPUS_DIR "/usr/share/games/fortunes"
#endif

namespace {

using namespace lstm;

// The job `lstm train` runs with no arguments: a character language model on the fortune
// cookie corpus (Debian's fortunes packages), sized to finish in about three minutes on 2 cores.
nlohmann::json default_job() {
  nlohmann::json j = {{"task", "charlm"},
                      {"data", {{"path", LSTM_DEFAULT_CORPUS_DIR}}},
                      {"model",
                       {{"embedding_dim", 32},
                        {"layers", nlohmann::json::array({{{"type", "lstm"}, {"hidden_size", 256}}, {{"type", "dense"}}})}}},
                      {"train",
                       {{"steps", 3200},
                        {"batch_size", 32},
                        {"seq_len", 64},
                        {"log_every", 20},
                        {"eval_every", 800},
                        {"checkpoint_every", 800}}}};
  return j;
}

// The first SIGINT/SIGTERM asks the trainer to stop after its current step (it checkpoints
// first); a second one means "now": the default action is restored and the signal raised again.
std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler may only touch a lock-free atomic");

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(sig) != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // Without SA_RESTART a read interrupted by the signal fails with EINTR; the trainer should
  // finish its step undisturbed.
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

// A word for a POSIX shell: quoted unless it is plainly safe.
std::string shell_word(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@%") ==
                        std::string::npos)
    return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// --device/--precision/--algo/--cudnn-algo/--cuda-graphs as a Placement.
Placement make_placement(const std::string& device, const std::string& precision, const std::string& algo,
                         const std::string& cudnn_algo, const std::string& cuda_graphs) {
  Placement p;
  p.device = device_from_name(device);
  if (p.device == Device::CUDA) require_cuda("--device cuda");
  p.precision = precision_from_name(precision);
  p.lstm.algo = algo_from_name(algo);
  p.lstm.cudnn_algo = cudnn_algo_from_name(cudnn_algo, "--cudnn-algo");
  p.lstm.cuda_graphs = graph_mode_from_name(cuda_graphs, "--cuda-graphs");
  p.lstm.allow_tf32 = p.precision == Precision::TF32;
  return p;
}

// A floating tensor of the forward's model or input file, finite unless allowed otherwise.
const Tensor& floating_tensor(const Tensor& t, const std::string& file, const std::string& name, bool allow_nonfinite) {
  LSTM_REQUIRE(is_floating(t.dtype()), file << ": '" << name << "' must be floating point (F64, F32, BF16, F16), got "
                                            << dtype_name(t.dtype()) << " " << t.shape_str());
  if (!allow_nonfinite) {
    try {
      require_finite(t, file + ": '" + name + "'");
    } catch (const Error& e) {
      LSTM_THROW(e.what() << "; pass --allow-nonfinite to run it anyway");
    }
  }
  return t;
}

// Which nn.LSTM of a state_dict `lstm forward` runs: --prefix's ("lstm" and "lstm." alike), else the
// file's only one, bare (weight_ih_l0) or inside a model (lstm.weight_ih_l0).
std::string lstm_prefix_of(const std::map<std::string, Shape>& shapes, std::string given, const std::string& file) {
  const std::vector<std::string> found = LstmSpec::find_prefixes(shapes);
  std::string names;
  for (const auto& p : found) names += (names.empty() ? "'" : ", '") + p + "weight_ih_l0'";
  if (!given.empty()) {
    if (given.back() != '.') given += '.';
    LSTM_REQUIRE(std::find(found.begin(), found.end(), given) != found.end(),
                 file << ": --prefix " << given << ": no tensor '" << given << "weight_ih_l0'"
                      << (found.empty() ? std::string(" (the file holds no nn.LSTM weights)")
                                        : " (nn.LSTM weights found: " + names + ")"));
    return given;
  }
  LSTM_REQUIRE(!found.empty(), file << ": no nn.LSTM weights found: expected a tensor 'weight_ih_l0' (a bare "
                                       "nn.LSTM's state_dict) or 'NAME.weight_ih_l0' (a model's)");
  LSTM_REQUIRE(found.size() == 1, file << " holds " << found.size() << " LSTMs (" << names
                                       << "): choose one with --prefix");
  return found.front();
}

int cmd_forward(const std::string& model_path, const std::string& input_path, const std::string& output_path,
                const std::string& dtype_arg, const std::string& device_arg, const std::string& algo_arg,
                const std::string& cudnn_algo, const std::string& prefix_arg, bool allow_nonfinite) {
  const Device device = device_from_name(device_arg);
  if (device == Device::CUDA) require_cuda("--device cuda");
  SafetensorsFile m = read_safetensors(model_path);
  std::map<std::string, Shape> shapes;
  for (auto& [k, v] : m.tensors) shapes[k] = v.shape();
  LstmSpec spec;
  const std::string prefix = lstm_prefix_of(shapes, prefix_arg, model_path);
  try {
    spec = LstmSpec::infer(shapes, prefix);
    // Sizes read from shapes may come from empty tensors, so they are bounded as a config's are.
    checked_size(spec.hidden_size, 1, kMaxDim, "hidden size");
    checked_size(spec.input_size, 0, kMaxDim, "input size");
    checked_size(spec.num_layers, 1, kMaxLayers, "number of layers");
  } catch (const Error& e) {
    LSTM_THROW(model_path << ": " << e.what());
  }
  SafetensorsFile x = read_safetensors(input_path);
  auto it = x.tensors.find("input");
  LSTM_REQUIRE(it != x.tensors.end(), input_path << ": expected a tensor named 'input' [T, B, I]");
  const Tensor& input = it->second;
  LSTM_REQUIRE(is_floating(input.dtype()), input_path << ": 'input' must be floating point, got " << dtype_name(input.dtype()));
  // Storage dtype of the results and the precision the computation emulates.
  std::string dt = dtype_arg.empty() ? std::string() : dtype_arg;
  DType out_dtype = input.dtype();
  DType compute = input.dtype() == DType::F64 ? DType::F64 : DType::F32;
  bool round_operands = input.dtype() == DType::BF16 || input.dtype() == DType::F16;
  DType round_to = input.dtype();
  if (!dt.empty()) {
    if (dt == "f64") out_dtype = compute = DType::F64, round_operands = false;
    else if (dt == "f32" || dt == "tf32") out_dtype = compute = DType::F32, round_operands = false;
    else if (dt == "bf16") out_dtype = round_to = DType::BF16, compute = DType::F32, round_operands = true;
    else if (dt == "f16") out_dtype = round_to = DType::F16, compute = DType::F32, round_operands = true;
    else LSTM_THROW("--dtype must be one of f64, f32, tf32, bf16, f16; got '" << dt << "'");
  }
  if (device == Device::CUDA) {
    // On the GPU bf16/f16 are real storage types; the cell state and accumulation stay fp32.
    if (round_operands) compute = round_to;
    round_operands = false;
  }
  auto prep = [&](const Tensor& t) {
    Tensor c = round_operands ? t.to(round_to).to(compute) : t.to(compute);
    return c.to_device(device);
  };
  LstmOptions lo;
  lo.cudnn_algo = cudnn_algo_from_name(cudnn_algo, "--cudnn-algo");
  lo.allow_tf32 = dt == "tf32";
  // --algo is an algorithm (auto, reference, cudnn, fused, ...) or a backend of `lstm info`'s list
  // (e.g. cudnn:persist_static).
  std::unique_ptr<LstmBackend> be;
  if (algo_arg.find(':') != std::string::npos) {
    be = make_lstm_backend(algo_arg, lo, spec, compute, device);
  } else {
    lo.algo = algo_from_name(algo_arg);
    be = make_lstm_backend(lo, spec, compute, device);
  }
  // Weights go where the backend wants them (on the GPU: views into cuDNN's weight space).
  std::vector<Tensor> weights = make_flat_weights(spec, be->flat_layout(compute), compute, device);
  {
    const auto names = spec.param_names();
    for (size_t i = 0; i < names.size(); ++i)
      weights[i].copy_(prep(floating_tensor(m.tensors.at(prefix + names[i]), model_path, prefix + names[i], allow_nonfinite)));
  }
  LstmInput in;
  in.x = prep(input);
  if (auto l = x.tensors.find("lengths"); l != x.tensors.end()) {
    LSTM_REQUIRE(l->second.dim() == 1 && (l->second.dtype() == DType::I64 || l->second.dtype() == DType::I32),
                 input_path << ": 'lengths' must be int64 [B], got " << dtype_name(l->second.dtype()) << " "
                            << l->second.shape_str());
    const int64_t B = input.dim() == 3 ? input.size(1) : -1;
    LSTM_REQUIRE(l->second.numel() == B,
                 input_path << ": 'lengths' must have one entry per sequence (" << B << "), got " << l->second.numel());
    // Read as integers: through a double, 2^63-1 would come back as -2^63.
    const Tensor& lt = l->second;
    for (int64_t i = 0; i < lt.numel(); ++i)
      in.lengths.push_back(lt.dtype() == DType::I64 ? lt.data<int64_t>()[i] : lt.data<int32_t>()[i]);
  }
  // Values of input past a sequence's length may be anything, NaN included, so only h0/c0 are checked.
  if (auto h = x.tensors.find("h0"); h != x.tensors.end())
    in.h0 = prep(floating_tensor(h->second, input_path, "h0", allow_nonfinite));
  if (auto c = x.tensors.find("c0"); c != x.tensors.end())
    in.c0 = prep(floating_tensor(c->second, input_path, "c0", allow_nonfinite));
  for (auto& [k, v] : x.tensors)
    LSTM_REQUIRE(k == "input" || k == "lengths" || k == "h0" || k == "c0",
                 input_path << ": unexpected tensor '" << k << "' (expected input, lengths, h0, c0)");
  LstmOutput out;
  try {
    out = be->forward(weights, in, false, nullptr, nullptr, ExecContext::current(device));
  } catch (const Error& e) {
    LSTM_THROW(input_path << ": " << e.what());
  }
  write_safetensors(output_path, {{"output", out.output.to(out_dtype)}, {"h_n", out.h_n.to(out_dtype)},
                                  {"c_n", out.c_n.to(out_dtype)}},
                    {{"algo", be->last_run()}, {"device", device_arg}, {"dtype", dt.empty() ? dtype_name(out_dtype) : dt}});
  std::cerr << "lstm forward: " << spec.num_layers << " layer(s), hidden " << spec.hidden_size
            << (spec.bidirectional ? ", bidirectional" : "") << "; ran " << be->last_run() << " on " << device_arg
            << "; wrote " << output_path << "\n";
  return 0;
}

int cmd_info(const std::string& model_path, bool allow_nonfinite) {
  std::cout << "lstm-engine " << engine_build() << "\n";
  std::cout << "devices:\n  cpu: " << num_threads() << " threads; " << cpu_backend_description() << "\n";
  if (cuda_available()) {
    std::cout << "  cuda: " << cuda_versions() << "\n";
    for (const GpuInfo& g : cuda_devices())
      std::cout << "    gpu " << g.index << ": " << g.name << ", sm_" << g.cc_major << g.cc_minor << ", " << g.sms
                << " SMs, " << g.memory_bytes / (1024.0 * 1024 * 1024) << " GiB, " << g.clock_ghz << " GHz\n";
  } else {
    std::cout << "  cuda: unavailable: " << cuda_unavailable_reason() << "\n";
  }
  std::cout << "LSTM backends (--algo takes an algorithm or one of these names; auto: the fastest that runs "
               "the case, measured per shape among the device's backends):\n";
  for (const LstmBackendEntry& r : lstm_backends())
    std::cout << "  " << r.name << (r.baseline ? " (baseline)" : "") << ": " << r.summary << "\n";
  std::cout << "precisions: f64 (CPU), f32, tf32, bf16, f16 (GPU)\n";
  if (!model_path.empty()) {
    std::string p = resolve_model_path(model_path);
    std::map<std::string, std::string> meta;
    Model m = load_model(p, &meta, DType::F32, allow_nonfinite);
    std::cout << "model " << p << ":\n" << m.summary() << "\n";
    // What Algo::Auto measured for the model's LSTM stacks (on this machine's GPUs).
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : m.state_dict()) shapes[name] = t.shape();
    for (const std::string& prefix : LstmSpec::find_prefixes(shapes)) {
      const std::vector<std::string> choices = lstm_auto_choices(LstmSpec::infer(shapes, prefix));
      std::cout << "auto's choices for " << (prefix.empty() ? std::string("the LSTM") : prefix.substr(0, prefix.size() - 1))
                << (choices.empty() ? ": none measured yet\n" : ":\n");
      for (const auto& c : choices) std::cout << "  " << c << "\n";
    }
    if (auto t = meta.find("lstm_engine.task"); t != meta.end()) std::cout << "task: " << t->second << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Every training step allocates the same large activation buffers; keeping freed memory in
  // the heap instead of returning it to the kernel saves a page fault per 4 KiB per step.
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1024 << 20);
  CLI::App app{"lstm: train and run LSTM networks (lstm-engine)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lstm-engine " + engine_build());

  auto* train = app.add_subcommand("train", "train a model (no arguments: the default character language model job)");
  std::string config_path, data_path, out_dir = "runs/default", device = "cpu", precision = "f32", algo = "auto",
                                      cudnn_algo = "heuristic", cuda_graphs = "auto";
  int64_t steps = -1;
  int threads = 0;
  bool resume = false, overwrite = false, allow_nonfinite = false;
  const char* kAllowNonfinite = "load a model with NaN/Inf parameters anyway (to inspect it)";
  train->add_option("--config", config_path, "JSON training configuration (see include/lstm/train.hpp)");
  train->add_option("--data", data_path, "override data.path: a text file/folder (charlm) or a CSV file (classify, regress, tag, forecast)");
  train->add_option("--out", out_dir, "run folder for checkpoints and the final model")->capture_default_str();
  train->add_option("--steps", steps, "total optimizer steps (overrides the config)");
  train->add_option("--threads", threads, "CPU threads (0: all cores)");
  auto add_placement = [&](CLI::App* c) {
    c->add_option("--device", device, "cpu|cuda")->capture_default_str();
    c->add_option("--precision", precision, "f32 (CPU, GPU), tf32|bf16|f16 (GPU)")->capture_default_str();
    c->add_option("--algo", algo, "LSTM implementation: auto|reference|onednn|cudnn|fused|naive (lstm info lists them)")
        ->capture_default_str();
    c->add_option("--cudnn-algo", cudnn_algo,
                  "cuDNN's algorithm: standard|persist_static|persist_dynamic|persist_static_small_h|auto|heuristic")
        ->capture_default_str();
    c->add_option("--cuda-graphs", cuda_graphs,
                  "replay the GPU LSTM's calls as CUDA graphs: auto (when that pays, measured once per shape)|on|off")
        ->capture_default_str();
  };
  add_placement(train);
  train->add_flag("--resume", resume, "continue from the run folder's latest checkpoint");
  train->add_flag("--overwrite", overwrite, "start over in a run folder that holds another run (removes its checkpoints and model)");

  auto* eval = app.add_subcommand("eval", "evaluate a trained model on a test file or its held-out data");
  std::string model_arg;
  int64_t eval_batch = 0, eval_len = 0;
  bool eval_json = false;
  eval->add_option("--model", model_arg, "model.safetensors or a run folder")->required();
  eval->add_option("--data", data_path,
                   "a file to score in full with the model's vocabulary and classes (default: the held-out split of "
                   "the training data recorded in the model)");
  eval->add_option("--batch-size", eval_batch, "rows or windows per batch (0: the training batch_size)")
      ->capture_default_str();
  eval->add_option("--seq-len", eval_len, "window length for language models (0: the training seq_len)")
      ->capture_default_str();
  eval->add_flag("--json", eval_json, "print the whole report as one JSON object");
  add_placement(eval);
  eval->add_flag("--allow-nonfinite", allow_nonfinite, kAllowNonfinite);

  auto* pred = app.add_subcommand("predict", "run a trained model on new data (include/lstm/predict.hpp, docs/guide/predict-eval.md)");
  PredictOptions popts;
  pred->add_option("--model", popts.model_path, "model.safetensors or a run folder")->required();
  pred->add_option("--data", popts.data_path, "input: a CSV file (classify, regress, tag), a time series CSV (forecast: the steps after its end) or a text file, one context per line (charlm)")
      ->required();
  pred->add_option("--output", popts.output_path, "file to write (default: standard output)");
  pred->add_option("--format", popts.format, "csv|jsonl (default: jsonl for an --output ending in .jsonl, else csv)");
  pred->add_option("--top-k", popts.top_k, "charlm: next characters per line")->capture_default_str();
  pred->add_option("--batch-size", popts.batch_size, "rows read, run and written at a time")->capture_default_str();
  add_placement(pred);
  pred->add_flag("--allow-nonfinite", allow_nonfinite, kAllowNonfinite);

  auto* gen = app.add_subcommand("generate", "sample text from a character language model");
  std::string prime;
  int64_t gen_len = 300;
  double temperature = 0.8;
  uint64_t seed = 1;
  gen->add_option("--model", model_arg, "model.safetensors or a run folder")->required();
  gen->add_option("--prime", prime, "text to start from");
  gen->add_option("--length", gen_len, "characters to generate")->capture_default_str();
  gen->add_option("--temperature", temperature, "softmax temperature (> 0)")->capture_default_str();
  gen->add_option("--seed", seed)->capture_default_str();
  add_placement(gen);
  gen->add_flag("--allow-nonfinite", allow_nonfinite, kAllowNonfinite);

  auto* info = app.add_subcommand("info", "versions, devices, algorithms; with --model a model summary");
  info->add_option("--model", model_arg, "model.safetensors or a run folder");
  info->add_flag("--allow-nonfinite", allow_nonfinite, kAllowNonfinite);

  auto* fwd = app.add_subcommand("forward", "run an nn.LSTM state_dict on inputs from a safetensors file");
  std::string in_path, out_path, dtype_arg, algo_arg = "auto", fwd_cudnn_algo = "auto";
  fwd->add_option("--model", model_arg,
                  "safetensors with an nn.LSTM state_dict (weight_ih_l0, ...) or a model's holding one (lstm.weight_ih_l0, ...)")
      ->required();
  fwd->add_option("--input", in_path, "safetensors with input [T,B,I], optional lengths [B], h0, c0")->required();
  fwd->add_option("--output", out_path, "safetensors to write: output, h_n, c_n")->required();
  fwd->add_option("--dtype", dtype_arg, "f64|f32|tf32|bf16|f16 (default: the input's dtype)");
  fwd->add_option("--device", device, "cpu|cuda")->capture_default_str();
  fwd->add_option("--algo", algo_arg,
                  "an algorithm (auto|reference|onednn|cudnn|fused|naive) or a backend of lstm info's list, e.g. "
                  "cudnn:persist_static (auto: the fastest of the device's backends, measured per shape)")
      ->capture_default_str();
  fwd->add_option("--cudnn-algo", fwd_cudnn_algo,
                  "standard|persist_static|persist_dynamic|persist_static_small_h|auto|heuristic (auto: the "
                  "fastest that accepts the shape, timed once; heuristic: PyTorch's rule)")
      ->capture_default_str();
  std::string fwd_prefix;
  fwd->add_option("--prefix", fwd_prefix,
                  "which nn.LSTM of the file to run, by its attribute name (\"lstm\" for lstm.weight_ih_l0); default: "
                  "the file's only one");
  fwd->add_flag("--allow-nonfinite", allow_nonfinite, "accept NaN/Inf weights, h0 or c0");

  auto* plot = app.add_subcommand("plot", "draw a run's curves (loss, accuracy, learning rate) from its metrics.jsonl to a PNG");
  std::string run_arg, plot_out;
  plot->add_option("--run", run_arg, "the run folder (lstm train's --out)")->required();
  plot->add_option("--output", plot_out, "PNG file to write (default: RUN/curves.png)");

  // CLI11 would only say that a subcommand is required; a misspelt one deserves its name back.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* c : app.get_subcommands({})) {
      known = known || c->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + c->get_name();
    }
    if (!known) {
      std::cerr << "lstm: unknown command '" << argv[1] << "'; expected one of " << names << "\n";
      return 1;
    }
  }
  CLI11_PARSE(app, argc, argv);
  try {
    if (*train) {
      nlohmann::json cfg = default_job();
      // Read through the library: a deeply nested file would crash copies of it here.
      if (!config_path.empty()) cfg = read_train_config_file(config_path);
      LSTM_REQUIRE(!resume || (config_path.empty() && data_path.empty()),
                   "--resume continues with the configuration saved in the checkpoint; do not give --config or --data "
                   "with it");
      if (!data_path.empty()) cfg["data"]["path"] = data_path;
      if (steps >= 0) checked_size(steps, 0, int64_t{1} << 53, "--steps");
      checked_size(threads, 0, 65536, "--threads");
      TrainOptions o;
      o.threads = threads;
      o.config = cfg;
      o.out_dir = out_dir;
      o.resume = resume;
      o.steps = steps;
      LSTM_REQUIRE(!(resume && overwrite), "--resume continues the run in --out and --overwrite removes it; give one of them");
      o.overwrite = overwrite;
      o.placement = make_placement(device, precision, algo, cudnn_algo, cuda_graphs);
      o.stop = &g_stop;
      install_stop_handlers();
      TrainResult r = lstm::train(o);
      if (r.stopped_non_finite) return 3;
      if (r.stopped_by != 0) {
        // The placement is not part of the checkpoint, so the command repeats the flags that set it.
        std::string cmd = shell_word(argv[0]) + " train --resume --out " + shell_word(out_dir);
        for (auto* opt : train->get_options())
          for (const char* name : {"--threads", "--device", "--precision", "--algo", "--cudnn-algo", "--cuda-graphs"})
            if (opt->check_name(name) && opt->count() > 0) cmd += std::string(" ") + name + " " + shell_word(opt->as<std::string>());
        std::cerr << "lstm: stopped by " << (r.stopped_by == SIGINT ? "SIGINT" : "SIGTERM") << "; resume with: " << cmd
                  << "\n";
        return 128 + r.stopped_by;
      }
      std::cout << "trained " << r.step << " steps" << (r.stopped_early ? " (stopped early)" : "")
                << "; final validation loss " << r.valid_loss;
      if (r.regression)
        std::cout << " (normalised), MSE " << r.valid_mse << ", MAE " << r.valid_mae << ", RMSE " << r.valid_rmse
                  << " (original units)\n";
      else
        std::cout << ", accuracy " << 100 * r.valid_accuracy << "%\n";
      std::cout << "model: " << out_dir << "/model.safetensors = ";
      if (r.final_model == "best")
        std::cout << "the best by " << r.best_metric << " (" << r.best_value << " at step " << r.final_model_step << ")";
      else
        std::cout << "the last step's weights (step " << r.final_model_step << ")";
      std::cout << "; checkpoint: " << r.last_checkpoint << "\n";
      if (!r.sample.empty()) std::cout << "sample:\n" << r.sample << "\n";
      return 0;
    }
    if (*eval) {
      checked_size(eval_batch, 0, kMaxDim, "--batch-size");
      checked_size(eval_len, 0, kMaxDim, "--seq-len");
      EvalResult r = evaluate_model(model_arg, data_path, eval_batch, eval_len,
                                    make_placement(device, precision, algo, cudnn_algo, cuda_graphs), allow_nonfinite);
      if (eval_json)
        std::cout << r.to_json().dump(2) << "\n";
      else
        std::cout << r.report();
      return 0;
    }
    if (*pred) {
      checked_size(popts.top_k, 1, kMaxDim, "--top-k");
      checked_size(popts.batch_size, 1, kMaxDim, "--batch-size");
      popts.placement = make_placement(device, precision, algo, cudnn_algo, cuda_graphs);
      popts.allow_nonfinite = allow_nonfinite;
      PredictResult r = lstm::predict(popts, std::cout);
      if (r.unknown > 0)
        std::cerr << "lstm predict: " << r.unknown << " input " << (r.task == "charlm" ? "character(s)" : "token(s)")
                  << " not in the model's vocabulary were read as <unk>\n";
      if (!popts.output_path.empty() && popts.output_path != "-")
        std::cerr << "lstm predict: " << r.rows << " rows (" << r.task << ") -> " << popts.output_path << " (" << r.format
                  << ")\n";
      return 0;
    }
    if (*gen) {
      checked_size(gen_len, 0, kMaxDim, "--length");
      std::string text = generate_text(model_arg, prime, gen_len, temperature, seed,
                                       make_placement(device, precision, algo, cudnn_algo, cuda_graphs), allow_nonfinite);
      std::cout << prime << text << "\n";
      return 0;
    }
    if (*info) return cmd_info(model_arg, allow_nonfinite);
    if (*plot) {
      const std::string png = plot_out.empty() ? run_arg + "/curves.png" : plot_out;
      PlotResult r = plot_run(run_arg, png);
      std::cout << "wrote " << png << " (" << r.width << "x" << r.height << "): " << r.train_records
                << " training lines, " << r.eval_records << " evaluations";
      if (r.skipped_lines) std::cout << "; skipped " << r.skipped_lines << " incomplete line(s)";
      std::cout << "\n";
      return 0;
    }
    if (*fwd) return cmd_forward(model_arg, in_path, out_path, dtype_arg, device, algo_arg, fwd_cudnn_algo, fwd_prefix,
                                   allow_nonfinite);
  } catch (const lstm::Error& e) {
    std::cerr << "lstm: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "lstm: error: out of memory (a size that passed every check still did not fit; lower the batch "
                 "or model size)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lstm: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
