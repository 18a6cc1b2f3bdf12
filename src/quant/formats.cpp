#include "quant/formats.h"

#include <array>
#include <cctype>
#include <string>

#include "quant/format.h"

namespace smolrt {

namespace {

// Types GGUF files may carry that smolrt neither computes nor converts: their sizes (as ggml
// defines them) let a file that holds them be parsed and the tensor named in the error.
constexpr TypeInfo kOthers[] = {
    {GgmlType::Q8_1, "q8_1", 32, 36, false},
    {GgmlType::Q2_K, "q2_k", 256, 84, false},
    {GgmlType::Q3_K, "q3_k", 256, 110, false},
    {GgmlType::Q8_K, "q8_k", 256, 292, false},
};

// The formats (format.h), then the others.
constexpr auto make_table() {
  std::array<TypeInfo, Formats::kCount + std::size(kOthers)> t{};
  size_t i = 0;
  for_each_format([&](auto f) {
    using F = decltype(f);
    t[i++] = {F::kType, F::kName, F::kBlockSize, F::kBlockBytes, true};
  });
  for (const TypeInfo& o : kOthers) t[i++] = o;
  return t;
}
constexpr auto kTypes = make_table();

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

std::string format_names(bool upper) {
  std::string s;
  for_each_format([&](auto f) {
    if (!s.empty()) s += ", ";
    for (const char* c = decltype(f)::kName; *c; ++c)
      s += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(*c))) : *c;
  });
  return s;
}

}  // namespace smolrt
