// The CUDA runtime layer: device tensors, conversions against the CPU's, the caching arena and
// the one status check for CUDA, cuBLAS and cuDNN.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <chrono>

#include "gpu_test_util.hpp"
#include "lstm/device.hpp"
#include "lstm/tensor.hpp"
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#include "cuda/cublas_util.hpp"
#include "cuda/exec.hpp"
#include "cudnn/cudnn_util.hpp"
#endif

using namespace lstm;
using lstm::testing::random_tensor;
using ::testing::HasSubstr;

// The check macro needs no GPU: it formats whatever status it is given.
TEST(GpuCore, CheckMacroNamesFileLineExpressionAndError) {
#if LSTM_HAVE_CUDA
  auto what = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string a = what([] { LSTM_CUDA_CHECK(cudaErrorInvalidValue); });
  EXPECT_THAT(a, HasSubstr("CUDA error at"));
  EXPECT_THAT(a, HasSubstr("test_gpu_core.cpp:"));
  EXPECT_THAT(a, HasSubstr("cudaErrorInvalidValue"));
  EXPECT_THAT(a, HasSubstr("failed"));
  std::string b = what([] { LSTM_CUDA_CHECK(CUBLAS_STATUS_INVALID_VALUE); });
  EXPECT_THAT(b, HasSubstr("cuBLAS error"));
  EXPECT_THAT(b, HasSubstr("CUBLAS_STATUS_INVALID_VALUE"));
  std::string c = what([] { LSTM_CUDA_CHECK(CUDNN_STATUS_NOT_SUPPORTED); });
  EXPECT_THAT(c, HasSubstr("cuDNN error"));
  EXPECT_THAT(c, HasSubstr("CUDNN_STATUS_NOT_SUPPORTED"));
  EXPECT_THAT(c, HasSubstr("CUDNN_STATUS_NOT_SUPPORTED"));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuCore, NoGpuGivesAClearErrorNotACrash) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU message";
  try {
    Tensor::empty({2}, DType::F32, Device::CUDA);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("needs a CUDA GPU"));
  }
}

TEST(GpuCore, DevicesAndVersions) {
  LSTM_REQUIRE_GPU();
  auto devs = cuda_devices();
  ASSERT_FALSE(devs.empty());
  EXPECT_FALSE(devs[0].name.empty());
  EXPECT_GT(devs[0].sms, 0);
  EXPECT_THAT(cuda_versions(), HasSubstr("cuDNN 9."));
}

TEST(GpuCore, RoundTripEveryDtype) {
  LSTM_REQUIRE_GPU();
  Rng rng(7);
  for (DType dt : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::I64, DType::I32, DType::U8}) {
    Tensor h = Tensor::empty({3, 37}, dt);
    for (int64_t i = 0; i < h.numel(); ++i) h.set(i, is_floating(dt) ? rng.normal() * 10 : static_cast<double>(rng.below(200)));
    Tensor d = h.to_device(Device::CUDA);
    EXPECT_EQ(d.device(), Device::CUDA);
    EXPECT_THROW(d.get(0), Error);
    Tensor back = d.cpu();
    EXPECT_EQ(std::memcmp(back.raw(), h.raw(), h.nbytes()), 0) << dtype_name(dt);
    Tensor c = d.clone().cpu();
    EXPECT_EQ(std::memcmp(c.raw(), h.raw(), h.nbytes()), 0) << dtype_name(dt);
  }
}

TEST(GpuCore, ConversionsOnTheDeviceEqualTheCpus) {
  LSTM_REQUIRE_GPU();
  Rng rng(3);
  Tensor src = random_tensor({1000}, rng, 100.0, DType::F64);
  src.set(0, 65519.0);  // f16 rounding edge
  src.set(1, 1e-6);     // f16 subnormal
  src.set(2, -3.0e38);  // bf16 near overflow
  for (DType from : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
    Tensor s = src.to(from);
    Tensor sd = s.to_device(Device::CUDA);
    for (DType to : {DType::F64, DType::F32, DType::BF16, DType::F16, DType::I64}) {
      if (to == DType::I64 && from != DType::F32) continue;
      Tensor want = s.to(to);
      Tensor got = sd.to(to).cpu();
      if (to == DType::I64) {
        // Out-of-range float -> int conversions are undefined on both sides; compare the rest.
        for (int64_t i = 3; i < want.numel(); ++i) EXPECT_EQ(got.get(i), want.get(i)) << i;
        continue;
      }
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << dtype_name(from) << "->" << dtype_name(to);
    }
  }
}

TEST(GpuCore, FillZeroSliceAndCrossDeviceCopies) {
  LSTM_REQUIRE_GPU();
  Tensor d = Tensor::full({4, 5}, 2.5, DType::F32, Device::CUDA);
  Tensor h = d.cpu();
  for (int64_t i = 0; i < h.numel(); ++i) EXPECT_EQ(h.get(i), 2.5);
  Tensor rows = d.slice0(1, 3);
  rows.zero_();
  h = d.cpu();
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(h.get(i), (i >= 5 && i < 15) ? 0.0 : 2.5) << i;
  // CPU F64 -> GPU BF16 and back, converting on the way.
  Tensor src = Tensor::full({7}, 1.0 / 3.0, DType::F64);
  Tensor bf = Tensor::empty({7}, DType::BF16, Device::CUDA);
  bf.copy_(src);
  Tensor back = Tensor::empty({7}, DType::F64);
  back.copy_(bf);
  EXPECT_EQ(back.get(3), static_cast<double>(bf16_to_f32(f32_to_bf16(1.0f / 3.0f))));
  EXPECT_LT(rel_l2_error(d, h), 1e-12);  // rel_l2_error takes GPU tensors too
}

TEST(GpuCore, ArenaReusesBlocksWithoutNewMallocs) {
  LSTM_REQUIRE_GPU();
  {
    Tensor warm1 = Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
    Tensor warm2 = Tensor::empty({1000}, DType::F32, Device::CUDA);
  }
  const ArenaStats before = arena_stats();
  for (int i = 0; i < 50; ++i) {
    Tensor a = Tensor::empty({1 << 20}, DType::F32, Device::CUDA);
    Tensor b = Tensor::empty({1000}, DType::F32, Device::CUDA);
    a.fill_(1.0);
    b.zero_();
  }
  const ArenaStats after = arena_stats();
  EXPECT_EQ(after.device_mallocs, before.device_mallocs);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_GE(after.peak_in_use_bytes, size_t(4) << 20);
  cuda_synchronize();
  arena_release_cached();
  EXPECT_LE(arena_stats().reserved_bytes, before.reserved_bytes);
}

// Inside an ExternalAllocScope the arena's blocks come from the caller's allocator (PyTorch's,
// through the C API) and go back to it when freed, even after the scope closed; outside, from the
// arena as before.
#if LSTM_HAVE_CUDA
namespace {
struct CountingAllocator {
  int allocs = 0, frees = 0;
  std::vector<void*> live;
  static void* alloc(void* ctx, size_t bytes, cudaStream_t) {
    auto* self = static_cast<CountingAllocator*>(ctx);
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    ++self->allocs;
    self->live.push_back(p);
    return p;
  }
  static void free(void* ctx, void* p) {
    auto* self = static_cast<CountingAllocator*>(ctx);
    ++self->frees;
    self->live.erase(std::find(self->live.begin(), self->live.end(), p));
    cudaFree(p);
  }
};
}  // namespace

TEST(GpuCore, ExternalAllocatorServesAScopeAndGetsItsBlocksBack) {
  LSTM_REQUIRE_GPU();
  CountingAllocator counts;
  cuda::ExternalAllocator ext{&CountingAllocator::alloc, &CountingAllocator::free, &counts};
  Tensor kept;
  {
    cuda::ExternalAllocScope scope(&ext);
    Tensor a = Tensor::full({1000}, 2.0, DType::F32, Device::CUDA);
    kept = Tensor::full({10}, 3.0, DType::F32, Device::CUDA);
    EXPECT_EQ(counts.allocs, 2);
    EXPECT_EQ(a.cpu().get(999), 2.0);
  }
  EXPECT_EQ(counts.frees, 1);  // `a`
  Tensor b = Tensor::zeros({10}, DType::F32, Device::CUDA);  // the arena's again
  EXPECT_EQ(counts.allocs, 2);
  EXPECT_EQ(kept.cpu().get(9), 3.0);
  cuda_synchronize();
  kept = Tensor();
  EXPECT_EQ(counts.frees, 2);
  EXPECT_TRUE(counts.live.empty());
  EXPECT_FALSE(cuda::stream_capturing(cuda::stream()));
}
#endif

// Of the free blocks of one size the arena hands out the one freed last, so a loop that frees and
// allocates the same sizes gets the same addresses back every time (CUDA graphs key on them),
// however many blocks of that size an earlier phase left in the cache.
TEST(GpuCore, ArenaHandsBackTheBlockFreedLast) {
  LSTM_REQUIRE_GPU();
  const Shape shape{3 << 20};  // 12 MiB: a 2 MiB size class
  {
    std::vector<Tensor> earlier;
    for (int i = 0; i < 4; ++i) earlier.push_back(Tensor::empty(shape, DType::F32, Device::CUDA));
  }
  const void *first_t = nullptr, *first_u = nullptr;
  for (int i = 0; i < 10; ++i) {
    Tensor t = Tensor::empty(shape, DType::F32, Device::CUDA);
    Tensor u = Tensor::empty(shape, DType::F32, Device::CUDA);  // freed before t (reverse order)
    if (i == 0) {
      first_t = t.raw();
      first_u = u.raw();
    }
    EXPECT_NE(t.raw(), u.raw());
    EXPECT_EQ(t.raw(), first_t) << "iteration " << i;
    EXPECT_EQ(u.raw(), first_u) << "iteration " << i;
  }
}

TEST(GpuCore, DeviceOutOfMemoryIsAClearError) {
  LSTM_REQUIRE_GPU();
  try {
    Tensor huge = Tensor::empty({int64_t(1) << 40}, DType::F32, Device::CUDA);  // 4 TiB
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("cannot allocate"));
  }
  // The device is still usable afterwards.
  Tensor ok = Tensor::full({8}, 1.0, DType::F32, Device::CUDA);
  EXPECT_EQ(ok.cpu().get(7), 1.0);
}

#if LSTM_HAVE_CUDA
// The engine stream is the legacy default stream unless LSTM_CUDA_STREAM=own asks for a stream
// per host thread; a bad value is a clear error. Each case runs in a new thread, because a
// thread picks its stream on first use.
TEST(GpuCore, EngineStreamIsLegacyByDefaultAndOwnOnRequest) {
  LSTM_REQUIRE_GPU();
  const char* before = std::getenv("LSTM_CUDA_STREAM");
  const bool had = before != nullptr;
  const std::string saved = had ? before : "";
  auto in_thread = [](const char* value, cudaStream_t* got, double* sum, std::string* error) {
    if (value)
      setenv("LSTM_CUDA_STREAM", value, 1);
    else
      unsetenv("LSTM_CUDA_STREAM");
    std::thread t([&] {
      try {
        *got = cuda::stream();
        Tensor a = Tensor::full({1000}, 0.5, DType::F32, Device::CUDA);
        Tensor h = a.cpu();
        *sum = 0;
        for (int64_t i = 0; i < h.numel(); ++i) *sum += h.get(i);
      } catch (const Error& e) {
        *error = e.what();
      }
    });
    t.join();
  };
  cudaStream_t s = nullptr;
  double sum = 0;
  std::string err;
  in_thread(nullptr, &s, &sum, &err);
  EXPECT_EQ(err, "");
  EXPECT_EQ(s, cudaStreamLegacy);
  EXPECT_EQ(sum, 500.0);
  in_thread("own", &s, &sum, &err);
  EXPECT_EQ(err, "");
  EXPECT_NE(s, cudaStreamLegacy);
  EXPECT_NE(s, nullptr);
  EXPECT_EQ(sum, 500.0);
  sum = 0;
  in_thread("bogus", &s, &sum, &err);
  EXPECT_THAT(err, HasSubstr("LSTM_CUDA_STREAM: expected 'legacy' (the default) or 'own', got 'bogus'"));
  EXPECT_EQ(sum, 0.0);
  if (had)
    setenv("LSTM_CUDA_STREAM", saved.c_str(), 1);
  else
    unsetenv("LSTM_CUDA_STREAM");
}
#endif

#if LSTM_HAVE_CUDA
namespace {
// A non-blocking stream of the test's own.
struct OwnStream {
  cudaStream_t s = nullptr;
  OwnStream() { LSTM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~OwnStream() { cudaStreamDestroy(s); }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
};
}  // namespace

// A block used on a second stream (arena_record_stream) is not handed out again, after it is
// freed, until that stream's work up to the free has completed. Stream B's work is held back by
// a host function that sleeps (a known wait, whatever the GPU's clock; test sources have no
// kernels of their own), and then writes the whole block: had the arena handed the block to the
// next allocation on A, that write would land on the new owner's data.
TEST(GpuCore, ArenaKeepsABlockUsedOnAnotherStreamUntilThatStreamIsDone) {
  LSTM_REQUIRE_GPU();
  OwnStream a, b;
  cuda::StreamGuard on_a(a.s);
  const size_t n = size_t(4) << 20;
  void* p = cuda::arena_alloc(n);
  LSTM_CUDA_CHECK(cudaMemsetAsync(p, 0, n, a.s));
  LSTM_CUDA_CHECK(cudaStreamSynchronize(a.s));
  LSTM_CUDA_CHECK(cudaLaunchHostFunc(
      b.s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }, nullptr));
  LSTM_CUDA_CHECK(cudaMemsetAsync(p, 0xAB, n, b.s));
  cuda::arena_record_stream(p, b.s);
  cuda::arena_free(p);

  void* q = cuda::arena_alloc(n);
  ASSERT_EQ(cudaStreamQuery(b.s), cudaErrorNotReady) << "stream B finished too early for the test to mean anything";
  EXPECT_NE(q, p) << "the block was handed out while stream B still uses it";
  LSTM_CUDA_CHECK(cudaMemsetAsync(q, 0x11, n, a.s));
  LSTM_CUDA_CHECK(cudaStreamSynchronize(b.s));
  LSTM_CUDA_CHECK(cudaStreamSynchronize(a.s));
  std::vector<unsigned char> host(n);
  LSTM_CUDA_CHECK(cudaMemcpy(host.data(), q, n, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (unsigned char c : host) bad += c != 0x11;
  EXPECT_EQ(bad, 0u) << "stream B's late write reached the new allocation";

  // Once B is done the block is reused: two more blocks of the size need no cudaMalloc.
  cuda::arena_free(q);
  const ArenaStats before = arena_stats();
  void* r1 = cuda::arena_alloc(n);
  void* r2 = cuda::arena_alloc(n);
  EXPECT_EQ(arena_stats().device_mallocs, before.device_mallocs);
  EXPECT_TRUE((r1 == p && r2 == q) || (r1 == q && r2 == p));
  cuda::arena_free(r1);
  cuda::arena_free(r2);

  // Releasing the cache waits for pending blocks instead of freeing memory still in use.
  void* s1 = cuda::arena_alloc(n);
  LSTM_CUDA_CHECK(cudaLaunchHostFunc(
      b.s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr));
  LSTM_CUDA_CHECK(cudaMemsetAsync(s1, 0xCD, n, b.s));
  cuda::arena_record_stream(s1, b.s);
  cuda::arena_free(s1);
  arena_release_cached();
  EXPECT_EQ(cudaStreamQuery(b.s), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Inside an ExecScope the engine stream and the current device are the context's; after it,
// what they were before.
TEST(GpuCore, ExecScopeSetsAndRestoresStreamAndDevice) {
  LSTM_REQUIRE_GPU();
  OwnStream own;
  int devices = 0;
  LSTM_CUDA_CHECK(cudaGetDeviceCount(&devices));
  int dev_before = 0;
  LSTM_CUDA_CHECK(cudaGetDevice(&dev_before));
  const cudaStream_t stream_before = cuda::stream();
  {
    ExecContext ctx;
    ctx.device = Device::CUDA;
    ctx.device_index = dev_before;
    ctx.stream = own.s;
    cuda::ExecScope scope(ctx);
    EXPECT_EQ(cuda::stream(), own.s);
    EXPECT_EQ(scope.stream(), own.s);
    int dev = -1;
    LSTM_CUDA_CHECK(cudaGetDevice(&dev));
    EXPECT_EQ(dev, dev_before);
  }
  EXPECT_EQ(cuda::stream(), stream_before);
  if (devices >= 2) {
    // The legacy default stream of another device.
    ExecContext ctx;
    ctx.device = Device::CUDA;
    ctx.device_index = (dev_before + 1) % devices;
    ctx.stream = static_cast<void*>(cudaStreamLegacy);
    {
      cuda::ExecScope scope(ctx);
      int dev = -1;
      LSTM_CUDA_CHECK(cudaGetDevice(&dev));
      EXPECT_EQ(dev, ctx.device_index);
      EXPECT_EQ(cuda::stream(), cudaStreamLegacy);
    }
    int dev = -1;
    LSTM_CUDA_CHECK(cudaGetDevice(&dev));
    EXPECT_EQ(dev, dev_before);
    EXPECT_EQ(cuda::stream(), stream_before);
  }
  EXPECT_THROW(cuda::ExecScope(ExecContext::cpu()), Error);
  EXPECT_EQ(cuda::stream(), stream_before);
}
#endif
