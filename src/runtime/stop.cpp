#include "runtime/stop.h"

#include <algorithm>

namespace smolrt {

const char* stop_cause_name(StopCause c) {
  switch (c) {
    case StopCause::kNone:
      return "none";
    case StopCause::kEog:
      return "eog";
    case StopCause::kStopString:
      return "stop";
    case StopCause::kMaxTokens:
      return "length";
    case StopCause::kContextFull:
      return "context";
  }
  return "?";
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

void StopMatcher::reset() {
  held_.clear();
  stopped_ = false;
  matched_.clear();
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);

  // Earliest complete match wins (ties: the first stop string listed).
  size_t best = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && at < best) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }

  // Hold back the longest suffix of held_ that is a proper prefix of a stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len) {
      if (std::string_view(held_).substr(held_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace smolrt
