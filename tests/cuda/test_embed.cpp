// cuda::embed against its CPU twin cpu::embed, on random matrices of every format: one token (a
// decode step) and many (prompt chunks, multi-sequence steps); outputs poisoned first.
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

TEST(KernelEmbed, AllFormatsMatchCpuRowByRow) {
  REQUIRE_GPU();
  for (GgmlType t : test::all_formats()) {
    // Columns past one block of threads (300, 512) and a row of one block's worth (96).
    const int block = type_info(t)->block_size;
    const int rows = 53, cols = block == 1 ? 300 : (block == 256 ? 512 : 96);
    RandMat m(t, rows, cols, 5);
    const std::vector<int> toks = {0, 52, 7, 7, 31, 1, 52, 19, 0, 44, 3};
    for (int n : {1, (int)toks.size()}) {
      const int ldx = cols + 6;  // padding columns must stay untouched
      Dev<int> dt(std::vector<int>(toks.begin(), toks.begin() + n));
      Dev<float> out((size_t)n * ldx);  // poisoned (NaN bytes)
      cuda::embed(m.mat, dt.p(), n, out.p(), ldx, nullptr, n == 1 ? 1.f : 2.5f);
      const std::vector<float> got = out.get();
      std::vector<float> ref(cols);
      for (int i = 0; i < n; ++i) {
        cpu::embed(ref.data(), m.view, toks[i]);
        for (int c = 0; c < cols; ++c) {
          ASSERT_EQ(got[(size_t)i * ldx + c], ref[c] * (n == 1 ? 1.f : 2.5f))
              << type_name(t) << " row " << i << " (token " << toks[i] << ") col " << c;
        }
        for (int c = cols; c < ldx; ++c) {
          uint32_t bits;
          std::memcpy(&bits, &got[(size_t)i * ldx + c], 4);
          ASSERT_EQ(bits, 0xffffffffu) << "padding column " << c << " of row " << i << " written";
        }
      }
    }
  }
}

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
