// Reads user input lines for `smolrt chat`: with line editing and history (libedit) when stdin
// is a terminal, plain lines without prompt decorations when it is not (a pipe or a file).
#pragma once

#include <optional>
#include <string>

namespace smolrt::app {

class LineReader {
 public:
  LineReader();
  // True when stdin is a terminal: prompts are shown and lines go into the history.
  bool interactive() const { return interactive_; }
  // The next line without its newline (a trailing '\r' is dropped too); nullopt at end of input.
  std::optional<std::string> read(const std::string& prompt);

 private:
  bool interactive_ = false;
};

}  // namespace smolrt::app
