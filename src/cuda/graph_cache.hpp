// CUDA graphs of a GPU backend's per-call work (LstmOptions::cuda_graphs), for any backend
// (internal). The rules, validated on an H200 with cuDNN's calls, are LstmOptions::cuda_graphs'.
//
// A backend's host time to issue a call grows with the steps (cuDNN issues a few kernels per step
// and layer), and for small batches and hidden sizes the GPU waits for it; where it does not, a
// graph still closes the gaps between dependent per-step kernels. A call's work is captured once
// on a private stream (the legacy default stream cannot be captured) and replayed with one launch.
//
// Two pieces:
//   GraphRunner: one per backend instance: the mode, the capture stream, the counts, the log.
//   GraphCache: one per kind of call (e.g. inference forward, training forward, backward) and
//     content of the descriptors the issued kernels were derived from (for cuDNN: T and lengths).
//     Its graphs are keyed on every buffer baked into the kernels' arguments; the inputs that
//     move from call to call ("stages": x, d_output) are copied into the cache's own buffers
//     first, so the caller's may live anywhere.
// The arena hands a steady stream of calls the same blocks, so later calls find their graph; a
// call whose buffers match none is captured anew (at most kMaxGraphs per cache, least recently
// used first out), and a cache whose buffers keep changing goes back to eager calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if LSTM_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/cuda_rt.hpp"
#include "cuda/timing.hpp"
#endif
#include "lstm/lstm.hpp"

namespace lstm::cuda {

// cuda_graphs "auto"'s first look at a shape, from its measured eager calls (the fastest host
// time to issue one and the fastest GPU time, in us): whether a trial of replays is worth making.
// Yes when the host is what the call waits for (it took at least half the GPU's time to issue),
// or when the copies into the graph's input buffers that a replay adds (staged_bytes, each read
// and written once at copy_gbs GB/s of bytes read + written; 1000 when copy_gbs <= 0) take at most
// 5% of the call: a graph also closes the gaps between dependent per-step kernels, which the H200
// measured at 5-10% of cuDNN's GPU-bound shapes. The trial's replays, copies included, decide.
// Pure host arithmetic: needs no GPU.
struct GraphFirstLook {
  double copy_us = 0;
  bool host_bound = false;
  bool cheap_copy = false;
  bool try_graphs() const { return host_bound || cheap_copy; }
};
GraphFirstLook cuda_graphs_first_look(double host_us, double gpu_us, size_t staged_bytes, double copy_gbs);

// A non-owning reference to a callable, so that a per-call path can hand lambdas over without
// std::function's possible allocation. The callable must outlive the call it is passed to.
template <class Sig>
class FnRef;
template <class R, class... A>
class FnRef<R(A...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FnRef> && std::is_invocable_r_v<R, F&, A...>)
  FnRef(F&& f)  // NOLINT(google-explicit-constructor): passed as lambdas
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, A... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...); }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

#if LSTM_HAVE_CUDA

// An owned executable graph (destroying one that is still running frees it when it ends).
class GraphExec {
 public:
  GraphExec() = default;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  GraphExec(GraphExec&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  GraphExec& operator=(GraphExec&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~GraphExec() {
    if (h_) cudaGraphExecDestroy(h_);
  }
  cudaGraphExec_t get() const { return h_; }
  cudaGraphExec_t* out() { return &h_; }

 private:
  cudaGraphExec_t h_ = nullptr;
};

// An input a replay reads from a buffer of the cache: its size and how to fill it (on the
// engine stream, cuda::stream()).
struct Stage {
  size_t bytes;
  FnRef<void(void* dst)> fill;
};

// The graphs of one kind of call for one content of the descriptors its work was derived from.
// Only GraphRunner reads or changes it; a backend owns it where that content lives and drops it
// (assigns GraphCache()) when the content changes.
class GraphCache {
 public:
  GraphCache() = default;
  GraphCache(GraphCache&&) noexcept = default;
  GraphCache& operator=(GraphCache&&) noexcept = default;

 private:
  friend class GraphRunner;
  // kTrial ("auto"): replaying, until measured replays say whether graphs beat eager calls.
  enum State { kUndecided, kTrial, kReplay, kEager };
  // "auto" measures kSamples eager calls (from the second on: host time to issue each, GPU time
  // between two events), then kSamples replays (from the second on: GPU time).
  struct Mark {
    std::unique_ptr<Event> begin, end;
    double host_us = 0;
  };
  // One captured call: every buffer its kernels were recorded with (the stages last) and the graph.
  struct Entry {
    std::vector<const void*> key;
    GraphExec exec;
    uint64_t last_use = 0;
  };
  State state_ = kUndecided;
  int eager_calls_ = 0;
  std::vector<Mark> marks_;
  double eager_us_ = 0;  // the fastest measured eager call's GPU time
  std::vector<DeviceBuffer> stages_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
  int captures_ = 0, replays_ = 0;
};

// One backend instance's CUDA graphs: the mode, the private capture stream, the counts over
// every cache, the log of decisions, how the last call ran. Not thread-safe (as its backend).
class GraphRunner {
 public:
  // Graphs kept per cache; a call whose buffers match none is captured anew (the least recently
  // used graph goes when the cache is full).
  static constexpr size_t kMaxGraphs = 8;
  // Calls "auto" measures each way (eager, then replayed) before it keeps graphs or not.
  static constexpr size_t kSamples = 3;
  // Inputs a call may stage.
  static constexpr size_t kMaxStages = 4;

  // name starts each log line, e.g. "cuDNN graphs" gives "cuDNN graphs (<what>): ...".
  GraphRunner(GraphMode mode, std::string name);
  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  GraphMode mode() const { return mode_; }
  // Issues a call's work onto cuda::stream() (during a capture: the runner's capture stream),
  // reading the staged inputs from the buffers it gets (in the order of the stages). Returns ""
  // or why it failed; it must not synchronise or allocate (the capture fails then).
  using Issue = FnRef<std::string(std::span<void* const> staged)>;
  // What a log line says the call is (e.g. the case, the kind of call, the algorithm); called
  // only when a line is written.
  using Describe = FnRef<std::string()>;

  // Runs one call through `gc` as a graph when the cache replays: fills the stages, then launches
  // the graph recorded for key + the stage buffers (capturing `issue` first when none is). False
  // when the call is to run eagerly (graphs off, undecided, eager, or given up just now): then
  // the caller runs it through eager().
  bool replay(GraphCache& gc, std::span<const void* const> key, std::initializer_list<Stage> stages, Issue issue,
              Describe what);
  bool replay(GraphCache& gc, std::initializer_list<const void*> key, std::initializer_list<Stage> stages,
              Issue issue, Describe what) {
    return replay(gc, std::span<const void* const>(key.begin(), key.size()), stages, issue, what);
  }
  // Runs `run` (one call's work, issued eagerly on cuda::stream()), measuring it when it is one of
  // the calls an undecided cache under "auto" measures (the second to the (kSamples+1)-th).
  void eager(GraphCache& gc, FnRef<void()> run);
  // For a call that never replays (no cache): how last() reports it.
  void ran_eager() { last_ = "eager"; }

  // Whether gc (nullptr: a call without a cache) has made its decision, so later calls run as
  // the steady state will.
  bool settled(const GraphCache* gc) const;
  // "replayed" or "eager" for the last call ("" before any).
  const char* last() const { return last_; }
  LstmBackend::GraphCounts counts() const { return counts_; }
  const std::string& log() const { return log_; }

 private:
  void decide(GraphCache& gc, size_t staged_bytes, Describe what);
  void judge_trial(GraphCache& gc, Describe what);
  void give_up(GraphCache& gc, Describe what, const std::string& why);
  std::string capture(Issue issue, std::span<void* const> staged, GraphExec& out);
  void note(const std::string& line);
  static void begin_mark(GraphCache& gc);
  static bool fastest(const GraphCache& gc, double* gpu_us, double* host_us);

  GraphMode mode_;
  std::string name_;
  cudaStream_t capture_stream_ = nullptr;
  double copy_gbs_ = -1;  // device_copy_gbs() once "auto" first needs it (a GPU is there then)
  LstmBackend::GraphCounts counts_;
  std::string log_;
  const char* last_ = "";
};

#endif  // LSTM_HAVE_CUDA

}  // namespace lstm::cuda
