#include <gtest/gtest.h>

#include <cmath>

#include "quant/formats.h"

namespace smolrt {
namespace {

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_fp16(f), h) << "half bits " << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even).
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even zero
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(Bf16, RoundTripsAndRounds) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
}

TEST(TypeInfo, KnownSizes) {
  ASSERT_NE(type_info(GgmlType::Q4_0), nullptr);
  EXPECT_EQ(type_info(GgmlType::Q4_0)->block_bytes, 18);
  EXPECT_EQ(type_info(GgmlType::Q8_0)->block_bytes, 34);
  EXPECT_EQ(type_info(GgmlType::Q4_1)->block_bytes, 20);
  EXPECT_EQ(type_info(GgmlType::Q6_K)->block_size, 256);
  EXPECT_EQ(type_info(4u), nullptr);  // ids 4 and 5 were removed from ggml
  EXPECT_EQ(type_info(999u), nullptr);
}

}  // namespace
}  // namespace smolrt
