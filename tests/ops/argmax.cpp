// argmax: cuda::argmax, argmax_rows, the lm_head matvec with stage 1 fused and the hand-off to
// the next step, against cpu::argmax.
// Outputs are poisoned (NaN bytes) before each kernel runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "cuda/argmax.h"
#include "cuda/cuda_test_util.h"
#include "cuda/gemv.h"
#include "cuda/prefill_ops.h"
#include "quant/formats.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::RandMat;

// --- argmax -----------------------------------------------------------------------------------

int gpu_argmax(const std::vector<float>& x) {
  Dev<float> dx(x), pv((size_t)cuda::kArgmaxBlocks);
  Dev<int> pi((size_t)cuda::kArgmaxBlocks), out((size_t)1);
  cuda::argmax(dx.p(), (int)x.size(), pv.p(), pi.p(), out.p(), nullptr);
  return out.get()[0];
}

TEST(KernelArgmax, Cases) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(gpu_argmax({0.5f, 3.f, -1.f, 2.f}), 1);
  EXPECT_EQ(gpu_argmax(std::vector<float>(1000, 4.25f)), 0);  // all equal -> lowest index
  std::vector<float> last = test::randn(49152, 3);
  last.back() = 100.f;
  EXPECT_EQ(gpu_argmax(last), 49151);
  std::vector<float> ties = test::randn(5000, 4);
  ties[4000] = 50.f;
  ties[1234] = 50.f;
  EXPECT_EQ(gpu_argmax(ties), 1234);
  EXPECT_EQ(gpu_argmax({NAN, 1.f, NAN, 3.f, NAN}), 3);  // NaN never wins
  EXPECT_EQ(gpu_argmax({-inf, NAN, -inf}), 0);          // -inf is a value, NaN is not
  EXPECT_EQ(gpu_argmax({1.f, inf, NAN, inf, 2.f}), 1);  // +inf wins, first of ties
  EXPECT_EQ(gpu_argmax({NAN, NAN, NAN}), 0);            // all NaN -> 0
  EXPECT_EQ(gpu_argmax({-3.f}), 0);
  for (uint32_t seed = 0; seed < 4; ++seed) {
    std::vector<float> v = test::randn(49152, 50 + seed);
    v[seed * 1000 + 7] = NAN;
    EXPECT_EQ(gpu_argmax(v), cpu::argmax(v.data(), (int)v.size())) << "seed " << seed;
  }
  for (int n : {1, 31, 257, 67585}) {
    std::vector<float> v = test::randn(n, n);
    EXPECT_EQ(gpu_argmax(v), cpu::argmax(v.data(), n)) << "n " << n;
  }
}

// argmax_rows (the multi-row steps' argmax, a cluster of blocks per row) vs cpu::argmax per row:
// widths around the blocks' slices, a pitch past the width (scalar loads) or not (16-byte loads),
// ties across slices, NaN, +-inf and all-NaN rows; on a stream (PDL launch) and on the default one.
TEST(KernelArgmax, RowsMatchCpu) {
  REQUIRE_GPU();
  const float inf = std::numeric_limits<float>::infinity();
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  for (int cols : {1, 5, 33, 1000, 49152, 128256, 262147})
    for (int pad : {0, 3}) {
      const int ld = cols + pad, rows = cols > 100000 ? 70 : 130;
      std::vector<float> x = test::randn((size_t)rows * ld, (uint32_t)(cols + pad));
      auto row = [&](int r) { return &x[(size_t)r * ld]; };
      std::fill_n(row(0), cols, NAN);              // all NaN: 0
      row(1)[cols - 1] = row(1)[cols / 2] = 1e3f;  // ties in two slices: the lower index
      std::fill_n(row(2), cols - 1, NAN);          // the one value left wins
      std::fill_n(row(3), cols, -inf);             // -inf is a value
      row(4)[cols - 1] = row(4)[cols / 3] = inf;   // +inf wins, the first of ties
      std::fill_n(row(5), cols, 2.f);              // all equal: 0
      row(6)[cols - 1] = 50.f;                     // the last column
      Dev<float> dx(x);
      Dev<int> out((size_t)rows);
      for (cudaStream_t s : {st, (cudaStream_t) nullptr}) {
        // The poison and the read-back run on the legacy default stream, which a non-blocking
        // stream does not wait for or hold up: synchronize around the launch.
        out.poison();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        cuda::argmax_rows(dx.p(), ld, cols, rows, out.p(), s);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<int> got = out.get();
        for (int r = 0; r < rows; ++r)
          ASSERT_EQ(got[r], cpu::argmax(row(r), cols))
              << "row " << r << " cols " << cols << " ld " << ld;
      }
    }
  cudaStreamDestroy(st);
  EXPECT_THROW(cuda::argmax_rows(nullptr, 8, 8, 1, nullptr, nullptr), Error);
}

// --- lm_head with argmax stage 1 fused in -----------------------------------------------------

// gemv_argmax + argmax_final vs gemv + the CPU argmax: bit-identical logits (same kernel body),
// the same id. Returns the id.
int check_fused_argmax(const cuda::DevMat& m, const std::vector<float>& x, const float* norm_w) {
  Dev<float> dx(x), a((size_t)m.rows), b((size_t)m.rows), pv((size_t)cuda::kGemvMaxBlocks);
  Dev<int> pi((size_t)cuda::kGemvMaxBlocks), out((size_t)1);
  cuda::gemv(m, dx.p(), norm_w, 1e-5f, a.p(), false, nullptr);
  const int parts = cuda::gemv_argmax(m, dx.p(), norm_w, 1e-5f, b.p(), pv.p(), pi.p(), nullptr);
  EXPECT_EQ(parts, cuda::gemv_argmax_parts(m));
  EXPECT_GE(parts, 1);
  cuda::argmax_final(pv.p(), pi.p(), parts, out.p(), nullptr);
  const std::vector<float> la = a.get(), lb = b.get();
  // Bitwise (NaN logits included): the same kernel body computes both.
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float))) << "rows " << m.rows;
  const int id = out.get()[0];
  EXPECT_EQ(id, cpu::argmax(la.data(), m.rows)) << "rows " << m.rows;
  return id;
}

TEST(KernelArgmax, FusedWithLmHeadMatchesSeparate) {
  REQUIRE_GPU();
  const std::vector<float> x = test::randn(576, 91);
  Dev<float> norm(test::randn(576, 92));
  RandMat head(GgmlType::Q8_0, 49152, 576, 90);  // the SmolLM2-135M lm_head shape
  check_fused_argmax(head.mat, x, nullptr);
  check_fused_argmax(head.mat, x, norm.p());
  RandMat odd(GgmlType::Q4_0, 1001, 576, 93);  // odd rows: the last item recomputes one row
  check_fused_argmax(odd.mat, x, nullptr);
  RandMat gemma(GgmlType::Q8_0, 262144, 640, 96);  // gemma-3-270m's tied lm_head shape
  check_fused_argmax(gemma.mat, std::vector<float>(test::randn(640, 95)), nullptr);
  RandMat k6(GgmlType::Q6_K, 30001, 1024, 98);  // a K-quant lm_head, more rows than warps
  check_fused_argmax(k6.mat, std::vector<float>(test::randn(1024, 99)), nullptr);
  RandMat k6w(GgmlType::Q6_K, 20001, 2048, 89);  // SmolLM2-1.7B-wide: column slices, grid loops
  check_fused_argmax(k6w.mat, std::vector<float>(test::randn(2048, 88)), nullptr);
  RandMat k3(GgmlType::Q4_K, 5001, 3072, 87);  // 3 slices: two idle warps per block, rounds loop
  check_fused_argmax(k3.mat, std::vector<float>(test::randn(3072, 86)), nullptr);
  RandMat odd8(GgmlType::Q8_0, 8195, 576, 97);  // wide kernel, partial last row group
  check_fused_argmax(odd8.mat, x, norm.p());

  // F32 matrices built to hit the rules: ties -> lowest row across blocks; NaN never wins.
  const int rows = 300, cols = 64;
  const std::vector<float> xs = test::randn(cols, 94);
  std::vector<float> w = test::randn((size_t)rows * cols, 95);
  for (int c = 0; c < cols; ++c) {
    w[(size_t)250 * cols + c] = 10.f * xs[c];  // tie between rows 250 and 280: 250 wins
    w[(size_t)280 * cols + c] = 10.f * xs[c];
    w[(size_t)5 * cols + c] = 20.f * xs[c];  // larger, but NaN below
  }
  w[(size_t)5 * cols + 3] = NAN;
  Dev<float> dw(w);
  const cuda::DevMat fm{GgmlType::F32, rows, cols, dw.p(), nullptr};
  EXPECT_EQ(check_fused_argmax(fm, xs, nullptr), 250);
  std::vector<float> same((size_t)rows * cols);
  for (size_t i = 0; i < same.size(); ++i) same[i] = xs[i % cols];  // all rows equal
  Dev<float> ds(same);
  const cuda::DevMat sm{GgmlType::F32, rows, cols, ds.p(), nullptr};
  EXPECT_EQ(check_fused_argmax(sm, xs, nullptr), 0);
  std::vector<float> xnan = xs;
  xnan[0] = NAN;  // every logit NaN -> 0
  Dev<float> dxn(xnan), lo((size_t)rows), pv((size_t)cuda::kGemvMaxBlocks);
  Dev<int> pi((size_t)cuda::kGemvMaxBlocks), out((size_t)1);
  const int parts = cuda::gemv_argmax(fm, dxn.p(), nullptr, 0, lo.p(), pv.p(), pi.p(), nullptr);
  cuda::argmax_final(pv.p(), pi.p(), parts, out.p(), nullptr);
  EXPECT_EQ(out.get()[0], 0);
  EXPECT_THROW(cuda::argmax_final(pv.p(), pi.p(), 0, out.p(), nullptr), Error);
}

// The decode hand-off: stage 2 writes the id into the token slot, advances the position slot and
// stores the id in pinned host memory (UVA-mapped), for both argmax entry points.
TEST(KernelArgmax, HandOffToNextStep) {
  REQUIRE_GPU();
  std::vector<float> v = test::randn(49152, 96);
  v[31337] = 99.f;
  Dev<float> dv(v), pv((size_t)cuda::kGemvMaxBlocks);
  Dev<int> pi((size_t)cuda::kGemvMaxBlocks), out((size_t)1);
  cuda::PinnedBuffer host(sizeof(int), "test");
  int* hid = static_cast<int*>(host.get());
  int* hid_dev = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hid_dev), hid, 0));
  for (int round = 0; round < 2; ++round) {
    // Token slot 0; fields 1 and 3 advance, 2 stays (the multi-sequence staging's shape).
    Dev<int> params(std::vector<int>{7, 41, 5, 9});
    const cuda::StepHandoff next{params.p(), params.p(), 0b1010u};
    *hid = -5;
    if (round == 0) {
      cuda::argmax(dv.p(), (int)v.size(), pv.p(), pi.p(), out.p(), nullptr, next, hid_dev);
    } else {
      // The first round's stage-1 partials are still in pv/pi: 192 blocks of 256 threads cover
      // 49152 values.
      cuda::argmax_final(pv.p(), pi.p(), 192, out.p(), nullptr, next, hid_dev);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(params.get(), (std::vector<int>{31337, 42, 5, 10})) << "round " << round;
    EXPECT_EQ(*reinterpret_cast<volatile int*>(hid), 31337) << "round " << round;
    EXPECT_EQ(out.get()[0], 31337);
  }
}

}  // namespace
}  // namespace smolrt
