// The CUDA runtime layer of the engine (internal; only included where LSTM_HAVE_CUDA is set):
// the one throwing status check, the engine stream, and the caching arena.
//
// LSTM_CUDA_CHECK(expr) works for every status type the engine meets: cudaError_t (here),
// cublasStatus_t (cuda/cublas_util.hpp) and cudnnStatus_t (cudnn/cudnn_util.hpp); each header
// adds an overload of lstm::cuda::check. A failure throws lstm::Error with file:line, the
// failing expression and the library's error name and string.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "lstm/device.hpp"
#include "lstm/error.hpp"

namespace lstm::cuda {

[[noreturn]] void throw_status(const char* file, int line, const char* expr, const std::string& lib,
                               const std::string& status);

inline void check(cudaError_t e, const char* file, int line, const char* expr) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear a sticky-free error so the next call is not blamed
    throw_status(file, line, expr, "CUDA", std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e));
  }
}

// Checks the last kernel launch (launch configuration errors) without synchronising.
#define LSTM_CUDA_CHECK_LAUNCH() LSTM_CUDA_CHECK(cudaGetLastError())

// The engine stream of the calling host thread. Every engine kernel, copy and library call is
// issued on it. By default the legacy default stream (as PyTorch; measured faster for cuDNN's
// RNN calls, see make_thread_stream); LSTM_CUDA_STREAM=own: a non-blocking stream per host
// thread, created on first use on the current device.
cudaStream_t stream();
// Replaces the calling thread's engine stream until the guard is destroyed (benchmarks use it
// to run several streams; the arena keeps blocks per stream).
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t prev_;
};

// Caching arena: blocks are kept per stream after free and reused by later allocations on the
// same stream (stream order makes that safe without events). alloc never returns nullptr:
// when the device is full it releases the cache, retries, and then throws naming the size.
void* arena_alloc(size_t bytes);
void arena_free(void* p);
// Says that the block p (a pointer arena_alloc returned, not yet freed) is used by work on stream
// s as well as on the stream that allocated it (PyTorch's Tensor.record_stream). Stream order
// alone would let an allocation on the allocating stream reuse the block as soon as it is freed,
// while s may still read or write it. So, when such a block is freed, an event is recorded on
// each such stream and the block waits in a pending list: allocations poll the events
// (cudaEventQuery, never waiting) and reuse it only after all of them have completed; releasing
// the cache (arena_release_cached, or a full device) waits for them. Call it for every other
// stream the block is used on, before freeing it; s on another device than the current one at
// free time makes free wait for s instead. Pointers that are not arena blocks are ignored.
void arena_record_stream(void* p, cudaStream_t s);

// Whether work issued on s is being captured into a CUDA graph (by us or by the caller, e.g.
// torch.cuda.graph around a call through the C API). A failed query counts as capturing.
bool stream_capturing(cudaStream_t s);

// An allocator outside the engine (the C API's caller: PyTorch's caching allocator, whose graph
// pools keep memory that a captured graph uses alive and untouched). While an ExternalAllocScope
// is open on a thread, arena_alloc on that thread takes its blocks from `alloc` (nothing cached
// by the arena); arena_free gives such a block back through `free`, on whatever thread and
// whenever it is freed. alloc returns nullptr when it cannot allocate (arena_alloc then throws).
struct ExternalAllocator {
  void* (*alloc)(void* ctx, size_t bytes, cudaStream_t s) = nullptr;
  void (*free)(void* ctx, void* p) = nullptr;
  void* ctx = nullptr;
};
class ExternalAllocScope {
 public:
  // a == nullptr (or a->alloc == nullptr): the arena, as without a scope.
  explicit ExternalAllocScope(const ExternalAllocator* a);
  ~ExternalAllocScope();
  ExternalAllocScope(const ExternalAllocScope&) = delete;
  ExternalAllocScope& operator=(const ExternalAllocScope&) = delete;

 private:
  const ExternalAllocator* prev_;
};

// A device buffer from the arena (RAII, move-only), for scratch space that is not a Tensor.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : p_(bytes ? arena_alloc(bytes) : nullptr), n_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { reset(); p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  void ensure(size_t bytes) { if (bytes > n_) { reset(); p_ = arena_alloc(bytes); n_ = bytes; } }
  void reset() { if (p_) arena_free(p_); p_ = nullptr; n_ = 0; }
  void* get() const { return p_; }
  template <class T> T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Pinned host memory (RAII) for asynchronous host<->device copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // Grows to at least `bytes`; waits for the engine stream first when it reallocates, because
  // an earlier asynchronous copy may still read the old buffer.
  void ensure(size_t bytes);
  void* get() const { return p_; }
  template <class T> T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Device properties of the current device, cached.
const cudaDeviceProp& device_prop();

// Launch helper: blocks of `threads` covering n items (at least 1 block, capped to keep grids
// grid-stride friendly).
inline unsigned grid_for(long long n, int threads = 256, long long max_blocks = 65535LL * 8) {
  long long b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

}  // namespace lstm::cuda

#define LSTM_CUDA_CHECK(expr) ::lstm::cuda::check((expr), __FILE__, __LINE__, #expr)
