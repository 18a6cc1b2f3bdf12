// GGUF writer (version 3). One serializer feeds either a file stream (tensor data goes straight
// from the caller's buffers to disk, never held twice) or a byte vector.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace smolrt::gguf {

namespace {

using Put = std::function<void(const void*, size_t)>;

// Tracks the byte position so padding can be computed; writes zeros for padding.
class Out {
 public:
  explicit Out(Put put) : put_(std::move(put)) {}
  void bytes(const void* p, size_t n) {
    if (n) put_(p, n);
    pos_ += n;
  }
  template <class T>
  void pod(T v) {
    bytes(&v, sizeof v);
  }
  void str(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t align) {
    static const uint8_t kZeros[256] = {};
    uint64_t n = (align - pos_ % align) % align;
    while (n) {
      const size_t k = n < sizeof kZeros ? static_cast<size_t>(n) : sizeof kZeros;
      bytes(kZeros, k);
      n -= k;
    }
  }
  uint64_t pos() const { return pos_; }

 private:
  Put put_;
  uint64_t pos_ = 0;
};

// Writes one value's payload (not its type tag), checking that the held alternative matches the
// declared type and that integers fit it.
void put_value(Out& o, const Value& v, const std::string& key) {
  auto uns = [&](uint64_t max) -> uint64_t {
    const uint64_t* u = std::get_if<uint64_t>(&v.v);
    if (!u)
      fail("gguf writer: metadata '", key, "' is declared ", value_type_name(v.type),
           " but holds another kind of value");
    if (*u > max)
      fail("gguf writer: metadata '", key, "' value ", *u, " does not fit ",
           value_type_name(v.type));
    return *u;
  };
  auto sgn = [&](int64_t lo, int64_t hi) -> int64_t {
    const int64_t* i = std::get_if<int64_t>(&v.v);
    if (!i)
      fail("gguf writer: metadata '", key, "' is declared ", value_type_name(v.type),
           " but holds another kind of value");
    if (*i < lo || *i > hi)
      fail("gguf writer: metadata '", key, "' value ", *i, " does not fit ",
           value_type_name(v.type));
    return *i;
  };
  auto flt = [&]() -> double {
    const double* d = std::get_if<double>(&v.v);
    if (!d)
      fail("gguf writer: metadata '", key, "' is declared ", value_type_name(v.type),
           " but holds another kind of value");
    return *d;
  };
  switch (v.type) {
    case ValueType::U8:
      o.pod<uint8_t>(static_cast<uint8_t>(uns(UINT8_MAX)));
      return;
    case ValueType::I8:
      o.pod<int8_t>(static_cast<int8_t>(sgn(INT8_MIN, INT8_MAX)));
      return;
    case ValueType::U16:
      o.pod<uint16_t>(static_cast<uint16_t>(uns(UINT16_MAX)));
      return;
    case ValueType::I16:
      o.pod<int16_t>(static_cast<int16_t>(sgn(INT16_MIN, INT16_MAX)));
      return;
    case ValueType::U32:
      o.pod<uint32_t>(static_cast<uint32_t>(uns(UINT32_MAX)));
      return;
    case ValueType::I32:
      o.pod<int32_t>(static_cast<int32_t>(sgn(INT32_MIN, INT32_MAX)));
      return;
    case ValueType::U64:
      o.pod<uint64_t>(uns(UINT64_MAX));
      return;
    case ValueType::I64:
      o.pod<int64_t>(sgn(INT64_MIN, INT64_MAX));
      return;
    case ValueType::F32:
      o.pod<float>(static_cast<float>(flt()));
      return;
    case ValueType::F64:
      o.pod<double>(flt());
      return;
    case ValueType::BOOL: {
      const bool* b = std::get_if<bool>(&v.v);
      if (!b) fail("gguf writer: metadata '", key, "' is declared bool but holds another value");
      o.pod<uint8_t>(*b ? 1 : 0);
      return;
    }
    case ValueType::STRING: {
      const std::string* s = std::get_if<std::string>(&v.v);
      if (!s) fail("gguf writer: metadata '", key, "' is declared string but holds another value");
      o.str(*s);
      return;
    }
    case ValueType::ARRAY: {
      const Array* a = std::get_if<Array>(&v.v);
      if (!a) fail("gguf writer: metadata '", key, "' is declared array but holds another value");
      o.pod<uint32_t>(static_cast<uint32_t>(a->elem_type));
      o.pod<uint64_t>(a->items.size());
      for (const Value& x : a->items) {
        if (x.type != a->elem_type) {
          fail("gguf writer: metadata '", key, "' is an array of ", value_type_name(a->elem_type),
               " but holds a ", value_type_name(x.type), " element");
        }
        put_value(o, x, key);
      }
      return;
    }
  }
  fail("gguf writer: metadata '", key, "' has unknown value type ", static_cast<uint32_t>(v.type));
}

}  // namespace

// --- building
// -------------------------------------------------------------------------------------

void Writer::set(std::string key, Value v) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(v);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(v));
}

void Writer::remove(std::string_view key) {
  std::erase_if(kv_, [&](const auto& kv) { return kv.first == key; });
}

void Writer::add_tensor(std::string name, std::vector<uint64_t> ne, GgmlType type, const void* data,
                        uint64_t nbytes) {
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) fail("gguf writer: tensor '", name, "' added twice");
  }
  const TypeInfo* ti = type_info(type);
  if (!ti) fail("gguf writer: tensor '", name, "' has unknown type id ", uint32_t(type));
  if (ne.empty() || ne.size() > 4) {
    fail("gguf writer: tensor '", name, "' has ", ne.size(), " dimensions; GGUF allows 1 to 4");
  }
  uint64_t expect = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] == 0) fail("gguf writer: tensor '", name, "' ne[", d, "] is 0");
    const uint64_t f = d == 0 ? ne[0] / ti->block_size * ti->block_bytes : ne[d];
    if (d == 0 && ne[0] % ti->block_size != 0) {
      fail("gguf writer: tensor '", name, "' ne[0] = ", ne[0], " is not a multiple of the ",
           ti->name, " block size ", ti->block_size);
    }
    if (__builtin_mul_overflow(expect, f, &expect)) {
      fail("gguf writer: tensor '", name, "' byte size overflows");
    }
  }
  if (nbytes != expect) {
    fail("gguf writer: tensor '", name, "' was given ", nbytes, " bytes but a ", ti->name,
         " tensor of that shape holds ", expect);
  }
  if (!data) fail("gguf writer: tensor '", name, "' has no data");
  tensors_.push_back({std::move(name), std::move(ne), type, data, nbytes});
}

// --- serializing
// ----------------------------------------------------------------------------------

namespace {

uint64_t writer_alignment(const std::vector<std::pair<std::string, Value>>& kv) {
  for (const auto& [k, v] : kv) {
    if (k != "general.alignment") continue;
    const uint64_t* u = std::get_if<uint64_t>(&v.v);
    if (!u || *u == 0 || (*u & (*u - 1)) != 0 || *u > kMaxAlignment) {
      fail("gguf writer: general.alignment must be an unsigned power of two up to ", kMaxAlignment,
           " (2^16)");
    }
    return *u;
  }
  return 32;
}

template <class Tensors, class KV>
void serialize(Out& o, const KV& kv, const Tensors& tensors) {
  const uint64_t align = writer_alignment(kv);
  o.bytes("GGUF", 4);
  o.pod<uint32_t>(3);
  o.pod<uint64_t>(tensors.size());
  o.pod<uint64_t>(kv.size());
  for (const auto& [k, v] : kv) {
    o.str(k);
    o.pod<uint32_t>(static_cast<uint32_t>(v.type));
    put_value(o, v, k);
  }
  std::vector<uint64_t> offsets;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    off += (align - off % align) % align;
    offsets.push_back(off);
    o.str(t.name);
    o.pod<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t n : t.ne) o.pod<uint64_t>(n);
    o.pod<uint32_t>(static_cast<uint32_t>(t.type));
    o.pod<uint64_t>(off);
    off += t.nbytes;
  }
  o.pad_to(align);
  const uint64_t data_start = o.pos();
  for (size_t i = 0; i < tensors.size(); ++i) {
    o.pad_to(align);  // data_start is aligned, so this lands on data_start + offsets[i]
    if (o.pos() != data_start + offsets[i]) fail("gguf writer: internal offset mismatch");
    o.bytes(tensors[i].data, tensors[i].nbytes);
  }
  if (!tensors.empty()) o.pad_to(align);
}

}  // namespace

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out;
  Out o([&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  });
  serialize(o, kv_, tensors_);
  return out;
}

void Writer::write(const std::string& path) const {
  // Write beside the target and rename, so a failed write never leaves a half file at `path`.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create '", tmp, "': ", std::strerror(errno), "; check the output path");
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  try {
    Out o([&](const void* p, size_t n) {
      if (std::fwrite(p, 1, n, f) != n) {
        fail("writing '", tmp, "' failed: ", std::strerror(errno), " (disk full?)");
      }
    });
    serialize(o, kv_, tensors_);
    if (std::fclose(f) != 0) {
      f = nullptr;
      fail("closing '", tmp, "' failed: ", std::strerror(errno), " (disk full?)");
    }
    f = nullptr;
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) fail("cannot rename '", tmp, "' to '", path, "': ", ec.message());
  } catch (...) {
    if (f) std::fclose(f);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace smolrt::gguf
