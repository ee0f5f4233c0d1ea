// cudnn_algo "heuristic": which cuDNN algorithm a call gets (a pure function; runs without a GPU).
#include <gtest/gtest.h>

#include "lstm/lstm.hpp"
#if LSTM_HAVE_CUDA
#include "cudnn/lstm_cudnn.hpp"
#endif

using namespace lstm;

#if LSTM_HAVE_CUDA
namespace {
LstmSpec spec(int64_t H, int64_t layers = 1, bool bidir = false, int64_t I = -1) {
  LstmSpec s;
  s.input_size = I < 0 ? H : I;
  s.hidden_size = H;
  s.num_layers = layers;
  s.bidirectional = bidir;
  return s;
}
// An H200: sm_90, 132 SMs.
std::string h200(const LstmSpec& s, DType dt, int64_t T, int64_t B, bool varlen = false, bool training = false) {
  return cudnn_heuristic_algo(s, dt, T, B, varlen, training, 9, 0, 132);
}
}  // namespace

TEST(CudnnHeuristic, SmallHiddenSizesTakeSmallH) {
  EXPECT_EQ(h200(spec(192), DType::F32, 100, 8), "persist_static_small_h");
  EXPECT_EQ(h200(spec(192), DType::F32, 100, 8, false, /*training=*/true), "standard");
  EXPECT_EQ(h200(spec(128), DType::BF16, 100, 8, false, true), "persist_static_small_h");
  EXPECT_EQ(h200(spec(64, 3, true), DType::F32, 100, 8), "persist_static_small_h");
  EXPECT_EQ(h200(spec(256), DType::F32, 100, 8), "standard");
}

TEST(CudnnHeuristic, Fp16SingleLayerTakesPersistStaticOnLargeGpus) {
  EXPECT_EQ(h200(spec(512), DType::F16, 25, 16), "persist_static");
  EXPECT_EQ(h200(spec(1024), DType::F16, 100, 128), "persist_static");
  EXPECT_EQ(h200(spec(1024), DType::F16, 100, 256), "standard");   // batch above 128
  EXPECT_EQ(h200(spec(1024), DType::F16, 100, 20), "standard");    // batch not a multiple of 8
  EXPECT_EQ(h200(spec(2048), DType::F16, 100, 64), "standard");    // hidden above 1024
  EXPECT_EQ(h200(spec(1024, 2), DType::F16, 100, 64), "standard"); // two layers
  EXPECT_EQ(h200(spec(512, 1, true), DType::F16, 100, 64), "standard");
  EXPECT_EQ(h200(spec(512, 1, false, 300), DType::F16, 100, 64), "standard");  // input not a multiple of 128
  EXPECT_EQ(h200(spec(512), DType::F32, 25, 16), "standard");
  EXPECT_EQ(h200(spec(512), DType::BF16, 25, 16), "standard");
  // sm_86 and small Ampere parts keep the standard algorithm.
  EXPECT_EQ(cudnn_heuristic_algo(spec(512), DType::F16, 25, 16, false, false, 8, 6, 84), "standard");
  EXPECT_EQ(cudnn_heuristic_algo(spec(512), DType::F16, 25, 16, false, false, 8, 0, 56), "standard");
  // Volta: multiples of 16 with enough steps.
  EXPECT_EQ(cudnn_heuristic_algo(spec(512), DType::F16, 40, 64, false, false, 7, 0, 80), "persist_static");
  EXPECT_EQ(cudnn_heuristic_algo(spec(512), DType::F16, 40, 80, false, false, 7, 0, 80), "standard");
  EXPECT_EQ(cudnn_heuristic_algo(spec(512), DType::F16, 40, 64, false, false, 7, 5, 40), "standard");
}

TEST(CudnnHeuristic, NeverPersistentWhereCudnnRefuses) {
  EXPECT_EQ(h200(spec(128), DType::F32, 100, 8, /*varlen=*/true), "standard");
  LstmSpec p = spec(128);
  p.proj_size = 64;
  EXPECT_EQ(h200(p, DType::F32, 100, 8), "standard");
  LstmSpec nb = spec(512);
  nb.bias = false;
  EXPECT_EQ(h200(nb, DType::F16, 25, 16), "standard");
  EXPECT_EQ(h200(spec(128), DType::F64, 100, 8), "standard");
}

TEST(CudnnHeuristic, IsAnAcceptedAlgorithmName) {
  EXPECT_EQ(cudnn_algo_from_name("heuristic"), CudnnAlgo::Heuristic);
  EXPECT_EQ(LstmOptions{}.cudnn_algo, CudnnAlgo::Heuristic);
  try {
    cudnn_algo_from_name("fastest", "--cudnn-algo");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("heuristic"), std::string::npos) << w;
    EXPECT_NE(w.find("--cudnn-algo"), std::string::npos) << w;
    EXPECT_NE(w.find("'fastest'"), std::string::npos) << w;
  }
}
#else
TEST(CudnnHeuristic, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }
#endif

#if LSTM_HAVE_CUDA
// cuda_graphs "auto"'s first look (a pure function; runs without a GPU). Numbers from the H200
// (docs/PERFORMANCE.md, 2026-12-01 third session).
TEST(CudaGraphsFirstLook, HostBoundCallsTryGraphs) {
  const GraphFirstLook l = cuda_graphs_first_look(11511.5, 11513.6, 16384, 3851);  // L1-H512-B8-T1000 fp16
  EXPECT_TRUE(l.host_bound);
  EXPECT_TRUE(l.try_graphs());
  EXPECT_FALSE(cuda_graphs_first_look(499, 1000, 1u << 30, 3851).host_bound);
  EXPECT_TRUE(cuda_graphs_first_look(500, 1000, 1u << 30, 3851).host_bound);
}

TEST(CudaGraphsFirstLook, CopiesAreCountedAtTheGivenBandwidth) {
  // L1-H1024-B256-T100 tf32 inference: x is 104857600 bytes; host 1509 us, GPU 3021 us. At 80%
  // of the H200's 4814 GB/s the copy takes ~54 us (1.8% of the call): a trial. At the old rule's
  // 1000 GB/s (the fallback when the bandwidth is unknown) it was 210 us: eager.
  const GraphFirstLook l = cuda_graphs_first_look(1509.08, 3021.41, 104857600, 0.8 * 4814.3);
  EXPECT_NEAR(l.copy_us, 54.45, 0.1);
  EXPECT_FALSE(l.host_bound);
  EXPECT_TRUE(l.cheap_copy);
  EXPECT_TRUE(l.try_graphs());
  const GraphFirstLook old = cuda_graphs_first_look(1509.08, 3021.41, 104857600, 0);
  EXPECT_NEAR(old.copy_us, 209.7, 0.1);
  EXPECT_FALSE(old.cheap_copy);  // 6.9% of the call
  EXPECT_FALSE(old.try_graphs());
}

TEST(CudaGraphsFirstLook, CopiesUpToFivePercentOfTheCallAreCheap) {
  // 1e8 bytes at 2000 GB/s: 100 us, against calls of 2000 us (5%) and 1999 us (just above).
  EXPECT_TRUE(cuda_graphs_first_look(10, 2000, 100000000, 2000).try_graphs());
  EXPECT_FALSE(cuda_graphs_first_look(10, 1999, 100000000, 2000).try_graphs());
  // Nothing to copy: every call is worth a trial.
  EXPECT_TRUE(cuda_graphs_first_look(1, 5000, 0, 2000).cheap_copy);
}
#endif
