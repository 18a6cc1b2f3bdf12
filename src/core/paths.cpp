#include "core/paths.h"

#include "core/env.h"

namespace smolrt {

std::filesystem::path fixtures_dir() {
  std::string env = env_string("SMOLRT_FIXTURES");
  if (!env.empty()) return env;
  return std::filesystem::path(SMOLRT_SOURCE_DIR) / ".." / "shared";
}

std::filesystem::path cache_dir() {
  std::string env = env_string("SMOLRT_CACHE");
  if (!env.empty()) return env;
  std::string xdg = env_string("XDG_CACHE_HOME");
  if (!xdg.empty()) return std::filesystem::path(xdg) / "smolrt";
  std::string home = env_string("HOME");
  return std::filesystem::path(home.empty() ? "." : home) / ".cache" / "smolrt";
}

std::filesystem::path default_model_path() {
  std::string env = env_string("SMOLRT_MODEL");
  if (!env.empty()) return env;
  return cache_dir() / "SmolLM2-135M-Instruct.Q4_0.gguf";
}

std::filesystem::path default_model_q4_1_path() {
  return cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace smolrt
