// GGUF writer -> reader round trips: every value type (nested arrays included), every tensor type,
// alignment and zero padding, typed accessors, and the writer's own input checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/error.h"
#include "gguf/gguf.h"

namespace smolrt::gguf {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng() | 1);  // never all zeros
  return v;
}

std::shared_ptr<File> reparse(const Writer& w) {
  return File::parse(w.to_bytes(), "mem.gguf");
}

// One metadata entry of every value type, including nested arrays and extremes.
std::vector<std::pair<std::string, Value>> every_value() {
  return {
      {"t.u8", Value::u8(250)},
      {"t.i8", Value::i8(-128)},
      {"t.u16", Value::u16(65535)},
      {"t.i16", Value::i16(-32768)},
      {"t.u32", Value::u32(4000000000u)},
      {"t.i32", Value::i32(-2000000000)},
      {"t.f32", Value::f32(-1.5e-5f)},
      {"t.bool.t", Value::boolean(true)},
      {"t.bool.f", Value::boolean(false)},
      {"t.str", Value::str("héllo\nworld")},
      {"t.str.empty", Value::str("")},
      {"t.u64", Value::u64(std::numeric_limits<uint64_t>::max())},
      {"t.i64", Value::i64(std::numeric_limits<int64_t>::min())},
      {"t.f64", Value::f64(3.141592653589793)},
      {"t.arr.str", Value::string_array({"a", "", "Ġthe", "<|im_start|>"})},
      {"t.arr.i32", Value::i32_array({-1, 0, 7, 2147483647})},
      {"t.arr.f32", Value::f32_array({0.5f, -2.25f, 1e30f})},
      {"t.arr.u8", Value::array(ValueType::U8, {Value::u8(1), Value::u8(255)})},
      {"t.arr.bool", Value::array(ValueType::BOOL, {Value::boolean(true), Value::boolean(false)})},
      {"t.arr.u64", Value::array(ValueType::U64, {Value::u64(1ull << 40)})},
      {"t.arr.f64", Value::array(ValueType::F64, {Value::f64(-0.125)})},
      {"t.arr.empty", Value::array(ValueType::I16, {})},
      {"t.arr.nested",
       Value::array(ValueType::ARRAY, {Value::i32_array({1, 2}), Value::string_array({"x"}),
                                       Value::array(ValueType::ARRAY, {Value::f32_array({9.f})}),
                                       Value::array(ValueType::U16, {})})},
  };
}

TEST(GgufRoundTrip, EveryValueType) {
  Writer w;
  const auto kv = every_value();
  for (const auto& [k, v] : kv) w.set(k, v);
  const auto f = reparse(w);
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ(f->metadata()[i].first, kv[i].first);  // file order kept
    EXPECT_TRUE(f->metadata()[i].second == kv[i].second) << kv[i].first;
  }
  EXPECT_TRUE(f->tensors().empty());
  // Writing back what was read gives the same bytes.
  Writer w2;
  for (const auto& [k, v] : f->metadata()) w2.set(k, v);
  EXPECT_EQ(w2.to_bytes(), w.to_bytes());
}

TEST(GgufRoundTrip, TypedAccessors) {
  Writer w;
  for (const auto& [k, v] : every_value()) w.set(k, v);
  const auto f = reparse(w);
  EXPECT_EQ(f->get_uint("t.u8"), 250u);
  EXPECT_EQ(f->get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(f->get_int("t.i8"), -128);
  EXPECT_EQ(f->get_int("t.u16"), 65535);  // unsigned that fits
  EXPECT_EQ(f->get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_FLOAT_EQ(static_cast<float>(f->get_float("t.f32")), -1.5e-5f);
  EXPECT_DOUBLE_EQ(f->get_float("t.f64"), 3.141592653589793);
  EXPECT_TRUE(f->get_bool("t.bool.t"));
  EXPECT_FALSE(f->get_bool("t.bool.f"));
  EXPECT_EQ(f->get_string("t.str"), "héllo\nworld");
  EXPECT_EQ(f->get_string_array("t.arr.str"),
            (std::vector<std::string>{"a", "", "Ġthe", "<|im_start|>"}));
  EXPECT_EQ(f->get_int_array("t.arr.i32"), (std::vector<int64_t>{-1, 0, 7, 2147483647}));
  EXPECT_EQ(f->get_int_array("t.arr.u8"), (std::vector<int64_t>{1, 255}));
  EXPECT_EQ(f->get_float_array("t.arr.f32"), (std::vector<float>{0.5f, -2.25f, 1e30f}));
  EXPECT_TRUE(f->get_int_array("t.arr.empty").empty());
  // Defaults apply only when absent.
  EXPECT_EQ(f->get_uint("nope", 7), 7u);
  EXPECT_EQ(f->get_string("nope", "d"), "d");
  EXPECT_EQ(f->get_uint("t.u8", 7), 250u);
  EXPECT_FALSE(f->has("nope"));
  // Absent without default, and wrong types, are Errors naming key and types.
  try {
    f->get_uint("llama.block_count");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'llama.block_count' is missing"), std::string::npos);
  }
  try {
    f->get_uint("t.str");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("mem.gguf"), std::string::npos) << m;
    EXPECT_NE(m.find("'t.str' at byte offset"), std::string::npos) << m;
    EXPECT_NE(m.find("has type string, expected an unsigned integer"), std::string::npos) << m;
  }
  EXPECT_THROW(f->get_uint("t.i8"), Error);    // negative
  EXPECT_THROW(f->get_int("t.u64"), Error);    // above 2^63
  EXPECT_THROW(f->get_float("t.u32"), Error);  // ints are not floats
  EXPECT_THROW(f->get_bool("t.u8"), Error);    // nor bools
  EXPECT_THROW(f->get_string_array("t.arr.i32"), Error);
  EXPECT_THROW(f->get_int_array("t.arr.f32"), Error);
  EXPECT_THROW(f->get_float_array("t.arr.str"), Error);
  EXPECT_THROW(f->get_int_array("t.arr.nested"), Error);
}

// Shape [2 blocks, 3 rows] of every type id GGUF knows.
TEST(GgufRoundTrip, EveryTensorType) {
  const uint32_t ids[] = {0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30};
  std::vector<std::vector<uint8_t>> datas;
  Writer w;
  w.set("general.architecture", Value::str("test"));
  for (uint32_t id : ids) {
    const TypeInfo* ti = type_info(id);
    ASSERT_NE(ti, nullptr) << id;
    const uint64_t n = row_bytes(*ti, 2 * ti->block_size) * 3;
    datas.push_back(random_bytes(n, id));
    w.add_tensor(cat("t.", ti->name), {uint64_t(2 * ti->block_size), 3}, ti->type,
                 datas.back().data(), n);
  }
  const auto bytes = w.to_bytes();
  const auto f = File::parse(bytes, "mem.gguf");
  ASSERT_EQ(f->tensors().size(), std::size(ids));
  EXPECT_EQ(f->data_offset() % 32, 0u);
  for (size_t i = 0; i < std::size(ids); ++i) {
    const TensorInfo& t = f->tensors()[i];
    const TypeInfo* ti = type_info(ids[i]);
    EXPECT_EQ(t.name, cat("t.", ti->name));
    EXPECT_EQ(static_cast<uint32_t>(t.type), ids[i]);
    EXPECT_EQ(t.n_dims, 2u);
    EXPECT_EQ(t.ne[0], uint64_t(2 * ti->block_size));
    EXPECT_EQ(t.ne[1], 3u);
    EXPECT_EQ(t.ne[2], 1u);
    EXPECT_EQ(t.n_elements(), uint64_t(6 * ti->block_size));
    EXPECT_EQ(t.nbytes, datas[i].size());
    EXPECT_EQ(t.offset % 32, 0u);
    ASSERT_NE(t.data, nullptr);
    EXPECT_EQ(std::memcmp(t.data, datas[i].data(), t.nbytes), 0) << ti->name;
    EXPECT_EQ(f->find_tensor(t.name), &t);
  }
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
}

TEST(GgufRoundTrip, HonoursAlignmentAndZeroPads) {
  for (uint32_t align : {1u, 8u, 64u, 4096u}) {
    Writer w;
    w.set("general.alignment", Value::u32(align));
    const auto a = random_bytes(4 * 5, 1);  // f32 [5]: 20 bytes, so the next tensor needs padding
    const auto b = random_bytes(4 * 3 * 2 * 2, 2);
    w.add_tensor("a", {5}, GgmlType::F32, a.data(), a.size());
    w.add_tensor("b", {3, 2, 2}, GgmlType::F32, b.data(), b.size());
    const auto bytes = w.to_bytes();
    const auto f = File::parse(bytes, "mem.gguf");
    EXPECT_EQ(f->alignment(), align);
    EXPECT_EQ(f->data_offset() % align, 0u);
    const TensorInfo& tb = f->tensors()[1];
    EXPECT_EQ(tb.offset % align, 0u);
    EXPECT_EQ(tb.n_dims, 3u);
    EXPECT_EQ(std::memcmp(tb.data, b.data(), b.size()), 0);
    // Every byte between a's end and b's start (and after the tensor infos) is zero.
    const uint64_t a_end = f->data_offset() + 20;
    for (uint64_t i = a_end; i < f->data_offset() + tb.offset; ++i) EXPECT_EQ(bytes[i], 0) << i;
    EXPECT_EQ(bytes.size() % align, 0u);
  }
}

TEST(GgufRoundTrip, WriteStreamsTheSameBytes) {
  Writer w;
  for (const auto& [k, v] : every_value()) w.set(k, v);
  const auto d = random_bytes(18 * 4, 9);
  w.add_tensor("q", {64, 2}, GgmlType::Q4_0, d.data(), d.size());
  const auto path = std::filesystem::temp_directory_path() / "smolrt_test_write.gguf";
  w.write(path.string());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(disk, w.to_bytes());
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  const auto f = File::open(path.string());
  EXPECT_EQ(f->file_size(), disk.size());
  EXPECT_EQ(std::memcmp(f->find_tensor("q")->data, d.data(), d.size()), 0);
  std::filesystem::remove(path);
  EXPECT_THROW(w.write("/nonexistent-dir/x.gguf"), Error);
}

TEST(GgufRoundTrip, SetReplacesInPlaceAndRemove) {
  Writer w;
  w.set("a", Value::u32(1));
  w.set("b", Value::u32(2));
  w.set("a", Value::str("x"));
  w.remove("b");
  w.set("c", Value::boolean(true));
  const auto f = reparse(w);
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].first, "a");
  EXPECT_EQ(f->get_string("a"), "x");
  EXPECT_TRUE(f->get_bool("c"));
}

TEST(GgufRoundTrip, WriterRejectsBadInput) {
  const auto d = random_bytes(1024, 3);
  Writer w;
  w.add_tensor("x", {8}, GgmlType::F32, d.data(), 32);
  EXPECT_THROW(w.add_tensor("x", {8}, GgmlType::F32, d.data(), 32), Error);    // duplicate
  EXPECT_THROW(w.add_tensor("y", {8}, GgmlType::F32, d.data(), 31), Error);    // wrong size
  EXPECT_THROW(w.add_tensor("y", {33}, GgmlType::Q4_0, d.data(), 18), Error);  // not blocks
  EXPECT_THROW(w.add_tensor("y", {}, GgmlType::F32, d.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("y", {1, 1, 1, 1, 1}, GgmlType::F32, d.data(), 4), Error);
  EXPECT_THROW(w.add_tensor("y", {0}, GgmlType::F32, d.data(), 0), Error);
  EXPECT_THROW(w.add_tensor("y", {8}, static_cast<GgmlType>(4), d.data(), 32), Error);
  Writer bad_value;
  bad_value.set("k", Value{ValueType::U8, uint64_t{300}});
  EXPECT_THROW(bad_value.to_bytes(), Error);
  Writer bad_array;
  bad_array.set("k", Value::array(ValueType::U32, {Value::u32(1), Value::i32(2)}));
  EXPECT_THROW(bad_array.to_bytes(), Error);
  Writer bad_align;
  bad_align.set("general.alignment", Value::u32(48));
  EXPECT_THROW(bad_align.to_bytes(), Error);
}

}  // namespace
}  // namespace smolrt::gguf
