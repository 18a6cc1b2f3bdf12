// Grammars for constrained decoding: rules of expressions over Unicode text (literals, character
// classes over code points, sequences, alternatives, bounded or unbounded repetition, rule
// references), written by hand, parsed from llama.cpp's GBNF, or generated from a JSON schema
// (grammar/json_schema.h). compile() (grammar/matcher.h) turns one into a byte-level pushdown
// automaton for the token matcher.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace smolrt::grammar {

// Every problem with a grammar: GBNF syntax (with line and column), undefined or left-recursive
// rules, a grammar too large to compile, an unsupported JSON-schema construct.
class GrammarError : public Error {
 public:
  using Error::Error;
};

// An inclusive range of Unicode code points.
struct CharRange {
  uint32_t lo = 0, hi = 0;
  bool operator==(const CharRange&) const = default;
};

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr int kUnbounded = -1;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // `text`, UTF-8 bytes matched exactly ("" matches the empty string)
    kClass,    // one code point in `ranges` (or not in them when `negated`); surrogates never
    kRef,      // the rule `rule`
    kSeq,      // `items` one after another
    kAlt,      // one of `items`
    kRepeat,   // items[0] between `min` and `max` times (max kUnbounded = no limit)
  };
  Kind kind = Kind::kLiteral;
  std::string text;
  std::vector<CharRange> ranges;
  bool negated = false;
  int rule = -1;
  int min = 0, max = 0;
  std::vector<Expr> items;
};

// Builders. seq/alt of one item return that item.
Expr lit(std::string text);
Expr char_class(std::vector<CharRange> ranges, bool negated = false);
Expr any_char();
Expr ref(int rule);
Expr seq(std::vector<Expr> items);
Expr alt(std::vector<Expr> items);
Expr repeat(Expr item, int min, int max);
Expr opt(Expr item);
Expr star(Expr item);
Expr plus(Expr item);

struct Rule {
  std::string name;
  Expr body;
  // Always called, never copied into its callers: for rules used from many places whose copies
  // would multiply (a hint for the compiler; the language is the same).
  bool no_inline = false;
};

struct Grammar {
  std::vector<Rule> rules;
  int root = -1;  // index into rules

  // Adds a rule (body empty-literal until set) and returns its index; GrammarError when the name
  // is taken.
  int add_rule(std::string name, Expr body = {});
  // The index of the rule named `name`, or -1.
  int find(std::string_view name) const;
  // The grammar as GBNF text (the root rule first), parseable by parse_gbnf with root "root"
  // when the root rule is named "root".
  std::string to_gbnf() const;
};

// llama.cpp's GBNF: `name ::= alternatives` rules, "literals" with \n \r \t \\ \" \xHH \uHHHH
// \UHHHHHHHH escapes, [classes] ([^...] negated, a-z ranges, the same escapes), `.` (any code
// point), ( ), |, postfix * + ? {m} {m,} {m,n} {,n}, # comments. A rule ends at the end of its
// line unless inside parentheses or after | or ::=; a line starting with | continues the rule
// above. Throws GrammarError naming the problem, line and column; also for undefined rules, a
// rule defined twice and a missing root rule. Limits: expressions nested at most 256 deep
// (parentheses and postfix operators), repetition counts up to 10000.
Grammar parse_gbnf(std::string_view text, std::string_view root = "root");

}  // namespace smolrt::grammar
