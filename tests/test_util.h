// Shared test helpers: fixture lookup that skips visibly, random data, poisoning.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/paths.h"

namespace smolrt::test {

// Path of a file under ../shared (or $SMOLRT_FIXTURES); empty when absent.
inline std::filesystem::path fixture(const std::string& rel) {
  std::filesystem::path p = fixtures_dir() / rel;
  return std::filesystem::exists(p) ? p : std::filesystem::path();
}

// Random floats ~ N(0, scale) from a fixed seed; never all zeros.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace smolrt::test

// Skips the test (visibly, as "skipped: fixtures not found") when a ../shared file is missing.
#define REQUIRE_FIXTURE(var, rel)                                                                \
  const std::filesystem::path var = ::smolrt::test::fixture(rel);                                \
  if (var.empty())                                                                               \
  GTEST_SKIP() << "skipped: fixtures not found (" << (::smolrt::fixtures_dir() / (rel)).string() \
               << "); set SMOLRT_FIXTURES"

// Skips when the default model (scripts/fetch_model.sh) is not in the cache.
#define REQUIRE_DEFAULT_MODEL(var)                                     \
  const std::filesystem::path var = ::smolrt::default_model_path();    \
  if (!std::filesystem::exists(var))                                   \
  GTEST_SKIP() << "skipped: default model not found (" << var.string() \
               << "); run scripts/fetch_model.sh"

// Skips when the shipped Q4_1 SmolLM2-135M-Instruct (scripts/fetch_model.sh) is not in the cache.
#define REQUIRE_DEFAULT_MODEL_Q4_1(var)                                  \
  const std::filesystem::path var = ::smolrt::default_model_q4_1_path(); \
  if (!std::filesystem::exists(var))                                     \
  GTEST_SKIP() << "skipped: Q4_1 model not found (" << var.string()      \
               << "); run scripts/fetch_model.sh"
