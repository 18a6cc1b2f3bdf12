// GGUF metadata values: type names, convenience constructors, equality.
#include <cmath>
#include <cstring>

#include "gguf/gguf.h"

namespace smolrt::gguf {

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8:
      return "u8";
    case ValueType::I8:
      return "i8";
    case ValueType::U16:
      return "u16";
    case ValueType::I16:
      return "i16";
    case ValueType::U32:
      return "u32";
    case ValueType::I32:
      return "i32";
    case ValueType::F32:
      return "f32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::U64:
      return "u64";
    case ValueType::I64:
      return "i64";
    case ValueType::F64:
      return "f64";
  }
  return "unknown";
}

Value Value::string_array(const std::vector<std::string>& xs) {
  std::vector<Value> items;
  items.reserve(xs.size());
  for (const std::string& s : xs) items.push_back(Value::str(s));
  return array(ValueType::STRING, std::move(items));
}

Value Value::i32_array(const std::vector<int32_t>& xs) {
  std::vector<Value> items;
  items.reserve(xs.size());
  for (int32_t x : xs) items.push_back(Value::i32(x));
  return array(ValueType::I32, std::move(items));
}

Value Value::f32_array(const std::vector<float>& xs) {
  std::vector<Value> items;
  items.reserve(xs.size());
  for (float x : xs) items.push_back(Value::f32(x));
  return array(ValueType::F32, std::move(items));
}

namespace {
// Floats compare equal when both are NaN (a signalling f32 NaN comes back quiet after a round
// trip through double, so bit equality would be too strict) or when they are ==.
bool same_float(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}
}  // namespace

bool Value::operator==(const Value& o) const {
  if (type != o.type || v.index() != o.v.index()) return false;
  if (const double* a = std::get_if<double>(&v)) return same_float(*a, std::get<double>(o.v));
  if (const Array* a = std::get_if<Array>(&v)) {
    const Array& b = std::get<Array>(o.v);
    return a->elem_type == b.elem_type && a->items == b.items;
  }
  if (const uint64_t* a = std::get_if<uint64_t>(&v)) return *a == std::get<uint64_t>(o.v);
  if (const int64_t* a = std::get_if<int64_t>(&v)) return *a == std::get<int64_t>(o.v);
  if (const bool* a = std::get_if<bool>(&v)) return *a == std::get<bool>(o.v);
  return std::get<std::string>(v) == std::get<std::string>(o.v);
}

}  // namespace smolrt::gguf
