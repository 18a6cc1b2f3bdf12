// core/env.h: the shared parser of SMOLRT_* switches and knobs.
#include "core/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace smolrt {
namespace {

constexpr const char* kVar = "SMOLRT_TEST_ENV_KNOB";

struct EnvGuard {
  ~EnvGuard() { unsetenv(kVar); }
};

TEST(Env, FlagDefaultsAndOffSpellings) {
  EnvGuard g;
  unsetenv(kVar);
  EXPECT_TRUE(env_flag(kVar, true));
  EXPECT_FALSE(env_flag(kVar, false));
  setenv(kVar, "", 1);
  EXPECT_TRUE(env_flag(kVar, true));
  for (const char* off : {"0", "false", "off"}) {
    setenv(kVar, off, 1);
    EXPECT_FALSE(env_flag(kVar, true)) << off;
  }
  for (const char* on : {"1", "yes", "on"}) {
    setenv(kVar, on, 1);
    EXPECT_TRUE(env_flag(kVar, false)) << on;
  }
}

TEST(Env, IntInRangeOrAClearError) {
  EnvGuard g;
  unsetenv(kVar);
  EXPECT_EQ(env_int(kVar, 7, 0, 10, "a count"), 7);
  setenv(kVar, "10", 1);
  EXPECT_EQ(env_int(kVar, 7, 0, 10, "a count"), 10);
  setenv(kVar, "0", 1);
  EXPECT_EQ(env_int(kVar, 7, 0, 10, "a count"), 0);
  for (const char* bad : {"11", "-1", "abc", "3x", "99999999999999999999"}) {
    setenv(kVar, bad, 1);
    try {
      env_int(kVar, 7, 0, 10, "a count");
      FAIL() << bad << ": no Error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string(kVar) + "=" + bad), std::string::npos) << m;
      EXPECT_NE(m.find("is not a count"), std::string::npos) << m;
      EXPECT_NE(m.find("[0, 10]"), std::string::npos) << m;
    }
  }
}

TEST(Env, StringIsEmptyWhenUnset) {
  EnvGuard g;
  unsetenv(kVar);
  EXPECT_EQ(env_string(kVar), "");
  setenv(kVar, "/some/path", 1);
  EXPECT_EQ(env_string(kVar), "/some/path");
}

}  // namespace
}  // namespace smolrt
