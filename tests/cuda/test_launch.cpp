// Launches with programmatic dependent launch (PDL) give the same results as plain ones.
// Outputs are poisoned (NaN bytes) before each kernel runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/gemv.h"
#include "cuda/launch.h"
#include "quant/formats.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::RandMat;

// --- PDL launches give the same results ---------------------------------------------------------

TEST(KernelLaunch, PdlMatchesPlain) {
  REQUIRE_GPU();
  RandMat m(GgmlType::Q4_0, 576, 576, 77);
  std::vector<float> x = test::randn(576, 78);
  Dev<float> dx(x), a((size_t)576), b((size_t)576);
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CUDA_CHECK(cudaDeviceSynchronize());  // the buffers were filled on the legacy stream
  cuda::gemv(m.mat, dx.p(), nullptr, 0, a.p(), false, cuda::Launch(st, false, true));
  cuda::gemv(m.mat, dx.p(), nullptr, 0, b.p(), false, cuda::Launch(st, true, true));
  // chained (PDL edge): same result
  cuda::gemv(m.mat, dx.p(), nullptr, 0, b.p(), true, cuda::Launch(st, true, true));
  CUDA_CHECK(cudaStreamSynchronize(st));
  CUDA_CHECK(cudaStreamDestroy(st));
  std::vector<float> ga = a.get(), gb = b.get();
  for (int i = 0; i < 576; ++i) ASSERT_EQ(gb[i], ga[i] + ga[i]) << i;
}

}  // namespace
}  // namespace smolrt
