// The persistent kernels' planner (a pure function of the device's properties; runs without a
// GPU): the limits docs/KERNELS.md states for the H200, the slice it picks, and its refusals.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lstm/tensor.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/lstm_persistent.cuh"
#endif

using namespace lstm;

#if LSTM_HAVE_CUDA
using lstm::cuda::PersistentDevice;
using lstm::cuda::PersistentShape;
using lstm::cuda::plan_persistent;
using lstm::cuda::plan_persistent_cluster;
using lstm::cuda::plan_persistent_cluster_backward;

namespace {

// The lent H200: 132 SMs, 227 KiB of shared memory per block (opt-in), cooperative launch,
// thread-block clusters.
PersistentDevice h200() { return PersistentDevice{132, 232448, true, true}; }

bool fits(int64_t H, int64_t groups, int64_t B, DType dt, int64_t in_size = 0) {
  PersistentShape s;
  return plan_persistent(h200(), H, H, in_size, groups, B, dt, &s).empty();
}

// The largest multiple of 8 the planner accepts (in_size: the wavefront's layer input, = H).
int64_t largest(int64_t groups, int64_t B, DType dt, bool wavefront = false) {
  int64_t best = 0;
  for (int64_t H = 8; H <= 4096; H += 8)
    if (fits(H, groups, B, dt, wavefront ? H : 0)) best = H;
  return best;
}

}  // namespace

TEST(PersistentPlan, LimitsOnTheH200AreTheDocumentedOnes) {
  // docs/KERNELS.md, "Limits": one direction, a bidirectional layer, the wavefront.
  EXPECT_EQ(largest(1, 8, DType::BF16), 1472);
  EXPECT_EQ(largest(1, 16, DType::BF16), 1216);
  EXPECT_EQ(largest(1, 32, DType::F16), 1056);
  EXPECT_EQ(largest(2, 8, DType::BF16), 1056);
  EXPECT_EQ(largest(2, 32, DType::BF16), 832);
  EXPECT_EQ(largest(1, 8, DType::F32), 1056);
  EXPECT_EQ(largest(1, 32, DType::F32), 760);
  EXPECT_EQ(largest(2, 8, DType::F32), 736);
  EXPECT_EQ(largest(2, 32, DType::F32), 528);
  EXPECT_EQ(largest(2, 8, DType::BF16, true), 736);
  EXPECT_EQ(largest(4, 8, DType::BF16, true), 528);
  EXPECT_EQ(largest(3, 8, DType::F32, true), 368);
}

TEST(PersistentPlan, TakesTheSmallestSliceThatFitsTheSms) {
  PersistentShape s;
  ASSERT_EQ(plan_persistent(h200(), 512, 512, 0, 1, 8, DType::BF16, &s), "");
  EXPECT_EQ(s.units, 4);
  EXPECT_EQ(s.ctas, 128);
  EXPECT_EQ(s.n_tiles, 1);
  ASSERT_EQ(plan_persistent(h200(), 1024, 1024, 0, 1, 1, DType::BF16, &s), "");
  EXPECT_EQ(s.units, 8);  // 4 units would need 256 CTAs
  EXPECT_EQ(s.ctas, 128);
  // The 4-layer H512 wavefront: 16 units, 32 CTAs per layer.
  ASSERT_EQ(plan_persistent(h200(), 512, 512, 512, 4, 8, DType::BF16, &s), "");
  EXPECT_EQ(s.units, 16);
  EXPECT_EQ(s.ctas, 32);
  // Batch 17-32: four mma tiles of 8 rows.
  ASSERT_EQ(plan_persistent(h200(), 256, 256, 0, 1, 32, DType::F32, &s), "");
  EXPECT_EQ(s.n_tiles, 4);
  // A pinned slice is taken as given, or refused.
  ASSERT_EQ(plan_persistent(h200(), 256, 256, 0, 1, 8, DType::BF16, &s, 16), "");
  EXPECT_EQ(s.units, 16);
  EXPECT_NE(plan_persistent(h200(), 256, 256, 0, 1, 16, DType::BF16, &s, 32), "");  // 32 units: batch <= 8
}

TEST(PersistentPlan, RefusalsNameTheLimit) {
  PersistentShape s;
  const std::string big = plan_persistent(h200(), 2048, 2048, 0, 1, 1, DType::BF16, &s);
  EXPECT_NE(big.find("need 306 KiB of shared memory per SM"), std::string::npos) << big;
  EXPECT_NE(big.find("227 KiB per block and 132 SMs"), std::string::npos) << big;
  const std::string batch = plan_persistent(h200(), 256, 256, 0, 1, 33, DType::BF16, &s);
  EXPECT_NE(batch.find("up to 32 rows; got 33"), std::string::npos) << batch;
  const std::string f64 = plan_persistent(h200(), 256, 256, 0, 1, 1, DType::F64, &s);
  EXPECT_NE(f64.find("not F64"), std::string::npos) << f64;
  const std::string wide = plan_persistent(h200(), 8192, 8192, 0, 1, 1, DType::BF16, &s);
  EXPECT_NE(wide.find("too large for one CTA per SM"), std::string::npos) << wide;
  PersistentDevice no_coop = h200();
  no_coop.cooperative = false;
  EXPECT_NE(plan_persistent(no_coop, 256, 256, 0, 1, 1, DType::BF16, &s).find("cooperative launch"),
            std::string::npos);
  // A smaller GPU gets smaller limits from its own properties.
  PersistentDevice small{46, 101376, true};
  EXPECT_TRUE(plan_persistent(small, 256, 256, 0, 1, 8, DType::BF16, &s).empty());
  EXPECT_EQ(s.units, 8);
  EXPECT_FALSE(plan_persistent(small, 1024, 1024, 0, 1, 8, DType::BF16, &s).empty());
}
TEST(PersistentPlan, ClusterKernelsTakeOneLayerUpToHidden512) {
  PersistentShape s;
  // Hidden 512: 16 CTAs of 32 units (W_hh in registers: 16 k-tiles per warp).
  ASSERT_EQ(plan_persistent_cluster(h200(), 512, 512, 0, 1, 8, DType::BF16, &s), "");
  EXPECT_TRUE(s.cluster);
  EXPECT_EQ(s.ctas, 16);
  EXPECT_EQ(s.units, 32);
  EXPECT_LE(s.smem, size_t{232448});
  // Smaller sizes take the smallest slice that keeps the cluster within 16 CTAs.
  ASSERT_EQ(plan_persistent_cluster(h200(), 256, 256, 0, 2, 1, DType::F16, &s), "");
  EXPECT_TRUE(s.cluster);
  EXPECT_EQ(s.ctas, 16);
  EXPECT_EQ(s.units, 16);
  ASSERT_EQ(plan_persistent_cluster(h200(), 20, 20, 0, 1, 3, DType::BF16, &s), "");
  EXPECT_TRUE(s.cluster);
  EXPECT_EQ(s.ctas, 5);
  EXPECT_EQ(s.units, 4);
  // Refusals (the grid kernels run these).
  EXPECT_NE(plan_persistent_cluster(h200(), 520, 520, 0, 1, 1, DType::BF16, &s).find("does not fit one cluster"),
            std::string::npos);
  EXPECT_NE(plan_persistent_cluster(h200(), 256, 256, 0, 1, 1, DType::F32, &s).find("BF16 or F16"), std::string::npos);
  // Batches of more than 8 rows: clusters of equal batch groups of at most 8 rows each (the same
  // slice and shared memory per cluster); knowing that the device holds 7 such clusters at once
  // (resident), fewer groups of up to 16 rows where 8-row groups would need more clusters: 64 rows
  // as 7 groups of 10 rather than 8 of 8 in two waves, two directions as 4 groups of 16 each, 40
  // rows still as 5 groups of 8.
  struct Split {
    int64_t H, groups, B;
    int resident, batch_groups, rows, tile_rows;
  };
  for (const Split& c : std::vector<Split>{{256, 1, 8, 0, 1, 8, 8},
                                           {256, 1, 9, 0, 2, 5, 8},
                                           {64, 1, 3, 0, 1, 3, 8},
                                           {512, 2, 64, 0, 8, 8, 8},
                                           {512, 1, 100, 0, 13, 8, 8},
                                           {512, 1, 64, 7, 7, 10, 16},
                                           {256, 2, 64, 7, 4, 16, 16},
                                           {512, 1, 40, 7, 5, 8, 8},
                                           {512, 1, 128, 7, 8, 16, 16}}) {
    ASSERT_EQ(plan_persistent_cluster(h200(), c.H, c.H, 0, c.groups, c.B, DType::BF16, &s, c.resident), "") << c.B;
    EXPECT_EQ(s.batch_groups, c.batch_groups) << c.H << " " << c.B;
    EXPECT_EQ(s.rows, c.rows) << c.H << " " << c.B;
    EXPECT_EQ(s.tile_rows(), c.tile_rows) << c.H << " " << c.B;
    PersistentShape one;
    ASSERT_EQ(plan_persistent_cluster(h200(), c.H, c.H, 0, 1, 1, DType::BF16, &one), "");
    EXPECT_EQ(s.units, one.units);
    // 16-row tiles at hidden 512: h, the partial sums (4 shares of K) and the staging buffer for 8
    // more rows.
    const size_t more = 8 * (2 * (512 + 8) * 2 + 4 * (128 + 4) * 4 + 32 * 2);
    if (c.H == 512) {
      EXPECT_EQ(s.smem, one.smem + (c.tile_rows == 16 ? more : 0)) << c.B;
    }
    if (c.tile_rows == 8) {
      EXPECT_EQ(s.smem, one.smem) << c.H << " " << c.B;
    }
    EXPECT_LE(s.smem, size_t{232448});
  }
  // ... but a wavefront's clusters hand h to each other whole: at most 8 rows.
  EXPECT_NE(plan_persistent_cluster(h200(), 256, 256, 256, 3, 9, DType::BF16, &s).find("wavefront runs batches of up to 8"),
            std::string::npos);
  // The wavefront of 4 layers: 7 clusters (the layers, and the input projections of layers 1 to 3),
  // each with the projection's input buffers.
  ASSERT_EQ(plan_persistent_cluster(h200(), 512, 512, 512, 7, 8, DType::BF16, &s), "");
  EXPECT_TRUE(s.cluster);
  EXPECT_EQ(s.ctas, 16);
  EXPECT_EQ(s.units, 32);
  PersistentShape one;
  ASSERT_EQ(plan_persistent_cluster(h200(), 512, 512, 0, 1, 8, DType::BF16, &one), "");
  // The projection's input Xs (8 rows of 520 values) and the layer's next x-projection words (8
  // rows x 32 units x 4 gates).
  EXPECT_EQ(s.smem, one.smem + 8 * (512 + 8) * 2 + 8 * 32 * 4 * 8);
  EXPECT_LE(s.smem, size_t{232448});
  EXPECT_NE(plan_persistent_cluster(h200(), 256, 256, 128, 2, 1, DType::BF16, &s).find("the layer below's h"),
            std::string::npos);
  // Five layers would take 9 clusters, more than one launch runs.
  EXPECT_NE(plan_persistent_cluster(h200(), 256, 256, 256, 9, 1, DType::BF16, &s).find("at most 8 clusters"),
            std::string::npos);
  PersistentDevice old = h200();
  old.cluster = false;
  EXPECT_NE(plan_persistent_cluster(old, 256, 256, 0, 1, 1, DType::BF16, &s).find("no thread-block clusters"),
            std::string::npos);
}

TEST(PersistentPlan, ClusterBackwardTakesWhatTheForwardTakes) {
  PersistentShape f, b;
  // Every hidden size the forward's cluster kernel takes, at batch 1 and 8, in both dtypes.
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t B : {1, 8})
      for (int64_t H = 4; H <= 512; H += 4) {
        ASSERT_EQ(plan_persistent_cluster(h200(), H, H, 0, 1, B, dt, &f), "") << H;
        ASSERT_EQ(plan_persistent_cluster_backward(h200(), H, B, dt, &b), "") << H;
        EXPECT_EQ(b.units, f.units) << H;
        EXPECT_TRUE(b.cluster) << H;
        EXPECT_EQ(b.ctas, f.ctas) << H;
        EXPECT_LE(b.smem, size_t{232448}) << H;
      }
  // Hidden 512: W_hh^T's 32 columns x 2048 rows per CTA, 16 k-tiles per warp; the shared memory
  // holds them once (before the registers) beside two dG buffers of 8 x 2056.
  ASSERT_EQ(plan_persistent_cluster_backward(h200(), 512, 8, DType::BF16, &b), "");
  EXPECT_TRUE(b.cluster);
  EXPECT_EQ(b.ctas, 16);
  EXPECT_EQ(b.units, 32);
  EXPECT_EQ(b.smem, size_t{(32 + 16) * 2056 * 2 + 8 * 8 * 36 * 4 + 16 + 8 * 4 * 32 * 2});
  // What the forward refuses, the backward refuses with the forward's reason.
  EXPECT_NE(plan_persistent_cluster_backward(h200(), 520, 1, DType::BF16, &b).find("does not fit one cluster"),
            std::string::npos);
  EXPECT_NE(plan_persistent_cluster_backward(h200(), 256, 1, DType::F32, &b).find("BF16 or F16"), std::string::npos);
  // Larger batches: the forward's batch groups, one cluster each.
  ASSERT_EQ(plan_persistent_cluster_backward(h200(), 256, 20, DType::BF16, &b), "");
  EXPECT_EQ(b.batch_groups, 3);
  EXPECT_EQ(b.rows, 7);
  // A device with less shared memory per block: the backward's larger buffers are refused by name.
  PersistentDevice small = h200();
  small.smem_per_block = 200 * 1024;
  ASSERT_EQ(plan_persistent_cluster(small, 512, 512, 0, 1, 8, DType::BF16, &f), "");
  EXPECT_NE(plan_persistent_cluster_backward(small, 512, 8, DType::BF16, &b).find("shared memory"), std::string::npos);
}

#else
TEST(PersistentPlan, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }
#endif

