#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "lstm/rng.hpp"
#include "lstm/tensor.hpp"

using namespace lstm;

TEST(Tensor, ShapeReshapeSlice) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.size(-1), 4);
  for (int64_t i = 0; i < 24; ++i) t.set(i, static_cast<double>(i));
  Tensor r = t.reshape({6, -1});
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  EXPECT_TRUE(r.same_storage(t));
  Tensor s = t.slice0(1, 2);
  EXPECT_EQ(s.numel(), 12);
  EXPECT_EQ(s.get(0), 12.0);
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(t.data<double>(), Error);
}

// Tensor::wrap works on the caller's memory in place and never frees it.
TEST(Tensor, WrapIsNonOwningAndInPlace) {
  std::vector<float> mine(6, 0.0f);
  {
    Tensor w = Tensor::wrap(mine.data(), {2, 3}, DType::F32, Device::CPU);
    EXPECT_EQ(w.raw(), mine.data());
    EXPECT_EQ(w.shape(), (Shape{2, 3}));
    w.set(4, 2.5);
    Tensor copy = w;             // shares the storage
    Tensor row = w.slice0(1, 2);  // a view
    row.fill_(7.0);
    Tensor src = Tensor::full({2, 3}, 1.0, DType::F64);
    Tensor other = Tensor::wrap(mine.data(), {6}, DType::F32, Device::CPU);
    EXPECT_EQ(copy.get(4), 7.0);
    EXPECT_EQ(mine[0], 0.0f);
    other.slice0(0, 1).copy_(src.reshape({6}).slice0(0, 1));
  }  // every handle gone: nothing freed (the vector still owns its memory)
  EXPECT_EQ(mine[0], 1.0f);
  EXPECT_EQ(mine[3], 7.0f);
  EXPECT_EQ(mine[5], 7.0f);
  EXPECT_NO_THROW(Tensor::wrap(nullptr, {0}, DType::F32, Device::CPU));
  EXPECT_THROW(Tensor::wrap(nullptr, {2}, DType::F32, Device::CPU), Error);
}

// Large host blocks are reused for the same size once their tensor is gone (a call allocating the
// same buffers again gets them without fresh pages from the kernel); small ones and live ones are
// not shared, and the contents of a fresh tensor are whatever Tensor::empty promises (nothing).
TEST(Tensor, LargeHostBlocksAreReusedForTheSameSize) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the block cache is off under AddressSanitizer (which then sees every use after free)";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "the block cache is off under AddressSanitizer (which then sees every use after free)";
#endif
#endif
  const Shape big{3, 1 << 18};  // 3 MiB of F32
  const void* first = nullptr;
  {
    Tensor a = Tensor::full(big, 1.5, DType::F32);
    first = a.raw();
    Tensor live = Tensor::empty(big, DType::F32);  // a is alive: another block
    EXPECT_NE(live.raw(), first);
  }
  // Both blocks are kept now: the next two of that size are those two.
  Tensor b = Tensor::empty(big, DType::F32);
  Tensor c = Tensor::empty(big, DType::F32);
  EXPECT_NE(b.raw(), c.raw());
  EXPECT_TRUE(b.raw() == first || c.raw() == first) << "a freed block of the same size was not reused";
  // Zeros are zeros whatever the block held before.
  b.fill_(3.0);
  b = Tensor();
  Tensor z = Tensor::zeros(big, DType::F32);
  for (int64_t i = 0; i < z.numel(); i += 4097) ASSERT_EQ(z.get(i), 0.0);
  // A kept block is not handed out for another size (nor freed while kept).
  const void* kept = c.raw();
  c = Tensor();
  Tensor other = Tensor::empty({3, (1 << 18) + 16}, DType::F32);
  EXPECT_NE(other.raw(), kept);
}

TEST(Tensor, HalfConversionsRoundTrip) {
  Rng rng(1);
  for (int i = 0; i < 10000; ++i) {
    float f = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform() * 8 - 4));
    float b = bf16_to_f32(f32_to_bf16(f));
    EXPECT_LE(std::abs(b - f), std::abs(f) * (1.0f / 256)) << f;
    if (std::abs(f) < 60000 && std::abs(f) > 1e-4) {
      float h = f16_to_f32(f32_to_f16(f));
      EXPECT_LE(std::abs(h - f), std::abs(f) * (1.0f / 2048)) << f;
    }
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f)), 1.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  // smallest f16 subnormal
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.9604645e-8f)), 5.9604645e-8f);
}

TEST(Rng, DeterministicAndResumable) {
  Rng a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  auto st = a.state();
  double x = a.normal();
  Rng c(7);
  c.set_state(st);
  EXPECT_EQ(c.normal(), x);
  double mean = 0;
  for (int i = 0; i < 20000; ++i) mean += a.uniform();
  EXPECT_NEAR(mean / 20000, 0.5, 0.02);
}
