// File's typed metadata and tensor lookups. Errors name the file, the key, its byte offset, and
// the expected and actual types.
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace smolrt::gguf {

namespace {
bool is_float(ValueType t) {
  return t == ValueType::F32 || t == ValueType::F64;
}
}  // namespace

const Value* File::find(std::string_view key) const {
  for (const auto& [k, v] : kv_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const std::pair<std::string, Value>& File::require(std::string_view key) const {
  for (const auto& kv : kv_) {
    if (kv.first == key) return kv;
  }
  fail(path_, ": required metadata key '", key,
       "' is missing; the file was not converted for this model type");
}

void File::type_error(std::string_view key, const char* expected) const {
  for (size_t i = 0; i < kv_.size(); ++i) {
    if (kv_[i].first != key) continue;
    const Value& v = kv_[i].second;
    std::string actual = value_type_name(v.type);
    if (const Array* a = std::get_if<Array>(&v.v)) {
      actual = cat("array of ", value_type_name(a->elem_type));
    }
    fail(path_, ": metadata '", key, "' at byte offset ", kv_offsets_[i], " has type ", actual,
         ", expected ", expected);
  }
  fail(path_, ": metadata '", key, "' expected ", expected);
}

// --- scalars ------------------------------------------------------------------------------------

std::string File::get_string(std::string_view key) const {
  const Value& v = require(key).second;
  if (v.type != ValueType::STRING) type_error(key, "string");
  return std::get<std::string>(v.v);
}
std::string File::get_string(std::string_view key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}

uint64_t File::get_uint(std::string_view key) const {
  const Value& v = require(key).second;
  if (const uint64_t* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const int64_t* i = std::get_if<int64_t>(&v.v)) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
    type_error(key, cat("a non-negative integer (the value is ", *i, ")").c_str());
  }
  type_error(key, "an unsigned integer");
}
uint64_t File::get_uint(std::string_view key, uint64_t def) const {
  return has(key) ? get_uint(key) : def;
}

int64_t File::get_int(std::string_view key) const {
  const Value& v = require(key).second;
  if (const int64_t* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const uint64_t* u = std::get_if<uint64_t>(&v.v)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(*u);
    }
    type_error(key, cat("an integer below 2^63 (the value is ", *u, ")").c_str());
  }
  type_error(key, "an integer");
}
int64_t File::get_int(std::string_view key, int64_t def) const {
  return has(key) ? get_int(key) : def;
}

double File::get_float(std::string_view key) const {
  const Value& v = require(key).second;
  if (!is_float(v.type)) type_error(key, "f32 or f64");
  return std::get<double>(v.v);
}
double File::get_float(std::string_view key, double def) const {
  return has(key) ? get_float(key) : def;
}

bool File::get_bool(std::string_view key) const {
  const Value& v = require(key).second;
  if (v.type != ValueType::BOOL) type_error(key, "bool");
  return std::get<bool>(v.v);
}
bool File::get_bool(std::string_view key, bool def) const {
  return has(key) ? get_bool(key) : def;
}

// --- arrays -------------------------------------------------------------------------------------

std::vector<std::string> File::get_string_array(std::string_view key) const {
  const Value& v = require(key).second;
  const Array* a = std::get_if<Array>(&v.v);
  if (!a || a->elem_type != ValueType::STRING) type_error(key, "array of string");
  std::vector<std::string> out;
  out.reserve(a->items.size());
  for (const Value& x : a->items) out.push_back(std::get<std::string>(x.v));
  return out;
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
  const Value& v = require(key).second;
  const Array* a = std::get_if<Array>(&v.v);
  const bool ok = a && a->elem_type != ValueType::STRING && a->elem_type != ValueType::ARRAY &&
                  a->elem_type != ValueType::BOOL && !is_float(a->elem_type);
  if (!ok) type_error(key, "array of integers");
  std::vector<int64_t> out;
  out.reserve(a->items.size());
  for (const Value& x : a->items) {
    if (const int64_t* i = std::get_if<int64_t>(&x.v)) {
      out.push_back(*i);
    } else {
      const uint64_t u = std::get<uint64_t>(x.v);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        type_error(key, "array of integers below 2^63");
      }
      out.push_back(static_cast<int64_t>(u));
    }
  }
  return out;
}

std::vector<float> File::get_float_array(std::string_view key) const {
  const Value& v = require(key).second;
  const Array* a = std::get_if<Array>(&v.v);
  if (!a || !is_float(a->elem_type)) type_error(key, "array of f32 or f64");
  std::vector<float> out;
  out.reserve(a->items.size());
  for (const Value& x : a->items) out.push_back(static_cast<float>(std::get<double>(x.v)));
  return out;
}

}  // namespace smolrt::gguf
