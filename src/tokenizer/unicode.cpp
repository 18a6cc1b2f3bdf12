#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <array>

namespace smolrt::unicode {

CharClass char_class(uint32_t cp) {
  if (cp >= 0x110000) return CharClass::Other;  // raw invalid byte
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return CharClass::Space;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::Letter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::Number;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return CharClass::Space;
    default:
      return CharClass::Other;
  }
}

namespace {

// Classes of the 128 ASCII code points, computed once from utf8proc (the hot path for prose).
const std::array<CharClass, 128>& ascii_classes() {
  static const std::array<CharClass, 128> t = [] {
    std::array<CharClass, 128> a{};
    for (uint32_t c = 0; c < 128; ++c) a[c] = char_class(c);
    return a;
  }();
  return t;
}

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 512> from_cp{};  // every mapped code point is < 0x144
};

const ByteMap& byte_map() {
  static const ByteMap m = [] {
    ByteMap bm;
    bm.from_cp.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      bm.to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      bm.from_cp[bm.to_cp[b]] = static_cast<int16_t>(b);
      append_utf8(bm.to_cp[b], bm.to_utf8[b]);
    }
    return bm;
  }();
  return m;
}

}  // namespace

int utf8_decode_one(const unsigned char* s, size_t n, uint32_t* cp) {
  const unsigned char c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int len;
  uint32_t v, min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < static_cast<size_t>(len)) return 0;
  for (int i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

void decode_utf8(std::string_view text, std::vector<Char>& out) {
  out.clear();
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const auto& ascii = ascii_classes();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      out.push_back({s[i], ascii[s[i]], static_cast<uint32_t>(i), 1});
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const int len = utf8_decode_one(s + i, n - i, &cp);
    if (len == 0) {
      out.push_back({kRawByteBase + s[i], CharClass::Other, static_cast<uint32_t>(i), 1});
      ++i;
    } else {
      out.push_back({cp, char_class(cp), static_cast<uint32_t>(i), static_cast<uint8_t>(len)});
      i += static_cast<size_t>(len);
    }
  }
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t incomplete_utf8_tail(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  // A lead byte within the last 3 bytes whose sequence runs past the end, followed only by
  // continuation bytes that are valid so far.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = p[n - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for the lead
    size_t need;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 4;
    } else {
      return 0;
    }
    if (need <= back) return 0;  // complete (or malformed): nothing to hold
    // Check the second byte's range restrictions (overlong / surrogate / > U+10FFFF).
    if (back >= 2) {
      const unsigned char c1 = p[n - back + 1];
      if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
          (c == 0xF4 && c1 > 0x8F)) {
        return 0;
      }
    }
    return back;
  }
  return 0;
}

uint32_t byte_to_cp(uint8_t b) {
  return byte_map().to_cp[b];
}

int cp_to_byte(uint32_t cp) {
  return cp < 512 ? byte_map().from_cp[cp] : -1;
}

const std::string& byte_to_utf8(uint8_t b) {
  return byte_map().to_utf8[b];
}

}  // namespace smolrt::unicode
