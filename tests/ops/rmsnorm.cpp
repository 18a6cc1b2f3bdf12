// rmsnorm: cuda::rmsnorm against cpu::rmsnorm on random data, odd sizes included.
// Outputs are poisoned (NaN bytes) before each kernel runs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/cuda_test_util.h"
#include "cuda/rmsnorm.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;

// --- RMSNorm ---------------------------------------------------------------------------------

TEST(KernelRmsnorm, MatchesCpu) {
  REQUIRE_GPU();
  for (int n : {7, 64, 576, 1000, 2049}) {
    std::vector<float> x = test::randn(n, 1 + n, 3.f), w = test::randn(n, 2 + n);
    Dev<float> dx(x), dw(w), out((size_t)n);
    cuda::rmsnorm(out.p(), dx.p(), dw.p(), n, 1e-5f, nullptr);
    std::vector<float> ref(n);
    cpu::rmsnorm(ref.data(), x.data(), w.data(), n, 1e-5f);
    std::vector<float> got = out.get();
    // rsqrtf (<=2 ulp) and a different summation order: 1e-5 relative is ~50x the typical error.
    for (int i = 0; i < n; ++i) ASSERT_NEAR(got[i], ref[i], 1e-5f * (std::fabs(ref[i]) + 1e-3f));
  }
}

}  // namespace
}  // namespace smolrt
