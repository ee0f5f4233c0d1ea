// The persistent backend's kernel variants on the GPU, each shape against the float64 reference:
// the conformance suite's small shapes (hidden 64) reach only the smallest slice of each kernel,
// so this runs every slice width the planner hands out (4, 8, 16 and 32 units per CTA), a last
// CTA with fewer units than the others, both directions at once, stacks (one cluster per layer in
// one launch), batches split over several clusters (of at most 8 rows each, an uneven last one,
// more clusters than the device holds at once), variable lengths, h0/c0 and 100+ steps, and
// checks which kernel ran: the cluster
// kernels wherever the planner of this device offers them, the grid-wide kernels elsewhere, and in
// training which backward swept (the cluster backward wherever it is offered). Without a GPU every
// test skips and says why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "lstm_conformance_util.hpp"
#if LSTM_HAVE_CUDA
#include "cuda/lstm_persistent.cuh"
#endif

using namespace lstm;
using namespace lstm::testing;

namespace {

struct Shape {
  const char* name;
  int64_t H, T, B;
  bool bi;
  std::vector<int64_t> lengths;  // empty: all T
  bool state;                    // h0 and c0 given
  int64_t layers = 1;
};

// Slices of 4 (hidden 40: 10 CTAs), 8 (hidden 100: 13 CTAs, the last with 4 units), 16 and 32
// units (hidden 256 and 512: 16 CTAs, a non-portable cluster size), two directions of 16 CTAs each,
// unidirectional stacks (the cluster wavefront, slices of 4, 16 and 32 units), a bidirectional
// stack (layer by layer), batches of more than 8 rows (clusters of batch groups: 2 of 8, 3 of 7
// with the last 6, 64 rows in 16-row tiles where 8-row groups would take more clusters than the
// device holds at once, in one direction and in two), a stack at batch 16
// (the grid wavefront: the cluster wavefront runs 8 rows), and a shape the cluster kernels do not
// take (hidden 1024).
const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {"h40_b3", 40, 30, 3, false, {}, false},
      {"h100_b5_bi_varlen", 100, 24, 5, true, {24, 1, 13, 24, 7}, true},
      {"h256_b8_t120", 256, 120, 8, false, {}, true},
      {"h512_b8_t120_varlen", 512, 120, 8, false, {120, 64, 1, 119, 120, 2, 90, 33}, false},
      {"h512_b2_bi_t100", 512, 100, 2, true, {}, true},
      {"h1024_b1", 1024, 40, 1, false, {}, false},
      {"h128_b16", 128, 20, 16, false, {}, true},
      {"h512_b20_varlen_t100", 512, 100, 20, false,
       {100, 1, 64, 99, 100, 2, 90, 33, 100, 7, 100, 100, 50, 1, 100, 100, 3, 100, 76, 100}, true},
      {"h256_b64_bi", 256, 30, 64, true, {}, false},
      {"h512_b64_t50_varlen", 512, 50, 64, false, {50, 50, 50, 1,  50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50,
                                                    50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50,
                                                    50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 2,  50, 50, 50, 50,
                                                    50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 37},
       true},
      {"h128_l2_b16", 128, 20, 16, false, {20, 20, 3, 20, 20, 20, 20, 1, 20, 20, 20, 20, 20, 20, 9, 20}, true, 2},
      {"h64_l3_b4", 64, 30, 4, false, {30, 9, 1, 22}, true, 3},
      {"h512_l2_b8_t100", 512, 100, 8, false, {}, false, 2},
      {"h256_l4_b2_varlen", 256, 40, 2, false, {40, 17}, true, 4},
      {"h100_l2_b5_bi", 100, 20, 5, true, {20, 3, 11, 20, 1}, true, 2},
  };
  return s;
}

struct Param {
  Shape shape;
  Prec prec;
  bool training;
};

std::string param_name(const ::testing::TestParamInfo<Param>& i) {
  return std::string(i.param.shape.name) + "_" + i.param.prec.name + (i.param.training ? "_training" : "_inference");
}

std::vector<Param> params() {
  std::vector<Param> r;
  for (const Shape& s : shapes())
    for (const Prec& p : all_precisions())
      if (p.dtype == DType::BF16 || p.dtype == DType::F16)
        for (bool training : {false, true}) r.push_back({s, p, training});
  return r;
}

class PersistentKernels : public ::testing::TestWithParam<Param> {};

TEST_P(PersistentKernels, MatchReferenceAndRunThePlannedKernel) {
  LSTM_REQUIRE_GPU();
#if LSTM_HAVE_CUDA
  const Param& q = GetParam();
  const Shape& sh = q.shape;
  const LstmSpec spec = make_spec(24, sh.H, sh.layers, sh.bi);
  const Case c{sh.name, spec, sh.T, sh.B, sh.lengths, sh.state, sh.state};
  const Target t{"persistent", Device::CUDA, q.prec, q.training};
  const std::string why = case_skip_reason(t, c);
  ASSERT_EQ(why, "") << "the persistent backend refuses a shape this test is for";

  // What the planner of this device offers: the cluster kernel for a layer it fits, and for a
  // unidirectional stack one cluster per layer and one per layer above the first for its input
  // projection, in one launch (the wavefront).
  cuda::PersistentShape cl;
  const bool wave = sh.layers > 1 && !sh.bi;
  const bool cluster = cuda::plan_persistent_cluster(sh.H, sh.H, wave ? sh.H : 0, wave ? 2 * sh.layers - 1 : spec.directions(),
                                                     sh.B, q.prec.dtype, 0, &cl)
                           .empty();
  cuda::PersistentDevice dev;
  ASSERT_EQ(cuda::persistent_device(0, &dev), "");
  // On a device like the H200 (clusters, 32 or more SMs, 227 KiB of shared memory), the shapes
  // below hidden 1024 are the cluster kernel's, a wavefront's at batch <= 8 (unless
  // $LSTM_PERSISTENT_CLUSTER=0 turned it off for a measurement).
  const char* off = std::getenv("LSTM_PERSISTENT_CLUSTER");
  if (dev.cluster && dev.sms >= 32 && dev.smem_per_block >= 227 * 1024 && !(off && std::string(off) == "0")) {
    EXPECT_EQ(cluster, sh.H < 1024 && (sh.B <= 8 || !wave));
    if (cluster) {
      // Batch groups: every row in one, none empty, 8-row tiles unless those would take more
      // clusters than the device holds at once.
      EXPECT_GE(int64_t{cl.rows} * cl.batch_groups, sh.B);
      EXPECT_LT(int64_t{cl.rows} * (cl.batch_groups - 1), sh.B);
      EXPECT_LE(cl.rows, 16);
      if (cl.rows > 8) {
        EXPECT_GT(spec.directions() * ((sh.B + 7) / 8), cl.resident);
      }
    }
  }

  const Problem p = make_problem(c, q.prec.dtype, 0x5eed0000ull + static_cast<uint64_t>(sh.H * 131 + sh.B));
  auto be = make_target_backend(t, spec, t.options());
  // Which kernel the forward ran (a training forward saves for the backward, which then names
  // itself in last_run()).
  run_backend(*be, p, {q.training, false, 3, false}, t.context());
  const std::string ran = be->last_run();
  if (cluster) {
    EXPECT_EQ(ran.rfind(wave ? "persistent:cluster, wavefront" : "persistent:cluster", 0), 0u) << ran;
  } else if (wave && sh.B > 8) {
    // A stack the cluster wavefront does not take: the grid wavefront or, where it does not fit,
    // the clusters layer by layer (whose batch groups need no wavefront).
    EXPECT_TRUE(ran.rfind("persistent:wavefront", 0) == 0 || ran.rfind("persistent:cluster", 0) == 0) << ran;
  } else {
    EXPECT_EQ(ran.find("cluster"), std::string::npos) << ran;
    EXPECT_EQ(ran.rfind("persistent", 0), 0u) << ran;
  }
  const Result got = run_backend(*be, p, {q.training, false, 3, true}, t.context());
  compare(got, run_reference(p, q.training), p, q.training, q.prec.tol);
  if (q.training) {
    // The backward's sweep: the cluster backward wherever the planner offers it and a direction is
    // swept whole (a single layer, or a bidirectional stack; a unidirectional stack's backward is
    // the fused wavefront).
    cuda::PersistentShape bs;
    const bool whole = sh.layers == 1 || sh.bi;
    const bool cluster_bwd = whole && cuda::plan_persistent_cluster_backward(sh.H, sh.B, q.prec.dtype, 0, &bs).empty();
    EXPECT_EQ(be->last_run().rfind(cluster_bwd ? "persistent, cluster backward" : "persistent, fused backward", 0), 0u)
        << be->last_run();
    if (!(off && std::string(off) == "0") && dev.cluster && dev.sms >= 32 && dev.smem_per_block >= 227 * 1024) {
      EXPECT_EQ(cluster_bwd, cluster && whole);
    }
  }
  std::cout << "[ info     ] " << sh.name << ": " << ran
            << (cluster ? ", " + std::to_string(cl.batch_groups) + " cluster(s) of " + std::to_string(cl.ctas) + " CTAs, " +
                              std::to_string(cl.rows) + " rows each (tiles of " + std::to_string(cl.tile_rows()) +
                              "), " + std::to_string(cl.resident) + " resident"
                        : "")
            << "\n";
#endif
}

INSTANTIATE_TEST_SUITE_P(Shapes, PersistentKernels, ::testing::ValuesIn(params()), param_name);

}  // namespace
