// cuda::embed's errors and out-of-range tokens (every format against cpu::embed: the op table,
// tests/ops/embed.cpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "cuda/embed.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;
using test::RandMat;

TEST(KernelEmbed, OutOfRangeTokenGivesNanRowAndBadShapeIsAnError) {
  REQUIRE_GPU();
  RandMat m(GgmlType::Q8_0, 16, 64, 9);
  Dev<int> dt(std::vector<int>{3, 16, -1});
  Dev<float> out((size_t)3 * 64);
  cuda::embed(m.mat, dt.p(), 3, out.p(), 64, nullptr);
  const std::vector<float> got = out.get();
  std::vector<float> ref(64);
  cpu::embed(ref.data(), m.view, 3);
  for (int c = 0; c < 64; ++c) {
    EXPECT_EQ(got[c], ref[c]);
    EXPECT_TRUE(std::isnan(got[64 + c]));
    EXPECT_TRUE(std::isnan(got[128 + c]));
  }
  EXPECT_THROW(cuda::embed(m.mat, dt.p(), 3, out.p(), 32, nullptr), Error);  // ldx < cols
  EXPECT_THROW(cuda::embed(m.mat, dt.p(), 0, out.p(), 64, nullptr), Error);
}

}  // namespace
}  // namespace smolrt
