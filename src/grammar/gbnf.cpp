// The GBNF parser (grammar.h): recursive descent over the text, errors with line and column.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar.h"
#include "tokenizer/unicode.h"

namespace smolrt::grammar {

namespace {

constexpr int kMaxDepth = 256;
constexpr int kMaxRepeat = 10000;

// A character for an error message: itself when printable ASCII, else its byte value (messages
// end up in JSON error bodies, which must stay valid UTF-8).
std::string describe(char c) {
  const auto b = static_cast<unsigned char>(c);
  if (b >= 0x20 && b < 0x7F) return cat("'", c, "'");
  return cat("byte 0x", "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15]);
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src) {}

  Grammar parse(std::string_view root) {
    skip_space(true);
    while (!eof()) {
      parse_rule();
      skip_space(true);
    }
    for (size_t i = 0; i < g_.rules.size(); ++i) {
      if (!defined_[i]) {
        pos_ = first_use_[i];
        fail_here(cat("rule '", g_.rules[i].name, "' is used but never defined"));
      }
    }
    g_.root = g_.find(root);
    if (g_.root < 0) {
      throw GrammarError(
          cat("grammar: there is no rule named '", root, "' (the rule generation starts from)"));
    }
    return std::move(g_);
  }

 private:
  std::string_view src_;
  size_t pos_ = 0;
  Grammar g_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;

  bool eof() const { return pos_ >= src_.size(); }
  char peek() const { return eof() ? '\0' : src_[pos_]; }

  [[noreturn]] void fail_here(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError(cat("grammar: line ", line, ", column ", col, ": ", what));
  }

  // Skips blanks and # comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!eof()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  int rule_index(const std::string& name, size_t at) {
    const int i = g_.find(name);
    if (i >= 0) return i;
    g_.rules.push_back({name, lit("")});
    defined_.push_back(false);
    first_use_.push_back(at);
    return static_cast<int>(g_.rules.size()) - 1;
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!eof() && is_name_char(src_[pos_])) ++pos_;
    return std::string(src_.substr(start, pos_ - start));
  }

  void parse_rule() {
    const size_t at = pos_;
    const std::string name = parse_name();
    if (name.empty()) fail_here(cat("expected a rule name, found ", describe(peek())));
    skip_space(false);
    if (src_.substr(pos_, 3) != "::=")
      fail_here(cat("expected '::=' after rule name '", name, "'"));
    pos_ += 3;
    skip_space(true);
    const int id = rule_index(name, at);
    if (defined_[static_cast<size_t>(id)]) {
      pos_ = at;
      fail_here(cat("rule '", name, "' is defined twice"));
    }
    defined_[static_cast<size_t>(id)] = true;
    Expr body = parse_alternates(false, 0);
    skip_space(false);
    if (!eof() && peek() != '\n')
      fail_here(cat("unexpected ", describe(peek()), " after the rule"));
    g_.rules[static_cast<size_t>(id)].body = std::move(body);
  }

  Expr parse_alternates(bool nested, int depth) {
    std::vector<Expr> items;
    items.push_back(parse_sequence(nested, depth));
    while (true) {
      if (!nested) {  // a line starting with | continues the rule
        const size_t save = pos_;
        skip_space(true);
        if (peek() != '|') {
          pos_ = save;
          break;
        }
      }
      if (peek() != '|') break;
      ++pos_;
      skip_space(true);
      items.push_back(parse_sequence(nested, depth));
    }
    return alt(std::move(items));
  }

  Expr parse_sequence(bool nested, int depth) {
    std::vector<Expr> items;
    while (true) {
      skip_space(nested);
      const char c = peek();
      if (eof() || c == '|' || c == ')' || c == '\n') break;
      Expr e = parse_primary(depth);
      int d = depth;
      while (true) {
        const char p = peek();
        int lo = 0, hi = 0;
        if (p == '*') {
          hi = kUnbounded;
        } else if (p == '+') {
          lo = 1;
          hi = kUnbounded;
        } else if (p == '?') {
          hi = 1;
        } else if (p == '{') {
          parse_braces(lo, hi);
        } else {
          break;
        }
        if (p != '{') ++pos_;
        if (++d > kMaxDepth) fail_here(cat("expression nested deeper than ", kMaxDepth));
        e = repeat(std::move(e), lo, hi);
      }
      items.push_back(std::move(e));
    }
    if (items.empty()) return lit("");
    return seq(std::move(items));
  }

  int parse_count() {
    const size_t start = pos_;
    long v = 0;
    while (!eof() && src_[pos_] >= '0' && src_[pos_] <= '9') {
      v = v * 10 + (src_[pos_] - '0');
      ++pos_;
      if (v > kMaxRepeat) {
        pos_ = start;
        fail_here(cat("repetition count above the limit of ", kMaxRepeat));
      }
    }
    return pos_ == start ? -2 : static_cast<int>(v);
  }

  // {m} {m,} {m,n} {,n}
  void parse_braces(int& lo, int& hi) {
    const size_t open = pos_++;
    skip_space(false);
    int m = parse_count();
    skip_space(false);
    if (peek() == '}') {
      if (m < 0) fail_here("expected a count in {m}");
      lo = hi = m;
    } else if (peek() == ',') {
      ++pos_;
      skip_space(false);
      const int n = parse_count();
      skip_space(false);
      if (peek() != '}') fail_here("expected '}' to close the repetition count");
      if (m == -2 && n == -2) fail_here("{,} needs at least one count");
      lo = m == -2 ? 0 : m;
      hi = n == -2 ? kUnbounded : n;
      if (hi != kUnbounded && hi < lo) {
        pos_ = open;
        fail_here(cat("repetition {", lo, ",", hi, "} has max below min"));
      }
    } else {
      fail_here("expected a repetition count like {2}, {2,}, {2,5} or {,5}");
    }
    ++pos_;
  }

  // One code point of a literal or class, escapes decoded; `end` is the closing delimiter.
  uint32_t parse_char() {
    const unsigned char c = static_cast<unsigned char>(src_[pos_]);
    if (c == '\\') {
      ++pos_;
      if (eof()) fail_here("unfinished escape at the end of the text");
      const char e = src_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<unsigned char>(e);
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        default:
          pos_ -= 2;  // at the backslash
          fail_here(cat("unknown escape: backslash then ", describe(e)));
      }
    }
    // A raw UTF-8 sequence.
    uint32_t cp = 0;
    const int len = unicode::utf8_decode_one(
        reinterpret_cast<const unsigned char*>(src_.data() + pos_), src_.size() - pos_, &cp);
    if (len == 0) fail_here("invalid UTF-8");
    pos_ += static_cast<size_t>(len);
    return cp;
  }

  uint32_t parse_hex(int digits) {
    const size_t start = pos_;
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) fail_here(cat("expected ", digits, " hex digits in the escape"));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodePoint) {
      pos_ = start;
      fail_here("code point above U+10FFFF");
    }
    return v;
  }

  Expr parse_primary(int depth) {
    const size_t at = pos_;
    const char c = peek();
    if (c == '"') {
      ++pos_;
      std::string text;
      while (true) {
        if (eof()) {
          pos_ = at;
          fail_here("unterminated string literal");
        }
        if (peek() == '"') break;
        if (peek() == '\n') fail_here("newline inside a string literal (write \\n)");
        const uint32_t cp = parse_char();
        if (cp >= 0xD800 && cp <= 0xDFFF) fail_here("a surrogate code point in a literal");
        unicode::append_utf8(cp, text);
      }
      ++pos_;
      return lit(std::move(text));
    }
    if (c == '[') {
      ++pos_;
      bool negated = false;
      if (peek() == '^') {
        negated = true;
        ++pos_;
      }
      std::vector<CharRange> ranges;
      while (true) {
        if (eof()) {
          pos_ = at;
          fail_here("unterminated character class");
        }
        if (peek() == ']') break;
        const uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (peek() == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) fail_here("character range with its end before its start");
        }
        ranges.push_back({lo, hi});
      }
      ++pos_;
      return char_class(std::move(ranges), negated);
    }
    if (c == '(') {
      if (depth + 1 > kMaxDepth) fail_here(cat("expression nested deeper than ", kMaxDepth));
      ++pos_;
      skip_space(true);
      Expr e = parse_alternates(true, depth + 1);
      skip_space(true);
      if (peek() != ')') {
        pos_ = at;
        fail_here("unclosed '('");
      }
      ++pos_;
      return e;
    }
    if (c == '.') {
      ++pos_;
      return any_char();
    }
    if (is_name_char(c)) {
      const std::string name = parse_name();
      return ref(rule_index(name, at));
    }
    fail_here(cat("unexpected ", describe(c)));
  }
};

}  // namespace

Grammar parse_gbnf(std::string_view text, std::string_view root) {
  return Parser(text).parse(root);
}

}  // namespace smolrt::grammar
