#include "grammar/number_range.h"

#include <string>
#include <vector>

namespace smolrt::grammar::detail {

namespace {

Expr digits(char lo, char hi) {
  return char_class({{static_cast<uint32_t>(lo), static_cast<uint32_t>(hi)}});
}
Expr digit() {
  return digits('0', '9');
}

int n_digits(uint64_t v) {
  int n = 1;
  while (v >= 10) {
    v /= 10;
    ++n;
  }
  return n;
}

uint64_t pow10(int n) {
  uint64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

bool all(std::string_view s, char c) {
  return s.find_first_not_of(c) == std::string_view::npos;
}

// Digit strings of equal length from a to b (a <= b).
Expr same_length(std::string_view a, std::string_view b) {
  if (a.empty()) return lit("");
  if (a[0] == b[0]) return seq({lit(std::string(1, a[0])), same_length(a.substr(1), b.substr(1))});
  const size_t rest = a.size() - 1;
  const bool low_full = all(a.substr(1), '0');   // a = d000...: the whole first-digit block
  const bool high_full = all(b.substr(1), '9');  // b = d999...
  std::vector<Expr> alts;
  char lo = a[0], hi = b[0];
  if (!low_full) {
    alts.push_back(
        seq({lit(std::string(1, a[0])), same_length(a.substr(1), std::string(rest, '9'))}));
    ++lo;
  }
  if (!high_full) --hi;
  if (lo <= hi)
    alts.push_back(
        seq({digits(lo, hi), repeat(digit(), static_cast<int>(rest), static_cast<int>(rest))}));
  if (!high_full)
    alts.push_back(
        seq({lit(std::string(1, b[0])), same_length(std::string(rest, '0'), b.substr(1))}));
  return alt(std::move(alts));
}

constexpr uint64_t kNoLimit = ~uint64_t{0};

// Non-negative integers a..b without leading zeros; b = kNoLimit: no upper bound (up to
// kMaxIntDigits digits).
Expr uint_range(uint64_t a, uint64_t b) {
  std::vector<Expr> alts;
  const bool bounded = b != kNoLimit;
  const int na = n_digits(a);
  const int nb = bounded ? n_digits(b) : na;
  for (int n = na; n <= nb; ++n) {
    const uint64_t lo = n == na ? a : pow10(n - 1);
    const uint64_t hi = (bounded && n == nb) ? b : pow10(n) - 1;
    alts.push_back(same_length(std::to_string(lo), std::to_string(hi)));
  }
  if (!bounded && na < kMaxIntDigits)
    alts.push_back(seq({digits('1', '9'), repeat(digit(), na, kMaxIntDigits - 1)}));
  return alt(std::move(alts));
}

uint64_t magnitude(int64_t v) {  // |v| for v < 0, INT64_MIN included
  return static_cast<uint64_t>(-(v + 1)) + 1;
}

Expr frac_any() {
  return opt(seq({lit("."), repeat(digit(), 1, kMaxFracDigits)}));
}

// Spellings "I" "." "F" of the numbers y >= 0 with lo </<= y </<= hi (lo.value >= 0).
Expr nonneg_decimal(Bound lo, std::optional<Bound> hi) {
  const Expr frac_zero = opt(seq({lit("."), repeat(lit("0"), 1, kMaxFracDigits)}));
  const Expr frac_nonzero = seq({lit("."), repeat(lit("0"), 0, kMaxFracDigits - 1),
                                 digits('1', '9'), repeat(digit(), 0, kMaxFracDigits - 1)});
  const int64_t any_from = lo.exclusive ? lo.value + 1 : lo.value;  // I from here: any fraction
  std::vector<Expr> alts;
  if (!hi) {
    alts.push_back(seq({uint_range(static_cast<uint64_t>(any_from), kNoLimit), frac_any()}));
    if (lo.exclusive) alts.push_back(seq({lit(std::to_string(lo.value)), frac_nonzero}));
    return alt(std::move(alts));
  }
  const int64_t any_to = hi->value - 1;  // I up to here: any fraction keeps y < hi
  if (any_from <= any_to) {
    alts.push_back(seq(
        {uint_range(static_cast<uint64_t>(any_from), static_cast<uint64_t>(any_to)), frac_any()}));
  }
  // I == lo with a non-zero fraction: above an exclusive lo, still below hi (lo < hi).
  if (lo.exclusive && lo.value < hi->value)
    alts.push_back(seq({lit(std::to_string(lo.value)), frac_nonzero}));
  // y == hi exactly (zero fraction) when hi is inclusive and above lo.
  if (!hi->exclusive && (hi->value > lo.value || (hi->value == lo.value && !lo.exclusive)))
    alts.push_back(seq({lit(std::to_string(hi->value)), frac_zero}));
  return alt(std::move(alts));
}

}  // namespace

Expr integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<Expr> alts;
  if (!lo || *lo < 0) {  // negatives: magnitudes from max(1, -hi) to -lo
    const uint64_t mag_lo = hi && *hi < 0 ? magnitude(*hi) : 1;
    const uint64_t mag_hi = lo ? magnitude(*lo) : kNoLimit;
    alts.push_back(seq({lit("-"), uint_range(mag_lo, mag_hi)}));
  }
  if (!hi || *hi >= 0) {
    const uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    alts.push_back(uint_range(from, hi ? static_cast<uint64_t>(*hi) : kNoLimit));
  }
  return alt(std::move(alts));
}

Expr number_range(std::optional<Bound> lo, std::optional<Bound> hi) {
  std::vector<Expr> alts;
  // x >= 0.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const Bound from = lo && lo->value >= 0 ? *lo : Bound{0, false};
    alts.push_back(nonneg_decimal(from, hi));
  }
  // x < 0 as "-" y with y > 0: y above max(0, -hi), up to -lo.
  if (!lo || lo->value < 0) {
    const Bound ylo = hi && hi->value < 0 ? Bound{-hi->value, hi->exclusive} : Bound{0, true};
    const std::optional<Bound> yhi =
        lo ? std::optional(Bound{-lo->value, lo->exclusive}) : std::nullopt;
    const bool empty = yhi && (ylo.value > yhi->value ||
                               (ylo.value == yhi->value && (ylo.exclusive || yhi->exclusive)));
    if (!empty) alts.push_back(seq({lit("-"), nonneg_decimal(ylo, yhi)}));
  }
  return alt(std::move(alts));
}

Expr json_integer() {
  return seq({opt(lit("-")),
              alt({lit("0"), seq({digits('1', '9'), repeat(digit(), 0, kMaxIntDigits - 1)})})});
}

Expr json_number() {
  return seq(
      {json_integer(), frac_any(),
       opt(seq({char_class({{'e', 'e'}, {'E', 'E'}}), opt(char_class({{'+', '+'}, {'-', '-'}})),
                repeat(digit(), 1, kMaxExpDigits)}))});
}

}  // namespace smolrt::grammar::detail
