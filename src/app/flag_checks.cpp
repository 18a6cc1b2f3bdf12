#include "app/flag_checks.h"

#include <cmath>
#include <cstdio>

namespace smolrt::app {

CLI::Validator int_range(long long lo, long long hi, const std::string& fix) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long x = std::stoll(v, &used);
          if (used == v.size() && x >= lo && x <= hi) return {};
        } catch (const std::exception&) {
        }
        return "'" + v + "' is invalid: " + fix;
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator seconds_range(double lo, double hi) {
  char range[64];
  std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
  const std::string r = range;
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && std::isfinite(x) && x >= lo && x <= hi) return {};
        } catch (const std::exception&) {
        }
        return "'" + v + "' is invalid: give a finite number of seconds in " + r;
      },
      "SECONDS in " + r);
}

}  // namespace smolrt::app
