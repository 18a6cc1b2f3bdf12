// GGUF files: metadata values, the tensor table, a validated mmap reader and a writer.
//
// Layout (little-endian): "GGUF", u32 version (2|3), u64 n_tensors, u64 n_kv; n_kv key/value
// pairs; n_tensors tensor infos (name, u32 n_dims <= 4, u64 ne[n_dims], u32 type, u64 offset
// relative to the data section); the data section starts at the next multiple of
// general.alignment (default 32). ne[0] is the innermost (contiguous) dimension.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "quant/formats.h"

namespace smolrt::gguf {

// Largest general.alignment smolrt reads or writes. llama.cpp accepts any power of two, but every
// real file uses 32 (the default) and the padding a file declares is written back verbatim, so a
// huge alignment in a few hundred bytes would make a write-back 1 GiB long. 2^16 covers any page
// size a loader could want to align tensors to.
inline constexpr uint64_t kMaxAlignment = uint64_t{1} << 16;

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* value_type_name(ValueType t);  // "u32", "string", "array", ...

struct Value;
struct Array {
  ValueType elem_type = ValueType::U8;
  std::vector<Value> items;  // arrays may nest (elem_type == ARRAY)
};

// One metadata value. Integers are held widened (unsigned in `u`, signed in `i`), floats in `f`;
// `type` keeps the exact on-disk type so a round trip writes the same bytes.
struct Value {
  ValueType type = ValueType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, Array> v;

  static Value u8(uint8_t x) { return {ValueType::U8, uint64_t{x}}; }
  static Value i8(int8_t x) { return {ValueType::I8, int64_t{x}}; }
  static Value u16(uint16_t x) { return {ValueType::U16, uint64_t{x}}; }
  static Value i16(int16_t x) { return {ValueType::I16, int64_t{x}}; }
  static Value u32(uint32_t x) { return {ValueType::U32, uint64_t{x}}; }
  static Value i32(int32_t x) { return {ValueType::I32, int64_t{x}}; }
  static Value u64(uint64_t x) { return {ValueType::U64, x}; }
  static Value i64(int64_t x) { return {ValueType::I64, x}; }
  static Value f32(float x) { return {ValueType::F32, double{x}}; }
  static Value f64(double x) { return {ValueType::F64, x}; }
  static Value boolean(bool x) { return {ValueType::BOOL, x}; }
  static Value str(std::string s) { return {ValueType::STRING, std::move(s)}; }
  static Value array(ValueType elem, std::vector<Value> items) {
    return {ValueType::ARRAY, Array{elem, std::move(items)}};
  }
  static Value string_array(const std::vector<std::string>& xs);
  static Value i32_array(const std::vector<int32_t>& xs);
  static Value f32_array(const std::vector<float>& xs);

  bool operator==(const Value& o) const;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  uint64_t ne[4] = {1, 1, 1, 1};  // ne[0] innermost; unused dims are 1
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;            // relative to the data section
  uint64_t nbytes = 0;            // from the type's block size and bytes
  const uint8_t* data = nullptr;  // into the mapping (reader) — valid while the File lives

  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// A parsed, validated GGUF file. Every length, count, offset and size is checked against the file
// size with overflow-safe arithmetic; any problem throws smolrt::Error naming the file, the field
// and the byte offset.
class File {
 public:
  // mmap the file read-only and parse it.
  static std::shared_ptr<File> open(const std::string& path);
  // Parse bytes already in memory (copied); `name` is used in error messages.
  static std::shared_ptr<File> parse(std::span<const uint8_t> bytes, std::string name);

  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;  // nullptr when absent
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed accessors. With a default: absent -> default. Without: absent -> Error naming the key.
  // A present value of the wrong type is always an Error naming key, expected and actual type.
  // Integer getters accept any integer type whose value fits the requested range.
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, const std::string& def) const;
  uint64_t get_uint(std::string_view key) const;
  uint64_t get_uint(std::string_view key, uint64_t def) const;
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t def) const;
  double get_float(std::string_view key) const;  // F32 or F64
  double get_float(std::string_view key, double def) const;
  bool get_bool(std::string_view key) const;
  bool get_bool(std::string_view key, bool def) const;
  // Arrays (Error when absent or of another element type; empty vector allowed).
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

 private:
  File() = default;
  struct Mapping;
  std::unique_ptr<Mapping> map_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t size_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<uint64_t> kv_offsets_;  // byte offset of each key in kv_, for error messages
  std::vector<TensorInfo> tensors_;
  const std::pair<std::string, Value>& require(std::string_view key) const;  // Error if absent
  [[noreturn]] void type_error(std::string_view key, const char* expected) const;
  void parse_all(const uint8_t* p, uint64_t n);
};

// Writes metadata and tensors (version 3) with correct alignment (general.alignment if set,
// else 32; a power of two up to kMaxAlignment). Tensor data is copied from the given pointers at
// write() time; padding is written from a fixed-size block of zeros, never a buffer sized by the
// alignment.
class Writer {
 public:
  void set(std::string key, Value v);  // replaces an existing key, keeps its position
  void remove(std::string_view key);
  // ne[0] innermost; data must hold row_bytes(type, ne[0]) * ne[1] * ne[2] * ne[3] bytes.
  void add_tensor(std::string name, std::vector<uint64_t> ne, GgmlType type, const void* data,
                  uint64_t nbytes);
  void write(const std::string& path) const;  // throws Error on I/O failure
  std::vector<uint8_t> to_bytes() const;      // the exact bytes write() produces

 private:
  struct PendingTensor {
    std::string name;
    std::vector<uint64_t> ne;
    GgmlType type;
    const void* data;
    uint64_t nbytes;
  };
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace smolrt::gguf
