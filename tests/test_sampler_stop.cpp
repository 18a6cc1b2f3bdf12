// Stop strings across token boundaries: released text never contains the stop string, and a
// partial match is held back until it completes or fails.
#include <gtest/gtest.h>

#include "runtime/stop.h"

namespace smolrt {
namespace {

TEST(StopStrings, MatchAcrossPiecesAndHoldBackThePartialMatch) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("Hello wor"), "Hello wor");
  EXPECT_EQ(m.push("ld! ST"), "ld! ");  // "ST" may start the stop string: held
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("OP and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(m.push("ignored"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, OneCharacterPerPiece) {
  StopMatcher m({"</s>"});
  std::string out;
  for (char c : std::string("ab</x</s>zz")) out += m.push(std::string(1, c));
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "ab</x");
}

TEST(StopStrings, FailedPartialMatchIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abS"), "ab");
  EXPECT_EQ(m.push("T"), "");
  EXPECT_EQ(m.push("x"), "STx");
  EXPECT_EQ(m.push("ST"), "");
  EXPECT_EQ(m.flush(), "ST");  // end of output: the held tail was not a stop string
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, EarliestOfSeveralWinsAndTextBeforeItIsKept) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopStrings, OverlappingPrefixesHoldTheLongestCandidate) {
  StopMatcher m({"aab"});
  EXPECT_EQ(m.push("xaa"), "x");
  EXPECT_EQ(m.push("a"), "a");  // "aaa": only the last "aa" can still start "aab"
  EXPECT_EQ(m.push("b"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStrings, MultiByteStopString) {
  StopMatcher m({"\xC3\xA9t\xC3\xA9"});  // "été"
  EXPECT_EQ(m.push("un \xC3"), "un ");
  EXPECT_EQ(m.push("\xA9t"), "");
  EXPECT_EQ(m.push("\xC3\xA9!"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStrings, NoStopsPassEverythingThroughAndEmptyStringsAreIgnored) {
  StopMatcher m({"", ""});
  EXPECT_EQ(m.push("anything S"), "anything S");
  EXPECT_FALSE(m.stopped());
  m.reset();
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, CauseNames) {
  EXPECT_STREQ(stop_cause_name(StopCause::kStopString), "stop");
  EXPECT_STREQ(stop_cause_name(StopCause::kMaxTokens), "length");
  EXPECT_STREQ(stop_cause_name(StopCause::kContextFull), "context");
  EXPECT_STREQ(stop_cause_name(StopCause::kEog), "eog");
}

}  // namespace
}  // namespace smolrt
