// GGUF reader: maps the file and parses header, metadata and tensor table with every length,
// count, offset and size checked against the file size before it is used (no allocation is sized
// by an unchecked count; all arithmetic is overflow-checked).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "gguf/gguf.h"

namespace smolrt::gguf {

// --- limits
// ---------------------------------------------------------------------------------------
namespace {
// Arrays nested deeper than this are refused (keeps recursion bounded on hostile input).
constexpr int kMaxDepth = 8;
// Elements in all metadata arrays of a file together (nested ones included). A 256K-token
// vocabulary with its scores, types and merges is ~2^20; 2^24 leaves ample room. Each element
// costs a Value (~48 bytes) however few bytes it takes on disk, so this caps what the metadata can
// make the reader allocate at ~800 MB plus the string bytes (which the file must hold), however
// many arrays a file declares.
constexpr uint64_t kMaxArrayItems = uint64_t{1} << 24;
// Smallest on-disk size of one kv pair (key length, empty key, type, u8 value) and one tensor info
// (name length, empty name, n_dims, one ne, type, offset): counts above remaining/min fail fast.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

std::string hex_bytes(const uint8_t* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

// Bounds-checked little-endian reads over [p, p + n). Every failure names the file, the field and
// the byte offset where the field starts.
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t n, const std::string& file) : p_(p), n_(n), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return n_ - pos_; }

  [[noreturn]] void bad(const std::string& field, uint64_t at, const std::string& problem) const {
    fail(file_, ": ", field, " at byte offset ", at, ": ", problem);
  }
  // `suffix` completes the field name; it is joined only when reporting (this runs per token).
  void need(uint64_t bytes, const std::string& field, const char* suffix = "") const {
    if (bytes > left()) {
      bad(field + suffix, pos_,
          cat("needs ", bytes, " bytes but the file ends at byte ", n_,
              "; the file is truncated (re-download or re-convert it)"));
    }
  }
  template <class T>
  T read(const std::string& field, const char* suffix = "") {
    need(sizeof(T), field, suffix);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));  // GGUF is little-endian, as is every supported host
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& field) {
    const uint64_t at = pos_;
    const uint64_t len = read<uint64_t>(field, " length");
    if (len > left()) {
      bad(field, at,
          cat("string length ", len, " exceeds the ", left(),
              " bytes left in the file; the file is truncated or the length is corrupt"));
    }
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  void seek(uint64_t to) { pos_ = to; }

 private:
  const uint8_t* p_;
  uint64_t n_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

// On-disk bytes of a scalar value type; 0 for STRING and ARRAY.
uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8:
    case ValueType::I8:
    case ValueType::BOOL:
      return 1;
    case ValueType::U16:
    case ValueType::I16:
      return 2;
    case ValueType::U32:
    case ValueType::I32:
    case ValueType::F32:
      return 4;
    case ValueType::U64:
    case ValueType::I64:
    case ValueType::F64:
      return 8;
    default:
      return 0;
  }
}

ValueType read_value_type(Cursor& c, const std::string& field) {
  const uint64_t at = c.pos();
  const uint32_t t = c.read<uint32_t>(field);
  if (t > static_cast<uint32_t>(ValueType::F64)) {
    c.bad(field, at, cat("unknown value type ", t, " (valid types are 0..12)"));
  }
  return static_cast<ValueType>(t);
}

Value read_value(Cursor& c, ValueType t, const std::string& field, int depth, uint64_t& budget);

// `budget`: array elements the rest of the file may still declare (kMaxArrayItems in all).
Value read_array(Cursor& c, const std::string& field, int depth, uint64_t& budget) {
  if (depth >= kMaxDepth) {
    c.bad(field, c.pos(),
          cat("arrays nested deeper than ", kMaxDepth, " levels are not supported"));
  }
  const ValueType elem = read_value_type(c, field + " element type");
  const uint64_t at = c.pos();
  const uint64_t count = c.read<uint64_t>(field + " element count");
  const uint64_t min_size = elem == ValueType::STRING  ? 8
                            : elem == ValueType::ARRAY ? 12
                                                       : scalar_size(elem);
  if (count > c.left() / min_size) {
    c.bad(field + " element count", at,
          cat("array of ", count, " ", value_type_name(elem), " elements needs at least ", min_size,
              " bytes each but only ", c.left(),
              " bytes are left; the file is truncated or the count is corrupt"));
  }
  if (count > budget) {
    c.bad(field + " element count", at,
          cat("array of ", count, " elements takes the metadata past smolrt's limit of ",
              kMaxArrayItems, " array elements in all (", kMaxArrayItems - budget,
              " before this one); the count is corrupt or the file is not a model smolrt can "
              "load"));
  }
  budget -= count;
  Array arr;
  arr.elem_type = elem;
  arr.items.reserve(count);
  if (elem == ValueType::ARRAY) {
    for (uint64_t i = 0; i < count; ++i) {
      arr.items.push_back(read_array(c, cat(field, "[", i, "]"), depth + 1, budget));
    }
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      arr.items.push_back(read_value(c, elem, field, depth + 1, budget));
    }
  }
  return Value{ValueType::ARRAY, std::move(arr)};
}

Value read_value(Cursor& c, ValueType t, const std::string& field, int depth, uint64_t& budget) {
  switch (t) {
    case ValueType::U8:
      return Value::u8(c.read<uint8_t>(field));
    case ValueType::I8:
      return Value::i8(c.read<int8_t>(field));
    case ValueType::U16:
      return Value::u16(c.read<uint16_t>(field));
    case ValueType::I16:
      return Value::i16(c.read<int16_t>(field));
    case ValueType::U32:
      return Value::u32(c.read<uint32_t>(field));
    case ValueType::I32:
      return Value::i32(c.read<int32_t>(field));
    case ValueType::F32:
      return Value::f32(c.read<float>(field));
    case ValueType::U64:
      return Value::u64(c.read<uint64_t>(field));
    case ValueType::I64:
      return Value::i64(c.read<int64_t>(field));
    case ValueType::F64:
      return Value::f64(c.read<double>(field));
    case ValueType::BOOL: {
      const uint64_t at = c.pos();
      const uint8_t b = c.read<uint8_t>(field);
      if (b > 1) c.bad(field, at, cat("bool holds ", int{b}, "; must be 0 or 1"));
      return Value::boolean(b != 0);
    }
    case ValueType::STRING:
      return Value{ValueType::STRING, c.read_string(field)};
    case ValueType::ARRAY:
      return read_array(c, field, depth, budget);
  }
  c.bad(field, c.pos(), "unknown value type");  // unreachable: types are checked on read
}

bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

}  // namespace

// --- the mapping
// ------------------------------------------------------------------------------------

struct File::Mapping {
  void* addr = nullptr;  // mmap'ed region (open) ...
  size_t len = 0;
  uint8_t* owned = nullptr;  // ... or a 64-byte aligned copy (parse)
  ~Mapping() {
    if (addr) munmap(addr, len);
    if (owned) ::operator delete[](owned, std::align_val_t{64});
  }
  const uint8_t* data() const { return owned ? owned : static_cast<const uint8_t*>(addr); }
};

File::~File() = default;

std::shared_ptr<File> File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    fail("cannot open '", path, "': ", std::strerror(errno), "; check the model path");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("'", path, "' is not a regular file; pass the path of a .gguf file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    fail(path, ": the file is empty (0 bytes); it is not a GGUF file (re-download it)");
  }
  void* addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) fail("cannot mmap '", path, "': ", std::strerror(err));
  std::shared_ptr<File> f(new File());
  f->map_ = std::make_unique<Mapping>();
  f->map_->addr = addr;
  f->map_->len = size;
  f->path_ = path;
  f->parse_all(f->map_->data(), size);
  return f;
}

std::shared_ptr<File> File::parse(std::span<const uint8_t> bytes, std::string name) {
  std::shared_ptr<File> f(new File());
  f->map_ = std::make_unique<Mapping>();
  if (!bytes.empty()) {
    f->map_->owned = static_cast<uint8_t*>(::operator new[](bytes.size(), std::align_val_t{64}));
    std::memcpy(f->map_->owned, bytes.data(), bytes.size());
  }
  f->path_ = std::move(name);
  f->parse_all(f->map_->data(), bytes.size());
  return f;
}

// --- parsing
// ----------------------------------------------------------------------------------------

void File::parse_all(const uint8_t* p, uint64_t n) {
  Cursor c(p, n, path_);
  size_ = n;

  // Header.
  if (n < 4 || std::memcmp(p, "GGUF", 4) != 0) {
    const size_t shown = n < 4 ? static_cast<size_t>(n) : 4;
    c.bad("magic", 0,
          cat("the file starts with [", hex_bytes(p, shown),
              "], not 'GGUF'; this is not a GGUF file", n < 4 ? " (or it is truncated)" : ""));
  }
  c.seek(4);
  version_ = c.read<uint32_t>("version");
  if (version_ == 0x02000000u || version_ == 0x03000000u) {
    c.bad("version", 4, "this is a big-endian GGUF file; smolrt reads little-endian files only");
  }
  if (version_ != 2 && version_ != 3) {
    c.bad("version", 4,
          cat("GGUF version ", version_,
              " is not supported (only 2 and 3); re-convert the model with a current llama.cpp"));
  }
  const uint64_t n_tensors_at = c.pos();
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv_at = c.pos();
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_kv > c.left() / kMinKvBytes) {
    c.bad("metadata count", n_kv_at,
          cat(n_kv, " key/value pairs cannot fit in the ", c.left(),
              " bytes left; the file is truncated or the count is corrupt"));
  }

  // Metadata.
  kv_.reserve(n_kv);
  kv_offsets_.reserve(n_kv);
  std::unordered_map<std::string, uint64_t> seen_keys;
  uint64_t array_budget = kMaxArrayItems;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.pos();
    std::string key = c.read_string(cat("metadata key #", i));
    const std::string field = cat("metadata '", key, "'");
    if (auto it = seen_keys.find(key); it != seen_keys.end()) {
      c.bad(field, at,
            cat("duplicate key (first defined at byte offset ", it->second,
                "); the file is corrupt"));
    }
    seen_keys.emplace(key, at);
    const ValueType t = read_value_type(c, field + " type");
    Value v = read_value(c, t, field, 0, array_budget);
    kv_.emplace_back(std::move(key), std::move(v));
    kv_offsets_.push_back(at);
  }

  // general.alignment.
  alignment_ = 32;
  for (size_t i = 0; i < kv_.size(); ++i) {
    if (kv_[i].first != "general.alignment") continue;
    const Value& a = kv_[i].second;
    const uint64_t* u = std::get_if<uint64_t>(&a.v);
    if (!u) type_error("general.alignment", "an unsigned integer");
    if (*u == 0 || (*u & (*u - 1)) != 0 || *u > kMaxAlignment) {
      c.bad("metadata 'general.alignment'", kv_offsets_[i],
            cat("alignment ", *u, " is not a power of two between 1 and ", kMaxAlignment,
                " (2^16, smolrt's limit); the file is corrupt, or re-convert it with the default "
                "alignment (32) or remove the general.alignment key"));
    }
    alignment_ = *u;
  }

  // Tensor infos.
  if (n_tensors > c.left() / kMinTensorInfoBytes) {
    c.bad("tensor count", n_tensors_at,
          cat(n_tensors, " tensor infos cannot fit in the ", c.left(),
              " bytes left; the file is truncated or the count is corrupt"));
  }
  tensors_.reserve(n_tensors);
  std::unordered_set<std::string> seen_names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    TensorInfo t;
    t.name = c.read_string(cat("tensor #", i, " name"));
    const std::string field = cat("tensor '", t.name, "'");
    if (!seen_names.insert(t.name).second) {
      c.bad(field, at, "duplicate tensor name; the file is corrupt");
    }
    const uint64_t dims_at = c.pos();
    t.n_dims = c.read<uint32_t>(field + " n_dims");
    if (t.n_dims == 0 || t.n_dims > 4) {
      c.bad(field + " n_dims", dims_at,
            cat("n_dims is ", t.n_dims, "; GGUF tensors have 1 to 4 dimensions"));
    }
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne_at = c.pos();
      t.ne[d] = c.read<uint64_t>(cat(field, " ne[", d, "]"));
      if (t.ne[d] == 0) c.bad(cat(field, " ne[", d, "]"), ne_at, "dimension is 0; must be >= 1");
      if (!mul_ok(n_el, t.ne[d], &n_el) || n_el > uint64_t{INT64_MAX}) {
        c.bad(cat(field, " ne[", d, "]"), ne_at,
              cat("dimension ", t.ne[d], " makes the element count overflow 2^63"));
      }
    }
    const uint64_t type_at = c.pos();
    const uint32_t type_id = c.read<uint32_t>(field + " type");
    const TypeInfo* ti = type_info(type_id);
    if (!ti) {
      c.bad(field + " type", type_at,
            cat("unknown ggml type id ", type_id,
                " (known: 0-3, 6-15, 30); the file is corrupt or needs a newer reader"));
    }
    t.type = ti->type;
    if (t.ne[0] % static_cast<uint64_t>(ti->block_size) != 0) {
      c.bad(field + " ne[0]", dims_at + 4,
            cat("ne[0] = ", t.ne[0], " is not a multiple of the ", ti->name, " block size ",
                ti->block_size));
    }
    uint64_t nbytes = t.ne[0] / ti->block_size * ti->block_bytes;
    for (uint32_t d = 1; d < 4; ++d) {
      if (!mul_ok(nbytes, t.ne[d], &nbytes)) {
        c.bad(field, at, "tensor byte size overflows 2^64; the dimensions are corrupt");
      }
    }
    t.nbytes = nbytes;
    const uint64_t off_at = c.pos();
    t.offset = c.read<uint64_t>(field + " offset");
    if (t.offset % alignment_ != 0) {
      c.bad(field + " offset", off_at,
            cat("data offset ", t.offset, " is not a multiple of the alignment ", alignment_,
                "; the file is corrupt"));
    }
    tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment after the tensor infos.
  const uint64_t info_end = c.pos();
  const uint64_t pad = (alignment_ - info_end % alignment_) % alignment_;
  data_offset_ = info_end + pad;  // info_end <= n < 2^63, pad < 2^16: no overflow
  for (TensorInfo& t : tensors_) {
    const bool fits = data_offset_ <= n && t.offset <= n - data_offset_ &&
                      t.nbytes <= n - data_offset_ - t.offset;
    if (!fits) {
      fail(path_, ": tensor '", t.name, "' data (offset ", t.offset, " + ", t.nbytes,
           " bytes after the data section at byte offset ", data_offset_,
           ") extends past the end of the file (", n,
           " bytes); the file is truncated or the offset is corrupt");
    }
    t.data = p + data_offset_ + t.offset;
  }
  std::vector<const TensorInfo*> order;
  order.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& a = *order[i - 1];
    const TensorInfo& b = *order[i];
    if (a.offset + a.nbytes > b.offset) {
      fail(path_, ": tensors '", a.name, "' (bytes ", data_offset_ + a.offset, " to ",
           data_offset_ + a.offset + a.nbytes, ") and '", b.name, "' (from byte offset ",
           data_offset_ + b.offset, ") overlap in the data section; the file is corrupt");
    }
  }
}

}  // namespace smolrt::gguf
