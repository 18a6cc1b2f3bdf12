#include "core/paths.h"

#include <cstdlib>

namespace smolrt {

namespace {
std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
}  // namespace

std::filesystem::path fixtures_dir() {
  std::string env = env_or_empty("SMOLRT_FIXTURES");
  if (!env.empty()) return env;
  return std::filesystem::path(SMOLRT_SOURCE_DIR) / ".." / "shared";
}

std::filesystem::path cache_dir() {
  std::string env = env_or_empty("SMOLRT_CACHE");
  if (!env.empty()) return env;
  std::string xdg = env_or_empty("XDG_CACHE_HOME");
  if (!xdg.empty()) return std::filesystem::path(xdg) / "smolrt";
  std::string home = env_or_empty("HOME");
  return std::filesystem::path(home.empty() ? "." : home) / ".cache" / "smolrt";
}

std::filesystem::path default_model_path() {
  std::string env = env_or_empty("SMOLRT_MODEL");
  if (!env.empty()) return env;
  return cache_dir() / "SmolLM2-135M-Instruct.Q4_0.gguf";
}

std::filesystem::path default_model_q4_1_path() {
  return cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace smolrt
