// fp16/bf16 conversion, the type table, and the format traits (quant/format.h) against what they
// drive: the converter, the lists and messages, each format's quantize -> dequantize round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "quant/format.h"
#include "quant/formats.h"
#include "quant/quantize.h"
#include "test_util.h"

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

TEST(FormatTrait, TypeTableIsTheTraits) {
  int n = 0;
  for_each_format([&](auto f) {
    using F = decltype(f);
    SCOPED_TRACE(F::kName);
    const TypeInfo* ti = type_info(F::kType);
    ASSERT_NE(ti, nullptr);
    EXPECT_STREQ(ti->name, F::kName);
    EXPECT_EQ(ti->block_size, F::kBlockSize);
    EXPECT_EQ(ti->block_bytes, static_cast<int>(sizeof(typename F::Block)));
    EXPECT_TRUE(ti->computable);
    EXPECT_TRUE(is_convertible(F::kType));
    ++n;
  });
  EXPECT_EQ(n, Formats::kCount);
  EXPECT_EQ(test::all_formats().size(), static_cast<size_t>(n));
  // Known ids that are no format: parsed (sizes), neither computed nor converted.
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q8_K}) {
    ASSERT_NE(type_info(t), nullptr);
    EXPECT_FALSE(type_info(t)->computable) << type_name(t);
    EXPECT_FALSE(is_convertible(t)) << type_name(t);
    EXPECT_FALSE(is_format(t)) << type_name(t);
  }
  EXPECT_EQ(type_info(uint32_t{99}), nullptr);
}

TEST(FormatTrait, NamesListEveryFormatInOrder) {
  const std::string names = format_names(), upper = format_names(true);
  EXPECT_EQ(names, "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k");
  EXPECT_EQ(upper, "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K");
  // The converter's error for a known id that is no format lists them.
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> y(1024);
  try {
    quantize_row(GgmlType::Q2_K, x.data(), y.data(), 256);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

// Relative RMS error of quantize -> dequantize on N(0, 1) rows of 4,096 values, per format. The
// bounds are 1.5x what each format measures on this row (q4_0 0.085, q4_1 0.078, q4_k 0.072, q5_0
// 0.041, q5_1 0.037, q5_k 0.036, q6_k 0.018, q8_0 0.0052, bf16 0.0017, f16 2.1e-4): loose enough
// for the rounding of another compiler, tight enough that a decoder off by one level or a wrong
// scale fails. A format without a bound here fails the test: a new format must say what accuracy
// it has.
TEST(FormatTrait, RoundTripWithinEachFormatsBound) {
  const std::map<std::string, double> bound = {{"f32", 0.0},    {"f16", 3.2e-4}, {"bf16", 2.6e-3},
                                               {"q4_0", 0.13},  {"q4_1", 0.12},  {"q5_0", 0.065},
                                               {"q5_1", 0.06},  {"q8_0", 8e-3},  {"q4_k", 0.11},
                                               {"q5_k", 0.055}, {"q6_k", 0.027}};
  const int64_t n = 4096;
  const std::vector<float> x = test::randn(n, 11);
  for_each_format([&](auto f) {
    using F = decltype(f);
    SCOPED_TRACE(F::kName);
    const auto it = bound.find(F::kName);
    ASSERT_NE(it, bound.end()) << "no round-trip bound for format " << F::kName;
    std::vector<typename F::Block> q(n / F::kBlockSize);
    quantize_row(F::kType, x.data(), q.data(), n);
    std::vector<float> y(n, NAN);
    dequantize_row(F::kType, q.data(), y.data(), n);
    // The trait's own decoder, block by block, gives the same values.
    std::vector<float> z(n, NAN);
    for (size_t b = 0; b < q.size(); ++b) F::dequantize(q[b], z.data() + b * F::kBlockSize);
    EXPECT_EQ(y, z);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
      ref += double(x[i]) * x[i];
    }
    const double rel = std::sqrt(err / ref);
    EXPECT_LE(rel, it->second);
    // And not trivially exact where the format rounds (a no-op decoder would pass a bound).
    if (it->second > 0) {
      EXPECT_GT(rel, it->second / 20);
    }
  });
}

// Each format's quantizer refuses a non-finite value, naming its element.
TEST(FormatTrait, NonFiniteInputIsAnErrorInEveryFormat) {
  for_each_format([&](auto f) {
    using F = decltype(f);
    SCOPED_TRACE(F::kName);
    std::vector<float> x = test::randn(256, 3);
    x[77] = NAN;
    std::vector<typename F::Block> q(256 / F::kBlockSize);
    try {
      quantize_row(F::kType, x.data(), q.data(), 256);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("77"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace smolrt
