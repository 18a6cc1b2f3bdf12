// Grammars for JSON numbers within bounds (JSON Schema minimum / maximum / exclusiveMinimum /
// exclusiveMaximum): the decimal spellings of exactly the numbers in range, built digit by digit
// (the classic range-to-regex construction). Internal to src/grammar/ (json_schema.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include "grammar/grammar.h"

namespace smolrt::grammar::detail {

// Longest digit runs the number grammars allow: a small model must not loop on digits forever,
// and a JSON double has no more than 17 significant digits.
inline constexpr int kMaxIntDigits = 19;   // an integer's digits (int64 range)
inline constexpr int kMaxFracDigits = 16;  // digits after the decimal point
inline constexpr int kMaxExpDigits = 3;    // exponent digits

struct Bound {
  int64_t value;
  bool exclusive;
};

// JSON integers ("-"? digits, no leading zeros) in [lo, hi]; nullopt = unbounded on that side.
// Requires lo <= hi when both are given.
Expr integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi);

// JSON numbers x with lo < x (or <=) and x < hi (or <=); integral bound values; no exponent when
// bounded (the grammar stays exact). Returns an empty alternative when no number is in range.
Expr number_range(std::optional<Bound> lo, std::optional<Bound> hi);

// Unbounded JSON number and integer (digit counts capped as above).
Expr json_number();
Expr json_integer();

}  // namespace smolrt::grammar::detail
