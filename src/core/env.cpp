#include "core/env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace smolrt {

std::string env_string(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

bool env_flag(const char* name, bool def) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0);
}

int env_int(const char* name, int def, int lo, int hi, const char* what) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || errno == ERANGE || n < lo || n > hi) {
    fail(name, "=", v, " is not ", what, "; give an integer in [", lo, ", ", hi, "]");
  }
  return static_cast<int>(n);
}

}  // namespace smolrt
