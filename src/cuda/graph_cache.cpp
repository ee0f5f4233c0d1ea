// The CUDA-graph cache shared by the GPU backends.
#include "cuda/graph_cache.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <sstream>

#include "lstm/device.hpp"

namespace lstm::cuda {

GraphFirstLook cuda_graphs_first_look(double host_us, double gpu_us, size_t staged_bytes, double copy_gbs) {
  GraphFirstLook r;
  const double gbs = copy_gbs > 0 ? copy_gbs : 1000.0;
  r.copy_us = 2.0 * static_cast<double>(staged_bytes) / (gbs * 1e3);  // GB/s = 1e3 bytes per us
  r.host_bound = host_us >= 0.5 * gpu_us;
  r.cheap_copy = r.copy_us <= 0.05 * gpu_us;
  return r;
}

namespace {
// What "auto" counts a device copy at: 80% of the device's theoretical memory bandwidth (an
// H200 copied at 4245 of its 4814 GB/s, bytes read + written). 0 (the rule's fallback) when the
// device does not say.
double device_copy_gbs() {
  int dev = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&dev));
  for (const GpuInfo& g : cuda_devices())
    if (g.index == dev) return 0.8 * g.memory_bandwidth_gbs;
  return 0;
}
}  // namespace

GraphRunner::GraphRunner(GraphMode mode, std::string name) : mode_(mode), name_(std::move(name)) {}

GraphRunner::~GraphRunner() {
  if (capture_stream_) cudaStreamDestroy(capture_stream_);
}

void GraphRunner::eager(GraphCache& gc, FnRef<void()> run) {
  last_ = "eager";
  // Under the caller's capture (torch.cuda.graph around a call) nothing is timed: event timing
  // and queries are not allowed there, and what the caller replays is its own graph.
  const bool measure = mode_ == GraphMode::Auto && gc.state_ == GraphCache::kUndecided && gc.eager_calls_ >= 1 &&
                       gc.marks_.size() < kSamples && !stream_capturing(stream());
  ++gc.eager_calls_;
  if (!measure) {
    run();
    return;
  }
  begin_mark(gc);
  GraphCache::Mark& m = gc.marks_.back();
  const auto t0 = std::chrono::steady_clock::now();
  run();
  m.host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  LSTM_CUDA_CHECK(cudaEventRecord(m.end->get(), stream()));
}

void GraphRunner::begin_mark(GraphCache& gc) {
  gc.marks_.emplace_back();
  GraphCache::Mark& m = gc.marks_.back();
  m.begin = std::make_unique<Event>();
  m.end = std::make_unique<Event>();
  LSTM_CUDA_CHECK(cudaEventRecord(m.begin->get(), stream()));
}

// The fastest GPU time (and host time) of kSamples marks, once all of them have happened (false
// before: never waits).
bool GraphRunner::fastest(const GraphCache& gc, double* gpu_us, double* host_us) {
  if (gc.marks_.size() < kSamples) return false;
  const cudaError_t q = cudaEventQuery(gc.marks_.back().end->get());
  if (q == cudaErrorNotReady) return false;
  LSTM_CUDA_CHECK(q);
  *gpu_us = *host_us = 1e300;
  for (const auto& m : gc.marks_) {
    float ms = 0;
    LSTM_CUDA_CHECK(cudaEventElapsedTime(&ms, m.begin->get(), m.end->get()));
    *gpu_us = std::min(*gpu_us, 1e3 * static_cast<double>(ms));
    *host_us = std::min(*host_us, m.host_us);
  }
  return true;
}

bool GraphRunner::replay(GraphCache& gc, std::span<const void* const> key, std::initializer_list<Stage> stages,
                         Issue issue, Describe what) {
  if (mode_ == GraphMode::Off || gc.state_ == GraphCache::kEager) return false;
  // The caller is capturing the engine stream into a graph of its own (torch.cuda.graph): issue
  // the work eagerly into it, leaving this cache's state as it is (no capture inside a capture).
  if (stream_capturing(stream())) return false;
  LSTM_CHECK(stages.size() <= kMaxStages, "a graphed call stages " << stages.size() << " inputs, at most "
                                                                   << kMaxStages << " are supported");
  // The stages are taken on a cache's first call, so that the calls after warm-up allocate
  // nothing (a training loop's steps never call cudaMalloc); a cache that goes eager returns them.
  size_t staged_bytes = 0;
  if (gc.stages_.size() != stages.size()) gc.stages_.resize(stages.size());
  void* bufs[kMaxStages] = {};
  size_t n = 0;
  for (const Stage& s : stages) {
    staged_bytes += s.bytes;
    gc.stages_[n].ensure(std::max<size_t>(s.bytes, 1));
    bufs[n] = gc.stages_[n].get();
    ++n;
  }
  const std::span<void* const> staged(bufs, n);
  if (gc.state_ == GraphCache::kUndecided) decide(gc, staged_bytes, what);
  if (gc.state_ == GraphCache::kTrial) judge_trial(gc, what);
  if (gc.state_ == GraphCache::kEager) gc.stages_.clear();
  if (gc.state_ != GraphCache::kReplay && gc.state_ != GraphCache::kTrial) return false;

  auto matches = [&](const GraphCache::Entry& e) {
    return e.key.size() == key.size() + n && std::equal(key.begin(), key.end(), e.key.begin()) &&
           std::equal(staged.begin(), staged.end(), e.key.begin() + static_cast<std::ptrdiff_t>(key.size()));
  };
  GraphCache::Entry* hit = nullptr;
  for (auto& e : gc.entries_)
    if (matches(e)) hit = &e;
  const bool was_hit = hit != nullptr;
  if (hit) {
    ++gc.replays_;
    ++counts_.replays;
  } else {
    // A capture costs about an eager call's host time and more: a cache that keeps capturing
    // (buffers that cycle through more sets than it keeps) is slower than eager calls.
    if (gc.captures_ >= static_cast<int>(2 * kMaxGraphs) && 4 * gc.captures_ > gc.replays_) {
      give_up(gc, what, "the output, h0/c0 or reserve buffers change too often");
      return false;
    }
    if (gc.entries_.size() >= kMaxGraphs)
      gc.entries_.erase(std::min_element(gc.entries_.begin(), gc.entries_.end(),
                                         [](const GraphCache::Entry& a, const GraphCache::Entry& b) {
                                           return a.last_use < b.last_use;
                                         }));
    GraphCache::Entry e;
    e.key.assign(key.begin(), key.end());
    e.key.insert(e.key.end(), staged.begin(), staged.end());
    const std::string why = capture(issue, staged, e.exec);
    if (!why.empty()) {
      give_up(gc, what, why);
      return false;
    }
    ++gc.captures_;
    ++counts_.captures;
    gc.entries_.push_back(std::move(e));
    hit = &gc.entries_.back();
  }
  hit->last_use = ++gc.clock_;
  // The trial times kSamples replays of graphs captured on an earlier call, copies included.
  const bool measure = gc.state_ == GraphCache::kTrial && was_hit && gc.marks_.size() < kSamples;
  if (measure) begin_mark(gc);
  n = 0;
  for (const Stage& s : stages) s.fill(bufs[n++]);
  LSTM_CUDA_CHECK(cudaGraphLaunch(hit->exec.get(), stream()));
  if (measure) LSTM_CUDA_CHECK(cudaEventRecord(gc.marks_.back().end->get(), stream()));
  last_ = "replayed";
  return true;
}

// "auto"'s second look: the measured replays against the measured eager calls, the fastest of
// each. Graphs stay when a replay took no longer than an eager call's GPU time (which, where the
// host sets the pace, includes the GPU's waiting for it). A guard: on the H200 graphs ran up to
// 1.9x slower than eager calls while most calls captured anew (the arena then cycled outputs
// through every cached block of their size, docs/PERFORMANCE.md); nothing says a replay cannot
// lose for another reason on another GPU or library version.
void GraphRunner::judge_trial(GraphCache& gc, Describe what) {
  double graph_us = 0, host_us = 0;
  if (!fastest(gc, &graph_us, &host_us)) return;
  gc.marks_.clear();
  const bool keep = graph_us <= gc.eager_us_;
  std::ostringstream os;
  os << name_ << " (" << what() << "): the fastest of " << kSamples << " replays took " << graph_us << " us against "
     << gc.eager_us_ << " us for the fastest eager call: " << (keep ? "replay" : "eager") << '\n';
  note(os.str());
  if (keep) {
    gc.state_ = GraphCache::kReplay;
  } else {
    gc = GraphCache();
    gc.state_ = GraphCache::kEager;
  }
}

// Moves an undecided cache on when it can (never waits for the GPU): "on" to replay, "auto" to
// eager or to a trial of graphs (cuda_graphs_first_look; judge_trial has the last word).
void GraphRunner::decide(GraphCache& gc, size_t staged_bytes, Describe what) {
  if (mode_ == GraphMode::On) {
    if (gc.eager_calls_ >= 1) gc.state_ = GraphCache::kReplay;
    return;
  }
  double gpu_us = 0, host_us = 0;
  if (!fastest(gc, &gpu_us, &host_us)) return;
  if (copy_gbs_ < 0) copy_gbs_ = device_copy_gbs();
  const GraphFirstLook look = cuda_graphs_first_look(host_us, gpu_us, staged_bytes, copy_gbs_);
  gc.state_ = look.try_graphs() ? GraphCache::kTrial : GraphCache::kEager;
  gc.eager_us_ = gpu_us;
  gc.marks_.clear();
  std::ostringstream os;
  os << name_ << " (" << what() << "): the fastest of " << kSamples << " eager calls: host " << host_us
     << " us to issue, GPU " << gpu_us << " us, copies into the graph's inputs about " << look.copy_us
     << " us: " << (gc.state_ == GraphCache::kTrial ? "try graphs" : "eager") << '\n';
  note(os.str());
}

void GraphRunner::give_up(GraphCache& gc, Describe what, const std::string& why) {
  gc = GraphCache();
  gc.state_ = GraphCache::kEager;
  note(name_ + " (" + what() + "): eager from now on: " + why + '\n');
}

// Records issue(staged) into `out` on the capture stream, which is the thread's engine stream
// meanwhile. Returns why it failed ("" on success).
std::string GraphRunner::capture(Issue issue, std::span<void* const> staged, GraphExec& out) {
  if (!capture_stream_) LSTM_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  cudaError_t begin = cudaSuccess, end = cudaSuccess;
  std::string failed;
  {
    StreamGuard on_capture(capture_stream_);
    // Thread-local mode: a call the issuer may not make while capturing (a synchronisation, an
    // allocation) fails the capture instead of running outside the graph.
    begin = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal);
    if (begin == cudaSuccess) {
      // The capture must end whatever the issuer does; what it throws fails the capture, and
      // the eager call that follows meets the error again and reports it.
      try {
        failed = issue(staged);
      } catch (const std::exception& e) {
        failed = std::string("the issuing call threw under stream capture: ") + e.what();
      }
      end = cudaStreamEndCapture(capture_stream_, &g);
    }
  }
  std::string why;
  if (begin != cudaSuccess)
    why = std::string("cudaStreamBeginCapture failed: ") + cudaGetErrorString(begin);
  else if (!failed.empty())
    why = failed;
  else if (end != cudaSuccess || !g)
    why = std::string("cudaStreamEndCapture failed: ") + cudaGetErrorString(end);
  if (why.empty()) {
    const cudaError_t inst = cudaGraphInstantiate(out.out(), g, 0);
    if (inst != cudaSuccess) why = std::string("cudaGraphInstantiate failed: ") + cudaGetErrorString(inst);
  }
  if (g) cudaGraphDestroy(g);
  if (!why.empty()) {
    (void)cudaGetLastError();  // the failed capture's error must not be blamed on a later call
    return why;
  }
  LSTM_CUDA_CHECK(cudaGraphUpload(out.get(), stream()));
  return "";
}

void GraphRunner::note(const std::string& line) {
  // Bounded: a process that keeps changing shapes would otherwise grow it without end.
  if (log_.size() > (1u << 16)) log_.erase(0, log_.size() / 2);
  log_ += line;
}

bool GraphRunner::settled(const GraphCache* gc) const {
  return !gc || mode_ == GraphMode::Off || gc->state_ == GraphCache::kReplay || gc->state_ == GraphCache::kEager;
}

}  // namespace lstm::cuda
