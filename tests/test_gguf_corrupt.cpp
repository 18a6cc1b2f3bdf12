// Corrupted GGUF files: truncations at many offsets, huge lengths and counts, bad type ids,
// misaligned / overlapping / out-of-file tensors, duplicates, bad dims. Each must throw ONE
// smolrt::Error with the right message (naming the file) — never crash, never allocate wildly.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "gguf/gguf.h"
#include "test_util.h"

namespace smolrt::gguf {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), {});
}

// Offset of the first occurrence of a GGUF string (u64 length + bytes) equal to s: the offset of
// its length field. Fails the test when absent.
size_t find_gguf_string(const Bytes& b, const std::string& s) {
  Bytes pat(8 + s.size());
  const uint64_t n = s.size();
  std::memcpy(pat.data(), &n, 8);
  std::memcpy(pat.data() + 8, s.data(), s.size());
  auto it = std::search(b.begin(), b.end(), pat.begin(), pat.end());
  EXPECT_NE(it, b.end()) << "string not found: " << s;
  return static_cast<size_t>(it - b.begin());
}

template <class T>
void poke(Bytes& b, size_t at, T v) {
  ASSERT_LE(at + sizeof(T), b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// Byte offsets of a tensor info's fields, found by its name.
struct InfoAt {
  size_t n_dims, ne, type, offset;
};
InfoAt tensor_info_at(const Bytes& b, const std::string& name) {
  const size_t p = find_gguf_string(b, name) + 8 + name.size();
  uint32_t n_dims;
  std::memcpy(&n_dims, b.data() + p, 4);
  return {p, p + 4, p + 4 + 8 * n_dims, p + 4 + 8 * n_dims + 4};
}

// Parsing must throw Error whose message holds `sub` and the file name.
void expect_error(const Bytes& b, const std::string& sub, const std::string& what = "") {
  try {
    File::parse(b, "bad.gguf");
    ADD_FAILURE() << what << ": parsed without error, expected '" << sub << "'";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(sub), std::string::npos) << what << ": " << m;
    EXPECT_NE(m.find("bad.gguf"), std::string::npos) << what << ": " << m;
  }
}

// Hand-built GGUF bytes (host byte order, little-endian on every target smolrt builds for).
struct RawGguf {
  Bytes b;
  void put(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
  void u32(uint32_t v) { put(&v, 4); }
  void u64(uint64_t v) { put(&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    put(s.data(), s.size());
  }
  // Magic, version 3 and the two counts.
  void header(uint64_t n_tensors, uint64_t n_kv) {
    put("GGUF", 4);
    u32(3);
    u64(n_tensors);
    u64(n_kv);
  }
};

#define REQUIRE_STORIES(b)                                   \
  REQUIRE_FIXTURE(stories_path_, "models/stories260K.gguf"); \
  Bytes b = read_all(stories_path_)

// --- truncation
// -----------------------------------------------------------------------------------

TEST(GgufCorrupt, StoriesTruncatedAnywhere) {
  REQUIRE_STORIES(full);
  const auto f = File::parse(full, "ok.gguf");
  const size_t header_end = f->data_offset();
  size_t checked = 0;
  // Every offset through the header, metadata, tensor table and padding; a sample of the data.
  for (size_t n = 0; n < full.size(); n += (n <= header_end ? 1 : 997)) {
    Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      File::parse(cut, "bad.gguf");
      ADD_FAILURE() << "truncated at " << n << ": no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      ASSERT_NE(m.find("truncated"), std::string::npos) << "cut at " << n << ": " << m;
      ASSERT_NE(m.find("byte offset"), std::string::npos) << "cut at " << n << ": " << m;
    }
    ++checked;
  }
  EXPECT_GT(checked, header_end);
}

TEST(GgufCorrupt, VocabFilesTruncatedSampled) {
  for (const char* rel : {"vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-starcoder.gguf",
                          "vocab/ggml-vocab-llama-spm.gguf"}) {
    REQUIRE_FIXTURE(path, rel);
    const Bytes full = read_all(path);
    // Every offset in the first 2 KiB (header and first keys), then ~150 samples of the rest.
    const size_t step = full.size() / 150 + 1;
    for (size_t n = 0; n < full.size(); n += (n < 2048 ? 1 : step)) {
      Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
      expect_error(cut, "truncated", cat(rel, " cut at ", n));
    }
  }
}

// --- header
// ---------------------------------------------------------------------------------------

TEST(GgufCorrupt, BadMagicVersionAndCounts) {
  REQUIRE_STORIES(b);
  Bytes m = b;
  m[0] = 'X';
  expect_error(m, "not 'GGUF'");
  expect_error(Bytes(), "magic at byte offset 0");
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    Bytes x = b;
    poke<uint32_t>(x, 4, v);
    expect_error(x, cat("GGUF version ", v, " is not supported"));
  }
  Bytes v2 = b;  // version 2 has the same layout (u64 counts) and is accepted
  poke<uint32_t>(v2, 4, 2);
  EXPECT_EQ(File::parse(v2, "v2.gguf")->version(), 2u);
  EXPECT_EQ(File::parse(v2, "v2.gguf")->tensors().size(), 48u);
  Bytes be = b;
  poke<uint32_t>(be, 4, 0x03000000u);
  expect_error(be, "big-endian");
  Bytes kv = b;
  poke<uint64_t>(kv, 16, uint64_t{1} << 60);
  expect_error(kv, "metadata count at byte offset 16");
  Bytes nt = b;
  poke<uint64_t>(nt, 8, uint64_t{1} << 60);
  expect_error(nt, "tensor count at byte offset 8");
  Bytes nt_max = b;
  poke<uint64_t>(nt_max, 8, ~uint64_t{0});
  expect_error(nt_max, "the count is corrupt");
}

// --- metadata
// -------------------------------------------------------------------------------------

TEST(GgufCorrupt, HugeLengthsAndCounts) {
  REQUIRE_STORIES(b);
  // First key's length.
  Bytes k = b;
  poke<uint64_t>(k, 24, uint64_t{1} << 62);
  expect_error(k, "metadata key #0 at byte offset 24: string length 4611686018427387904 exceeds");
  // The token array's count: 2^60 strings must fail fast, not allocate.
  const size_t key = find_gguf_string(b, "tokenizer.ggml.tokens");
  const size_t count_at = key + 8 + 21 + 4 + 4;
  for (uint64_t n : {uint64_t{1} << 60, ~uint64_t{0}, uint64_t{1} << 32}) {
    Bytes a = b;
    poke<uint64_t>(a, count_at, n);
    expect_error(a, cat("metadata 'tokenizer.ggml.tokens' element count at byte offset ", count_at),
                 cat("count ", n));
  }
  // The first token string's length.
  Bytes s = b;
  poke<uint64_t>(s, count_at + 8, uint64_t{1} << 61);
  expect_error(s, "string length 2305843009213693952 exceeds");
  // The scores array's element type and value type out of range.
  const size_t scores = find_gguf_string(b, "tokenizer.ggml.scores");
  Bytes et = b;
  poke<uint32_t>(et, scores + 8 + 21 + 4, 13);
  expect_error(et, "unknown value type 13");
  Bytes vt = b;
  poke<uint32_t>(vt, scores + 8 + 21, 0xdeadbeef);
  expect_error(vt, "unknown value type 3735928559");
}

// Small files built with the Writer, patched in place.
Bytes tiny_file() {
  static const float data[64] = {1.f, 2.f, 3.f};
  Writer w;
  w.set("k.aaa", Value::u32(1));
  w.set("k.bbb", Value::boolean(true));
  w.set("general.alignment", Value::u32(32));
  w.add_tensor("t.a", {64}, GgmlType::Q4_0, data, 36);
  w.add_tensor("t.b", {16}, GgmlType::F32, data, 64);
  return w.to_bytes();
}

TEST(GgufCorrupt, WriterBaseFileParses) {
  const auto f = File::parse(tiny_file(), "ok.gguf");
  EXPECT_EQ(f->tensors().size(), 2u);
}

TEST(GgufCorrupt, DuplicatesBadBoolBadAlignment) {
  const Bytes b = tiny_file();
  Bytes dk = b;
  std::memcpy(dk.data() + find_gguf_string(b, "k.bbb") + 8, "k.aaa", 5);
  expect_error(dk, "duplicate key");
  Bytes dt = b;
  std::memcpy(dt.data() + find_gguf_string(b, "t.b") + 8, "t.a", 3);
  expect_error(dt, "tensor 't.a' at byte offset");
  expect_error(dt, "duplicate tensor name");
  Bytes bb = b;
  poke<uint8_t>(bb, find_gguf_string(b, "k.bbb") + 8 + 5 + 4, 2);
  expect_error(bb, "bool holds 2; must be 0 or 1");
  const size_t al = find_gguf_string(b, "general.alignment") + 8 + 17 + 4;
  for (uint32_t a : {0u, 48u, 3u}) {
    Bytes x = b;
    poke<uint32_t>(x, al, a);
    expect_error(x, cat("alignment ", a, " is not a power of two"));
  }
  Bytes at = b;
  poke<uint32_t>(at, al - 4, static_cast<uint32_t>(ValueType::STRING));
  expect_error(at, "string length");  // u32 32 + next bytes read as a string length: garbage
}

// A few hundred bytes declaring general.alignment = 2^30 and no tensors used to parse; writing it
// back (fuzz/fuzz_gguf.cpp's round trip) padded the header to 1 GiB and libFuzzer ran out of
// memory. The reader now refuses alignments above kMaxAlignment, naming the key and the fix.
Bytes crafted_alignment_file(ValueType type, uint64_t align) {
  RawGguf g;
  g.header(0, 3);
  g.str("general.architecture");
  g.u32(static_cast<uint32_t>(ValueType::STRING));
  g.str("llama");
  g.str("general.alignment");
  g.u32(static_cast<uint32_t>(type));
  if (type == ValueType::U64) {
    g.u64(align);
  } else {
    g.u32(static_cast<uint32_t>(align));
  }
  g.str("general.name");
  g.u32(static_cast<uint32_t>(ValueType::STRING));
  g.str(std::string(358 - g.b.size() - 8, 'x'));
  return g.b;
}

TEST(GgufCorrupt, HugeAlignmentRefused) {
  const Bytes b = crafted_alignment_file(ValueType::U32, uint64_t{1} << 30);
  ASSERT_EQ(b.size(), 358u);
  const size_t key_at = find_gguf_string(b, "general.alignment");
  expect_error(b, cat("metadata 'general.alignment' at byte offset ", key_at,
                      ": alignment 1073741824 is not a power of two between 1 and 65536"));
  expect_error(b, "remove the general.alignment key");
  expect_error(crafted_alignment_file(ValueType::U64, uint64_t{1} << 17), "alignment 131072");
  expect_error(crafted_alignment_file(ValueType::U64, uint64_t{1} << 63), "alignment 9223372036");
  expect_error(crafted_alignment_file(ValueType::U32, 3 << 10), "alignment 3072 is not a power");
}

TEST(GgufCorrupt, WriteBackIsBoundedByTheFile) {
  // The largest accepted alignment: a zero-tensor file parses (its data section may start past the
  // end, as in llama.cpp's vocab-only files) and writing it back adds less than one alignment.
  for (const ValueType t : {ValueType::U32, ValueType::U64}) {
    const Bytes b = crafted_alignment_file(t, kMaxAlignment);
    const auto f = File::parse(b, "max.gguf");
    EXPECT_EQ(f->alignment(), kMaxAlignment);
    Writer w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    const Bytes out = w.to_bytes();
    EXPECT_EQ(out.size(), kMaxAlignment);
    EXPECT_LE(out.size(), b.size() + f->alignment());
    EXPECT_EQ(File::parse(out, "out.gguf")->metadata().size(), 3u);
  }
  Writer w;
  w.set("general.alignment", Value::u64(kMaxAlignment * 2));
  try {
    w.to_bytes();
    ADD_FAILURE() << "writer accepted alignment 2^17";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("power of two up to 65536"), std::string::npos)
        << e.what();
  }
}

TEST(GgufCorrupt, DeepNestingRefused) {
  RawGguf g;
  g.header(0, 1);
  g.str("k");
  g.u32(9);  // ARRAY
  for (int i = 0; i < 100; ++i) {
    g.u32(9);
    g.u64(1);
  }
  g.u32(0);
  g.u64(0);
  expect_error(g.b, "nested deeper than 8 levels");
}

TEST(GgufCorrupt, ArrayElementsBudgetIsPerFile) {
  // One array of arrays holding one u8 array of 2^24 elements: 2^24 + 1 elements in all, one more
  // than smolrt reads from a file's metadata. The file really holds the bytes (16 MiB), so only
  // the budget refuses it, before the 2^24 Values (~800 MB) are allocated.
  RawGguf g;
  g.header(0, 1);
  g.str("k");
  g.u32(9);  // ARRAY
  g.u32(9);  // of ARRAY
  g.u64(1);
  g.u32(0);  // of U8
  g.u64(uint64_t{1} << 24);
  Bytes& b = g.b;
  b.resize(b.size() + (size_t{1} << 24), 0);
  expect_error(b, "metadata 'k'[0] element count");
  expect_error(b, "past smolrt's limit of 16777216 array elements in all (1 before this one)");
}

// --- tensor table
// ---------------------------------------------------------------------------------

TEST(GgufCorrupt, TensorTypeIdsOutOfRange) {
  REQUIRE_STORIES(b);
  const InfoAt at = tensor_info_at(b, "token_embd.weight");
  for (uint32_t id : {4u, 5u, 16u, 29u, 31u, 99u, 0xffffffffu}) {
    Bytes x = b;
    poke<uint32_t>(x, at.type, id);
    expect_error(x, cat("tensor 'token_embd.weight' type at byte offset ", at.type,
                        ": unknown ggml type id ", id));
  }
}

TEST(GgufCorrupt, TensorDims) {
  REQUIRE_STORIES(b);
  const InfoAt at = tensor_info_at(b, "blk.0.attn_q.weight");
  Bytes nd = b;
  poke<uint32_t>(nd, at.n_dims, 5);
  expect_error(nd, "n_dims is 5; GGUF tensors have 1 to 4 dimensions");
  Bytes n0 = b;
  poke<uint32_t>(n0, at.n_dims, 0);
  expect_error(n0, "n_dims is 0");
  Bytes z = b;
  poke<uint64_t>(z, at.ne + 8, 0);
  expect_error(z, "'blk.0.attn_q.weight' ne[1] at byte offset");
  expect_error(z, "dimension is 0");
  Bytes ov = b;
  poke<uint64_t>(ov, at.ne, uint64_t{1} << 62);
  poke<uint64_t>(ov, at.ne + 8, 4);
  expect_error(ov, "overflow");
  Bytes big = b;
  poke<uint64_t>(big, at.ne + 8, uint64_t{1} << 40);
  expect_error(big, "extends past the end of the file");
  // ne[0] not a multiple of the block size: make the tensor q8_0 with ne[0] = 64 -> 48.
  Bytes blk = b;
  poke<uint32_t>(blk, at.type, 8);
  poke<uint64_t>(blk, at.ne, 48);
  expect_error(blk, "ne[0] = 48 is not a multiple of the q8_0 block size 32");
  expect_error(blk, cat("'blk.0.attn_q.weight' ne[0] at byte offset ", at.ne));
}

TEST(GgufCorrupt, TensorOffsets) {
  REQUIRE_STORIES(b);
  const auto f = File::parse(b, "ok.gguf");
  const TensorInfo& first = f->tensors()[0];
  const TensorInfo& second = f->tensors()[1];
  const InfoAt at = tensor_info_at(b, second.name);
  Bytes mis = b;
  poke<uint64_t>(mis, at.offset, second.offset + 4);
  expect_error(mis, cat("'", second.name, "' offset at byte offset ", at.offset, ": data offset ",
                        second.offset + 4, " is not a multiple of the alignment"));
  Bytes over = b;
  poke<uint64_t>(over, at.offset, first.offset);
  expect_error(over, "overlap in the data section");
  expect_error(over, cat("(from byte offset ", f->data_offset() + first.offset, ")"));
  Bytes past = b;
  poke<uint64_t>(past, at.offset, ~uint64_t{31});
  expect_error(past, "extends past the end of the file");
  Bytes edge = b;  // ends one aligned step beyond the file
  const uint64_t last = (b.size() - f->data_offset()) / 32 * 32;
  poke<uint64_t>(edge, at.offset, last);
  expect_error(edge, cat("tensor '", second.name, "' data (offset ", last));
}

TEST(GgufCorrupt, OpenRejectsEmptyMissingAndDirectories) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto empty = dir / "smolrt_empty.gguf";
  { std::ofstream(empty.string()); }
  try {
    File::open(empty.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
  std::filesystem::remove(empty);
  EXPECT_THROW(File::open((dir / "smolrt_missing_x.gguf").string()), Error);
  EXPECT_THROW(File::open(dir.string()), Error);
}

// Random byte flips in the header region never crash (Error or success are both fine).
TEST(GgufCorrupt, RandomFlipsNeverCrash) {
  REQUIRE_STORIES(b);
  const auto f = File::parse(b, "ok.gguf");
  std::mt19937 rng(7);
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    Bytes x = b;
    for (int k = 0; k < 4; ++k) {
      x[rng() % f->data_offset()] = static_cast<uint8_t>(rng());
    }
    try {
      File::parse(x, "bad.gguf");
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace smolrt::gguf
