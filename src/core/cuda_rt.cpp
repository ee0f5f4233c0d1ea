// The engine stream, the caching device arena and pinned buffers.
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"

#include <cstdlib>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace lstm::cuda {

void throw_status(const char* file, int line, const char* expr, const std::string& lib, const std::string& status) {
  std::ostringstream os;
  os << lib << " error at " << file << ":" << line << ": " << expr << " failed: " << status;
  throw Error(os.str());
}

namespace {

thread_local cudaStream_t t_stream = nullptr;
thread_local const ExternalAllocator* t_external = nullptr;

// The engine stream of a host thread: by default the legacy default stream, the one PyTorch
// issues nn.LSTM on. Measured on the H200 (docs/PERFORMANCE.md, 2026-12-01): the same
// cudnnRNNForward runs the same kernels on either stream, but on a stream of our own made with
// cudaStreamCreateWithFlags it took 4-12% longer per call (L1-H1024-B64-T100 tf32 inference:
// 2.09 ms against 1.88 ms; the GPU clock equal, the host far ahead of the GPU). Every thread then
// shares that stream. LSTM_CUDA_STREAM=own gives each host thread a non-blocking stream of its
// own instead. Streams created per host thread are never destroyed: kernels may still be queued
// on them when a thread ends, and the driver reclaims them at exit.
cudaStream_t make_thread_stream() {
  const char* mode = std::getenv("LSTM_CUDA_STREAM");
  const std::string m = mode ? mode : "";
  if (m.empty() || m == "legacy") return cudaStreamLegacy;
  if (m != "own")
    throw Error("LSTM_CUDA_STREAM: expected 'legacy' (the default) or 'own', got '" + m + "'");
  cudaStream_t s;
  LSTM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// Size classes: small requests round up to 512 B, large ones to 2 MiB so that a training
// loop's slowly varying sizes (e.g. the last partial batch) reuse blocks instead of growing.
size_t round_size(size_t n) {
  if (n == 0) n = 1;
  if (n <= (1u << 20)) return (n + 511) / 512 * 512;
  const size_t big = size_t(2) << 20;
  return (n + big - 1) / big * big;
}

struct Block {
  size_t size;
  cudaStream_t stream;               // the one it was allocated on, whose free list it goes back to
  std::vector<cudaStream_t> others;  // other streams it was used on (arena_record_stream)
};

// A freed block that other streams may still be using: reusable once every event (recorded on
// each of those streams when it was freed) has completed.
struct Pending {
  void* p;
  size_t size;
  cudaStream_t stream;
  std::vector<cudaEvent_t> events;
};

class Arena {
 public:
  void* alloc(size_t bytes, cudaStream_t s) {
    const size_t n = round_size(bytes);
    if (t_external && t_external->alloc) return alloc_external(*t_external, n, s);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.allocations;
    // Not while s is being captured: an event query there would invalidate the capture.
    if (!pending_.empty() && !capturing(s)) collect_pending(false);
    auto& fl = free_[s];
    // Best fit, but a large block is not split nor used for a request under half its size. Of
    // the free blocks of that size the one freed last (multimap keeps equal keys in insertion
    // order): a loop that frees and allocates the same sizes gets the same blocks back on every
    // iteration, which CUDA graphs keyed on buffer addresses rely on (taking the oldest instead
    // cycled through every cached block of the size).
    auto it = fl.lower_bound(n);
    if (it != fl.end() && it->first <= 2 * n + (size_t(1) << 20)) {
      it = std::prev(fl.upper_bound(it->first));
      void* p = it->second;
      size_t sz = it->first;
      fl.erase(it);
      used_[p] = {sz, s, {}};
      account_in_use(sz);
      return p;
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_locked();
      e = cudaMalloc(&p, n);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      std::ostringstream os;
      os << "device memory: cannot allocate " << n << " bytes (" << cudaGetErrorString(e) << "); " << free_b
         << " of " << total_b << " bytes free, " << stats_.in_use_bytes << " in use by lstm-engine tensors";
      throw Error(os.str());
    }
    ++stats_.device_mallocs;
    stats_.reserved_bytes += n;
    used_[p] = {n, s, {}};
    account_in_use(n);
    return p;
  }

  void free(void* p) {
    ExternalAllocator ext;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto x = external_.find(p);
      if (x == external_.end()) {
        free_locked(p);
        return;
      }
      ext = x->second.first;
      stats_.in_use_bytes -= x->second.second;
      external_.erase(x);
    }
    // Outside the lock: the callback may take locks of its own (Python's GIL).
    ext.free(ext.ctx, p);
  }

  void free_locked(void* p) {
    auto it = used_.find(p);
    if (it == used_.end()) return;  // not ours: ignore rather than corrupt the cache
    Block& b = it->second;
    stats_.in_use_bytes -= b.size;
    if (b.others.empty()) {
      free_[b.stream].emplace(b.size, p);
    } else {
      Pending pd{p, b.size, b.stream, {}};
      for (cudaStream_t o : b.others) {
        cudaEvent_t e = nullptr;
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess && cudaEventRecord(e, o) == cudaSuccess) {
          pd.events.push_back(e);
          continue;
        }
        // No event on that stream (e.g. it belongs to another device): wait for it here rather
        // than hand the block out early. free runs in destructors: it must not throw.
        (void)cudaGetLastError();
        if (e) cudaEventDestroy(e);
        (void)cudaStreamSynchronize(o);
        (void)cudaGetLastError();
      }
      pending_.push_back(std::move(pd));
    }
    used_.erase(it);
  }

  void record_stream(void* p, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = used_.find(p);
    if (it == used_.end()) return;  // not ours (as free)
    Block& b = it->second;
    if (s == b.stream || std::find(b.others.begin(), b.others.end(), s) != b.others.end()) return;
    b.others.push_back(s);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    release_locked();
  }

  ArenaStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }

 private:
  void* alloc_external(const ExternalAllocator& ext, size_t n, cudaStream_t s) {
    void* p = ext.alloc(ext.ctx, n, s);
    if (!p) {
      std::ostringstream os;
      os << "device memory: the caller's allocator could not allocate " << n << " bytes";
      throw Error(os.str());
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.allocations;
    external_[p] = {ext, n};
    account_in_use(n);
    return p;
  }

  void account_in_use(size_t n) {
    stats_.in_use_bytes += n;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  }
  static bool capturing(cudaStream_t s) { return stream_capturing(s); }

  // Moves pending blocks whose events have completed (all of them, waiting, when `wait`) to the
  // free list of their stream.
  void collect_pending(bool wait) {
    for (size_t i = 0; i < pending_.size();) {
      Pending& pd = pending_[i];
      bool done = true;
      for (cudaEvent_t e : pd.events) {
        // A failed query (not "not ready") cannot say the work is pending; the error is the
        // work's, and its own call reports it.
        const cudaError_t q = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
        if (q == cudaErrorNotReady) {
          done = false;
          break;
        }
      }
      if (!done) {
        ++i;
        continue;
      }
      for (cudaEvent_t e : pd.events) cudaEventDestroy(e);
      free_[pd.stream].emplace(pd.size, pd.p);
      pending_[i] = std::move(pending_.back());
      pending_.pop_back();
    }
  }

  void release_locked() {
    collect_pending(true);
    // Cached blocks may still be referenced by queued work on their stream.
    for (auto& [s, fl] : free_) {
      if (fl.empty()) continue;
      cudaStreamSynchronize(s);
      for (auto& [sz, p] : fl) {
        cudaFree(p);
        stats_.reserved_bytes -= sz;
      }
      fl.clear();
    }
  }

  std::mutex mu_;
  std::unordered_map<cudaStream_t, std::multimap<size_t, void*>> free_;
  std::unordered_map<void*, Block> used_;
  std::unordered_map<void*, std::pair<ExternalAllocator, size_t>> external_;  // live blocks of ExternalAllocScope
  std::vector<Pending> pending_;
  ArenaStats stats_;
};

// Never destroyed: tensors held by static objects may be freed after main returns.
Arena& arena() {
  static Arena* a = new Arena();
  return *a;
}

}  // namespace

cudaStream_t stream() {
  if (!t_stream) t_stream = make_thread_stream();
  return t_stream;
}

StreamGuard::StreamGuard(cudaStream_t s) : prev_(stream()) {
  t_stream = s;
}
StreamGuard::~StreamGuard() { t_stream = prev_; }

bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // cannot tell: do not risk it
  }
  return st != cudaStreamCaptureStatusNone;
}

ExternalAllocScope::ExternalAllocScope(const ExternalAllocator* a) : prev_(t_external) {
  t_external = a && a->alloc ? a : nullptr;
}
ExternalAllocScope::~ExternalAllocScope() { t_external = prev_; }

void* arena_alloc(size_t bytes) { return arena().alloc(bytes, stream()); }
void arena_free(void* p) { arena().free(p); }
void arena_record_stream(void* p, cudaStream_t s) { arena().record_stream(p, s); }

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

void PinnedBuffer::ensure(size_t bytes) {
  if (bytes <= n_) return;
  if (p_) {
    LSTM_CUDA_CHECK(cudaStreamSynchronize(stream()));
    cudaFreeHost(p_);
    p_ = nullptr;
    n_ = 0;
  }
  LSTM_CUDA_CHECK(cudaMallocHost(&p_, bytes));
  n_ = bytes;
}

const cudaDeviceProp& device_prop() {
  static thread_local int dev = -1;
  static thread_local cudaDeviceProp prop;
  int d = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&d));
  if (d != dev) {
    LSTM_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    dev = d;
  }
  return prop;
}

}  // namespace lstm::cuda

namespace lstm {
ArenaStats arena_stats() { return cuda::arena().stats(); }
void arena_reset_peak() { cuda::arena().reset_peak(); }
void arena_release_cached() { cuda::arena().release(); }
}  // namespace lstm

#endif  // LSTM_HAVE_CUDA
