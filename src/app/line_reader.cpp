#include "app/line_reader.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#if defined(SMOLRT_HAVE_LIBEDIT)
#include <editline/readline.h>
#endif

namespace smolrt::app {

LineReader::LineReader() {
  interactive_ = isatty(STDIN_FILENO) != 0;
#if defined(SMOLRT_HAVE_LIBEDIT)
  if (interactive_) {
    using_history();
    stifle_history(1000);
  }
#endif
}

std::optional<std::string> LineReader::read(const std::string& prompt) {
  std::string line;
#if defined(SMOLRT_HAVE_LIBEDIT)
  if (interactive_) {
    char* raw = readline(prompt.c_str());
    if (raw == nullptr) return std::nullopt;
    line = raw;
    std::free(raw);
    if (!line.empty()) add_history(line.c_str());
    return line;
  }
#else
  if (interactive_) {
    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
#endif
  if (!std::getline(std::cin, line)) return std::nullopt;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace smolrt::app
