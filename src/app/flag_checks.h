// CLI11 validators for numeric flags: a value that is not a number, not finite (nan, inf) or out
// of range is a parse error naming the value, the range and the fix (CLI11 prefixes the flag).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace smolrt::app {

// An integer in [lo, hi].
CLI::Validator int_range(long long lo, long long hi, const std::string& fix);
// A finite number of seconds in [lo, hi].
CLI::Validator seconds_range(double lo, double hi);

}  // namespace smolrt::app
