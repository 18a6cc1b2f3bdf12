// quantize_model on real files: stories260K (all F32, ffn 172 -> the F16 fallback) to q8_0 / q4_0
// / f16 within per-block bounds; requantization from q4_1; the default model's Q4_0 layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/quantize_model.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace smolrt {
namespace {

std::vector<float> dequant(const gguf::TensorInfo& t) {
  std::vector<float> out(t.n_elements(), NAN);
  const uint64_t cols = t.ne[0], rows = t.n_elements() / cols;
  const size_t rb = row_bytes(*type_info(t.type), cols);
  for (uint64_t r = 0; r < rows; ++r) {
    dequantize_row(t.type, t.data + r * rb, out.data() + r * cols, static_cast<int64_t>(cols));
  }
  return out;
}

// Largest error a stored type may introduce on element i of block-aligned row data x:
// q4_0 up to d = amax/8 (nibble 15 clamp; d/2 elsewhere), q8_0 d/2 = amax/254, f16 relative 2^-11,
// each plus the fp16 rounding of the scale (relative 2^-11, times the largest |q|).
float allowed_error(GgmlType t, const float* x, uint64_t i) {
  const float kH = std::ldexp(1.0f, -11);
  if (t == GgmlType::F32) return 0.0f;
  if (t == GgmlType::F16) return std::fabs(x[i]) * kH + std::ldexp(1.0f, -25);
  const uint64_t b0 = i / 32 * 32;
  float amax = 0;
  for (uint64_t j = b0; j < b0 + 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float tiny = std::ldexp(1.0f, -24) * 16;  // fp16 subnormal scales
  if (t == GgmlType::Q4_0) return amax / 8 + 8 * (amax / 8) * kH + tiny;
  if (t == GgmlType::Q8_0) return amax / 254 + 127 * (amax / 127) * kH + tiny;
  ADD_FAILURE() << "unexpected type " << type_name(t);
  return 0.0f;
}

struct Case {
  GgmlType target;
  uint32_t file_type;
};

class Stories : public ::testing::TestWithParam<Case> {};

TEST_P(Stories, QuantizedWithinBoundsNormsF32) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  auto in = gguf::File::open(path.string());
  const Case c = GetParam();
  std::vector<std::string> log;
  QuantizedModel q = quantize_model(*in, c.target, [&](const std::string& l) { log.push_back(l); });
  const std::vector<uint8_t> bytes = q.writer.to_bytes();
  auto out = gguf::File::parse(bytes, "quantized");

  EXPECT_EQ(out->get_uint("general.file_type"), c.file_type);
  for (const auto& [key, value] : in->metadata()) {  // metadata copied
    if (key == "general.file_type") continue;
    const gguf::Value* v = out->find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_TRUE(*v == value) << key;
  }
  ASSERT_EQ(out->tensors().size(), in->tensors().size());
  EXPECT_EQ(q.n_tensors, in->tensors().size());

  int fallbacks = 0;
  for (const auto& ti : in->tensors()) {
    ASSERT_EQ(ti.type, GgmlType::F32) << "fixture changed: " << ti.name;
    const auto* to = out->find_tensor(ti.name);
    ASSERT_NE(to, nullptr) << ti.name;
    ASSERT_EQ(to->n_dims, ti.n_dims);
    for (int d = 0; d < 4; ++d) ASSERT_EQ(to->ne[d], ti.ne[d]) << ti.name;
    GgmlType want = c.target;
    if (ti.n_dims == 1) {
      want = GgmlType::F32;  // norms stay F32
    } else if (ti.ne[0] % 32 != 0 && c.target != GgmlType::F16) {
      want = GgmlType::F16;  // stories260K's ffn 172: not whole blocks
      ++fallbacks;
    } else if (c.target == GgmlType::Q4_0 &&
               (ti.name == "token_embd.weight" || ti.name == "output.weight")) {
      want = GgmlType::Q8_0;
    }
    EXPECT_EQ(to->type, want) << ti.name;
    const float* x = reinterpret_cast<const float*>(ti.data);
    const std::vector<float> y = dequant(*to);
    for (uint64_t i = 0; i < ti.n_elements(); ++i) {
      ASSERT_LE(std::fabs(y[i] - x[i]), allowed_error(to->type, x, i))
          << ti.name << " element " << i << " as " << type_name(to->type);
    }
  }
  EXPECT_EQ(static_cast<int>(q.fallbacks.size()), fallbacks);
  if (c.target != GgmlType::F16) {
    EXPECT_EQ(fallbacks, 5);  // blk.0-4.ffn_down.weight (cols 172)
    const bool noted = std::any_of(log.begin(), log.end(), [](const std::string& l) {
      return l.find("blk.0.ffn_down.weight: row length 172") != std::string::npos;
    });
    EXPECT_TRUE(noted);
  }
  const LlamaConfig cfg = load_config(*out);
  EXPECT_NO_THROW(load_weights(*out, cfg));
}

INSTANTIATE_TEST_SUITE_P(Targets, Stories,
                         ::testing::Values(Case{GgmlType::Q8_0, 7}, Case{GgmlType::Q4_0, 2},
                                           Case{GgmlType::F16, 1}),
                         [](const auto& tp) { return std::string(type_name(tp.param.target)); });

TEST(QuantizeModel, RequantizesFromQ4_1ExactlyLikeConvertRow) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  auto in = gguf::File::open(path.string());
  QuantizedModel q41 = quantize_model(*in, GgmlType::Q4_1);
  const std::vector<uint8_t> b41 = q41.writer.to_bytes();
  auto f41 = gguf::File::parse(b41, "q4_1");
  const auto* wq41 = f41->find_tensor("blk.2.attn_q.weight");
  ASSERT_EQ(wq41->type, GgmlType::Q4_1);
  EXPECT_EQ(f41->find_tensor("token_embd.weight")->type, GgmlType::Q8_0);

  QuantizedModel q40 = quantize_model(*f41, GgmlType::Q4_0);
  const std::vector<uint8_t> b40 = q40.writer.to_bytes();
  auto f40 = gguf::File::parse(b40, "q4_0");
  const auto* wq40 = f40->find_tensor("blk.2.attn_q.weight");
  ASSERT_EQ(wq40->type, GgmlType::Q4_0);
  std::vector<uint8_t> want(wq40->nbytes, 0x5a);
  const uint64_t cols = wq41->ne[0];
  for (uint64_t r = 0; r < wq41->ne[1]; ++r) {
    convert_row(GgmlType::Q4_1, wq41->data + r * cols / 32 * 20, GgmlType::Q4_0,
                want.data() + r * cols / 32 * 18, static_cast<int64_t>(cols));
  }
  EXPECT_EQ(std::memcmp(want.data(), wq40->data, want.size()), 0);
  // The Q8_0 embedding is copied byte for byte, not requantized.
  const auto* e41 = f41->find_tensor("token_embd.weight");
  const auto* e40 = f40->find_tensor("token_embd.weight");
  ASSERT_EQ(e40->type, GgmlType::Q8_0);
  EXPECT_EQ(std::memcmp(e41->data, e40->data, e41->nbytes), 0);
}

TEST(QuantizeModel, NonFiniteWeightNamesTensorAndRow) {
  REQUIRE_FIXTURE(path, "models/stories260K.gguf");
  auto in = gguf::File::open(path.string());
  const gguf::TensorInfo* t = in->find_tensor("blk.1.attn_k.weight");
  ASSERT_NE(t, nullptr);
  // Rebuild the file with one NaN in row 3 of blk.1.attn_k.weight.
  gguf::Writer w;
  for (const auto& [k, v] : in->metadata()) w.set(k, v);
  std::vector<std::vector<float>> copies;
  for (const auto& ti : in->tensors()) {
    const float* x = reinterpret_cast<const float*>(ti.data);
    copies.emplace_back(x, x + ti.n_elements());
    if (ti.name == t->name) copies.back()[3 * ti.ne[0] + 5] = NAN;
    w.add_tensor(ti.name, std::vector<uint64_t>(ti.ne, ti.ne + ti.n_dims), ti.type,
                 copies.back().data(), ti.nbytes);
  }
  const std::vector<uint8_t> bytes = w.to_bytes();
  auto bad = gguf::File::parse(bytes, "bad.gguf");
  try {
    quantize_model(*bad, GgmlType::Q8_0);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("blk.1.attn_k.weight' row 3"), std::string::npos) << m;
    EXPECT_NE(m.find("element 5"), std::string::npos) << m;
  }
}

TEST(QuantizeModel, ParseTargetType) {
  EXPECT_EQ(parse_target_type("q4_0"), GgmlType::Q4_0);
  EXPECT_EQ(parse_target_type("Q8_0"), GgmlType::Q8_0);
  EXPECT_EQ(parse_target_type("f16"), GgmlType::F16);
  try {
    parse_target_type("q5_k");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown type 'q5_k' for --type"), std::string::npos);
  }
}

TEST(DefaultModel, Q4_0HasTheSmolLMLayout) {
  REQUIRE_DEFAULT_MODEL(path);
  auto f = gguf::File::open(path.string());
  test::expect_smollm135m_q4_0_layout(*f);
  EXPECT_EQ(f->get_uint("general.file_type"), 2u);
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "smollm");
}

}  // namespace
}  // namespace smolrt
