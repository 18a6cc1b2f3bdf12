#include "quant/formats.h"

namespace smolrt {

namespace {
// Sizes as ggml defines them; the K-quants have 256-element super-blocks.
constexpr TypeInfo kTypes[] = {
    {GgmlType::F32, "f32", 1, 4, true},       {GgmlType::F16, "f16", 1, 2, true},
    {GgmlType::Q4_0, "q4_0", 32, 18, true},   {GgmlType::Q4_1, "q4_1", 32, 20, true},
    {GgmlType::Q5_0, "q5_0", 32, 22, true},   {GgmlType::Q5_1, "q5_1", 32, 24, true},
    {GgmlType::Q8_0, "q8_0", 32, 34, true},   {GgmlType::Q8_1, "q8_1", 32, 36, false},
    {GgmlType::Q2_K, "q2_k", 256, 84, false}, {GgmlType::Q3_K, "q3_k", 256, 110, false},
    {GgmlType::Q4_K, "q4_k", 256, 144, true}, {GgmlType::Q5_K, "q5_k", 256, 176, true},
    {GgmlType::Q6_K, "q6_k", 256, 210, true}, {GgmlType::Q8_K, "q8_k", 256, 292, false},
    {GgmlType::BF16, "bf16", 1, 2, true},
};
}  // namespace

const TypeInfo* type_info(uint32_t id) {
  for (const TypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const char* type_name(GgmlType t) {
  const TypeInfo* ti = type_info(t);
  return ti ? ti->name : "unknown";
}

}  // namespace smolrt
