// embed: cuda::embed (token rows of an embedding matrix, embed.h) against cpu::embed, one token (a
// decode step) and many (prompt chunks, multi-sequence steps), scaled, into rows with a pitch
// whose padding columns must stay untouched; exact. Then out-of-range tokens and bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_test_util.h"
#include "cuda/embed.h"
#include "ops/op_table.h"
#include "test_util.h"

namespace smolrt::test::ops {
namespace {

// 53 rows; columns past one block of threads (300, 512) and a row of one block's worth (96).
std::vector<Shape> shapes(GgmlType t) {
  const int cols = block_of(t) == 1 ? 300 : (block_of(t) == 256 ? 512 : 96);
  return {{53, cols, 1}, {53, cols, 11}};
}

void check(const Case& c) {
  const int cols = c.shape.cols, n = c.shape.t;
  RandMat m(c.type, c.shape.rows, cols, c.seed);
  const std::vector<int> all = {0, 52, 7, 7, 31, 1, 52, 19, 0, 44, 3};
  const std::vector<int> toks(all.begin(), all.begin() + n);
  const float scale = n == 1 ? 1.f : 2.5f;
  const int ldx = cols + 6;
  Dev<int> dt(toks);
  Dev<float> out((size_t)n * ldx);  // poisoned (NaN bytes)
  cuda::embed(m.mat, dt.p(), n, out.p(), ldx, nullptr, scale);
  const std::vector<float> got = out.get();
  std::vector<float> ref(cols);
  for (int i = 0; i < n; ++i) {
    cpu::embed(ref.data(), m.view, toks[i]);
    for (int col = 0; col < cols; ++col)
      ASSERT_EQ(got[(size_t)i * ldx + col], ref[col] * scale)
          << "row " << i << " (token " << toks[i] << ") col " << col;
    for (int col = cols; col < ldx; ++col) {
      uint32_t bits;
      std::memcpy(&bits, &got[(size_t)i * ldx + col], 4);
      ASSERT_EQ(bits, 0xffffffffu) << "padding column " << col << " of row " << i << " written";
    }
  }
}

}  // namespace

Op embed_op() {
  return {"embed", [](GgmlType) { return true; }, shapes, check};
}

}  // namespace smolrt::test::ops

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
