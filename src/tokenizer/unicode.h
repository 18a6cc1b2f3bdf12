// Unicode helpers for the tokenizers: UTF-8 decoding that never fails (invalid bytes become
// one-byte "raw byte" code points), the character classes the pre-tokenizer regexes use (from
// utf8proc's category tables, never hand-typed ones), and GPT-2's byte <-> printable code point
// map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace smolrt::unicode {

// The classes `\p{L}`, `\p{N}`, `\s` and "anything else" of the GPT-2 pre-tokenizer pattern.
enum class CharClass : uint8_t {
  Letter,  // general category L* (Lu Ll Lt Lm Lo)
  Number,  // N* (Nd Nl No)
  Space,   // White_Space: U+0009..U+000D, U+0085 and categories Zs, Zl, Zp
  Other,   // everything else, including combining marks and invalid bytes
};

// First code point used for an invalid UTF-8 byte b: kRawByteBase + b (outside Unicode).
inline constexpr uint32_t kRawByteBase = 0x110000;

// One decoded character: its code point (or kRawByteBase + byte), class, and bytes in the input.
struct Char {
  uint32_t cp;
  CharClass cls;
  uint32_t offset;  // byte offset of the character in the decoded text
  uint8_t len;      // 1..4 bytes
};

CharClass char_class(uint32_t cp);

// Length of the well-formed UTF-8 sequence at s[0..n) (1..4), or 0 when it is not well-formed
// (bad lead byte, bad continuation, overlong, surrogate, > U+10FFFF, or truncated). Sets *cp.
int utf8_decode_one(const unsigned char* s, size_t n, uint32_t* cp);

// Decodes `text` into `out` (cleared first). Every byte of the input belongs to exactly one Char.
void decode_utf8(std::string_view text, std::vector<Char>& out);

// Appends the UTF-8 encoding of a code point (< 0x110000) to `out`.
void append_utf8(uint32_t cp, std::string& out);

// Number of bytes at the end of `s` that form the start of a well-formed but incomplete UTF-8
// sequence (0..3): the bytes a streaming decoder must hold back until more arrive.
size_t incomplete_utf8_tail(std::string_view s);

// GPT-2's reversible byte <-> code point map: printable bytes map to themselves, the other 68
// (controls, space, 0x7F-0xA0, 0xAD) to U+0100.. in byte order (space -> U+0120 'Ġ').
uint32_t byte_to_cp(uint8_t b);
// The byte for a mapped code point, or -1 when `cp` is not in the map.
int cp_to_byte(uint32_t cp);
// The UTF-8 text of byte_to_cp(b), precomputed (1 or 2 bytes).
const std::string& byte_to_utf8(uint8_t b);

}  // namespace smolrt::unicode
