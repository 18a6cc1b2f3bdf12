// mask_logits: structured output's allowed-token mask on the logits (prefill_ops.h) against its CPU
// twin cpu::mask_logits.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "cuda/cuda_test_util.h"
#include "cuda/prefill_ops.h"
#include "test_util.h"

namespace smolrt {
namespace {

using test::Dev;

// mask_logits against its CPU twin cpu::mask_logits: rows with a mask index get -inf
// where their mask's bit is clear, rows without one are untouched; a vocabulary that is not a
// multiple of 32 (the last word's high bits unused).
TEST(PrefillOps, MaskLogitsMatchesCpuTwin) {
  REQUIRE_GPU();
  const int V = 1000, W = (V + 31) / 32, rows = 5, ld = 1008;
  const std::vector<float> x = test::randn((size_t)rows * ld, 3);
  std::vector<uint32_t> masks(2 * W);
  std::mt19937 rng(9);
  for (uint32_t& w : masks) w = rng();
  const std::vector<int> idx = {1, -1, 0, 1, -1};
  Dev<float> dx(x);
  Dev<uint32_t> dm(masks);
  Dev<int> di(idx);
  cuda::mask_logits(dx.p(), ld, V, rows, di.p(), dm.p(), W, nullptr);
  const std::vector<float> got = dx.get();
  std::vector<float> buf;
  for (int r = 0; r < rows; ++r) {
    const std::span<const float> row(x.data() + (size_t)r * ld, V);
    const std::span<const float> want =
        idx[r] < 0
            ? row
            : cpu::mask_logits(row, std::span<const uint32_t>(masks).subspan(idx[r] * W, W), buf);
    for (int t = 0; t < V; ++t) ASSERT_EQ(got[(size_t)r * ld + t], want[t]) << r << "," << t;
    for (int t = V; t < ld; ++t) ASSERT_EQ(got[(size_t)r * ld + t], x[(size_t)r * ld + t]);
  }
}

}  // namespace
}  // namespace smolrt
