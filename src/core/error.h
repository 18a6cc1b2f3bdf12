// smolrt::Error — the one exception type for load, CLI and server errors.
// Every message says what went wrong, where (file, field, byte offset, flag), and how to fix it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace smolrt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// cat("a", 1, 'b') -> "a1b": builds messages without std::format (GCC 12 lacks it).
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// fail("tensor ", name, " has type ", t) throws Error with the concatenated message.
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

}  // namespace smolrt
