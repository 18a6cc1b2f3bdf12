// GBNF parsing, printing and errors, and what compiled grammars accept (text-level, over a
// byte-level vocabulary: every byte is a token).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar_test_util.h"

namespace smolrt::grammar {
namespace {

using test::byte_vocab;
using test::matches;

std::shared_ptr<const CompiledGrammar> gbnf(std::string_view text) {
  return compile(parse_gbnf(text), byte_vocab());
}

std::string error_of(std::string_view text) {
  return test::error_of([&] { gbnf(text); });
}

TEST(GrammarGbnf, LiteralsClassesAndAlternatives) {
  const auto g = gbnf(R"(root ::= "ab" [0-9] | "c" [^a-z\n] # a comment
)");
  EXPECT_TRUE(matches(g, "ab5"));
  EXPECT_TRUE(matches(g, "cA"));
  EXPECT_TRUE(matches(g, "c\xc3\xa9"));  // é: negated classes cover all other code points
  EXPECT_FALSE(matches(g, "cz"));
  EXPECT_FALSE(matches(g, "c\n"));
  EXPECT_FALSE(matches(g, "ab"));
  EXPECT_FALSE(matches(g, "ab55"));
}

TEST(GrammarGbnf, Repetitions) {
  const auto g = gbnf(R"(root ::= "a"* "b"+ "c"? "d"{2} "e"{1,2} "f"{2,} "g"{,1})");
  EXPECT_TRUE(matches(g, "bddeff"));
  EXPECT_TRUE(matches(g, "aaabbbcddeefffg"));
  EXPECT_FALSE(matches(g, "ddeff"));     // b+ needs one
  EXPECT_FALSE(matches(g, "bdddeff"));   // d{2} exactly
  EXPECT_FALSE(matches(g, "bddeeeff"));  // e{1,2}
  EXPECT_FALSE(matches(g, "bddef"));     // f{2,}
  EXPECT_FALSE(matches(g, "bddeffgg"));  // g{,1}
}

// Stacked operators on an open-ended repetition are one repetition with the same language, so a
// request cannot double the automaton per operator (fuzz_request found 20 stacked '+' taking
// seconds and gigabytes).
TEST(GrammarGbnf, StackedRepetitionsCollapse) {
  const auto g = gbnf(R"(root ::= "x" "a"+*++++++++++++++++++++++++++++++ "b")");
  EXPECT_TRUE(matches(g, "xb"));  // (a+)* admits none
  EXPECT_TRUE(matches(g, "xaaaab"));
  EXPECT_FALSE(matches(g, "xa"));
  const auto plus = gbnf(R"(root ::= ("a"{2,})+ "b" ("c"?)+ "d" (("e"+)+)? "f" ("g"{2,})?)");
  EXPECT_TRUE(matches(plus, "aabdf"));
  EXPECT_TRUE(matches(plus, "aaabcccdeeefgg"));
  EXPECT_FALSE(matches(plus, "abdf"));    // (a{2,})+ needs two
  EXPECT_FALSE(matches(plus, "aabdfg"));  // (g{2,})? is none or two and more: not x{0,}
  const auto nested = gbnf(R"(root ::= (("a"{3,}){2}){2,3})");
  EXPECT_TRUE(matches(nested, std::string(12, 'a')));
  EXPECT_TRUE(matches(nested, std::string(40, 'a')));
  EXPECT_FALSE(matches(nested, std::string(11, 'a')));
}

TEST(GrammarGbnf, RulesGroupsAndMultiLineAlternatives) {
  const auto g = gbnf(R"(
root ::= item ("," item)*
item ::= (
    "x" |
    num
  )
  | "y"
num ::= [1-9] [0-9]*
)");
  EXPECT_TRUE(matches(g, "x,y,42"));
  EXPECT_TRUE(matches(g, "7"));
  EXPECT_FALSE(matches(g, "x,"));
  EXPECT_FALSE(matches(g, "07"));
}

TEST(GrammarGbnf, EscapesAndUnicode) {
  const auto g = gbnf(R"(root ::= "\x41\u00e9\U0001F600\t\"\\" [\u3040-\u309F]+ .)");
  EXPECT_TRUE(matches(g, "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\\xe3\x81\x82\xe3\x81\x84!"));
  EXPECT_TRUE(matches(g, "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\\xe3\x81\x82\xf0\x9f\x98\x80"));
  EXPECT_FALSE(matches(g, "A\xc3\xa9\xf0\x9f\x98\x80\t\"\\a!"));
}

TEST(GrammarGbnf, InvalidUtf8NeverMatchesAClass) {
  const auto g = gbnf(R"(root ::= [^"]*)");
  EXPECT_TRUE(matches(g, "h\xc3\xa9llo"));
  EXPECT_FALSE(matches(g, "\xc3"));          // truncated: not complete
  EXPECT_FALSE(matches(g, "\xc3("));         // bad continuation
  EXPECT_FALSE(matches(g, "\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(matches(g, "\xc0\xaf"));      // overlong
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_text("\xe3\x81"));  // a prefix of a character is fine mid-text
  EXPECT_FALSE(m.can_end());
}

TEST(GrammarGbnf, RecursionAndTailCalls) {
  const auto g = gbnf(R"(
root ::= list
list ::= "[" (list ("," list)*)? "]"
)");
  EXPECT_TRUE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[[],[[]],[[],[]]]"));
  EXPECT_FALSE(matches(g, "[[]"));
  // Right recursion as repetition: the stack must not grow per item (a tail call).
  const auto r = gbnf(R"(root ::= "a" root | "b")");
  EXPECT_TRUE(matches(r, std::string(2000, 'a') + "b"));
}

TEST(GrammarGbnf, NestingBeyondTheStackLimitIsRejected) {
  const auto g = gbnf(R"g(root ::= "(" root ")" | "x")g");
  const int ok = GrammarMatcher::kMaxStackDepth - 1;
  EXPECT_TRUE(matches(g, std::string(ok, '(') + "x" + std::string(ok, ')')));
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_text(std::string(GrammarMatcher::kMaxStackDepth + 1, '(')));
}

// Found by fuzz_grammar (seed fuzz/seeds/fuzz_grammar/gbnf_completion_within_the_depth_limit):
// each "(" of the first alternative nests 8 calls (root, r1 .. r7). After 33 "(" the only parse
// left sits at the depth limit on the "z" alternative, yet the shortest completion took the
// shorter "x)..." through r1, which needs a call there: accepting it failed. The completion now
// plans within the nesting left, after every "(".
TEST(GrammarMatcher, ShortestCompletionStaysWithinTheDepthLimit) {
  const std::string zs(20, 'z');
  std::string src = cat("root ::= \"(\" r1 \")\" | \"(\" \"", zs, "\" | \"x\"\n");
  for (int i = 1; i <= 7; ++i)
    src += i < 7 ? cat("r", i, " ::= r", i + 1, " \")\"\n") : cat("r7 ::= root \")\"\n");
  const auto g = gbnf(src);
  GrammarMatcher m(g);
  int opened = 0;
  while (m.accept_text("(")) {
    ++opened;
    ASSERT_LE(opened, 100);
    const std::string completion = m.shortest_completion();
    GrammarMatcher done = m;
    ASSERT_TRUE(done.accept_text(completion)) << "after " << opened << " '(': " << completion;
    EXPECT_TRUE(done.can_end()) << "after " << opened << " '(': " << completion;
    const int depth = 8 * std::min(opened, GrammarMatcher::kMaxStackDepth / 8);
    const std::string closing(static_cast<size_t>(depth), ')');
    if (opened <= GrammarMatcher::kMaxStackDepth / 8) {
      EXPECT_EQ(completion, cat("x", closing)) << opened;
    } else {  // only the "z" alternative is left
      EXPECT_EQ(completion, cat(zs, closing)) << opened;
    }
  }
  // 32 "(" nest 256 calls; the 33rd can only start the "z" alternative.
  EXPECT_EQ(opened, GrammarMatcher::kMaxStackDepth / 8 + 1);
}

// At the depth limit the matcher kept a parse that could only go on by nesting deeper: after 256
// "(" the mask allowed "(" (the thread after it expects "y" or a call of root), and after it
// nothing at all, not even the end. Now a parse is kept only while it can still finish within
// the limit, so the mask never leads into a dead end.
TEST(GrammarMatcher, MasksNeverLeadIntoADeadEndAtTheDepthLimit) {
  const auto g = gbnf(R"g(root ::= "(" root ")" | "(" "y" root ")" | "x")g");
  const TokenVocab& v = g->vocab();
  auto allowed = [&](GrammarMatcher& m) {
    const uint64_t* bits = m.mask();
    std::vector<int> ids;
    for (int id = 0; id < v.n_vocab(); ++id)
      if ((bits[id >> 6] >> (id & 63)) & 1) ids.push_back(id);
    return ids;
  };
  GrammarMatcher m(g);
  int opened = 0;
  for (;;) {
    const std::vector<int> ok = allowed(m);
    ASSERT_TRUE(!ok.empty() || m.can_end()) << "a dead end after " << opened << " '('";
    for (int id : ok) {
      GrammarMatcher next = m;
      ASSERT_TRUE(next.accept_token(id)) << "token " << id << " after " << opened << " '('";
      if (v.is_eog(id)) continue;
      ASSERT_TRUE(next.can_end() || !allowed(next).empty())
          << "token " << id << " after " << opened << " '(' leads into a dead end";
    }
    if (!m.accept_text("(")) break;
    ++opened;
    ASSERT_LE(opened, GrammarMatcher::kMaxStackDepth + 10);
  }
  EXPECT_EQ(opened, GrammarMatcher::kMaxStackDepth);
  // At the limit "y" still fits (it nests one call less), and the match completes.
  ASSERT_TRUE(m.accept_text("y"));
  const std::string completion = m.shortest_completion();
  EXPECT_EQ(completion, cat("x", std::string(GrammarMatcher::kMaxStackDepth, ')')));
  EXPECT_TRUE(m.accept_text(completion));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarGbnf, ARootThatCannotFinishWithinTheDepthLimitIsAnError) {
  // r1 .. rN call each other in a ring (so none is inlined); only rN can end without calling on:
  // every text nests N - 1 calls.
  auto ring = [](int n) {
    std::string src = "root ::= r1\n";
    for (int i = 1; i < n; ++i) src += cat("r", i, " ::= \"a\" r", i + 1, " \"b\"\n");
    return src + cat("r", n, " ::= \"c\" | \"a\" r1 \"b\"\n");
  };
  const std::string e = error_of(ring(GrammarMatcher::kMaxStackDepth + 2));
  EXPECT_NE(e.find("cannot finish within 256 nested rule calls"), std::string::npos) << e;
  const auto g = gbnf(ring(GrammarMatcher::kMaxStackDepth + 1));
  const std::string a(GrammarMatcher::kMaxStackDepth, 'a'), b(GrammarMatcher::kMaxStackDepth, 'b');
  EXPECT_TRUE(matches(g, cat(a, "c", b)));
  GrammarMatcher m(g);
  EXPECT_EQ(m.shortest_completion(), cat(a, "c", b));
}

TEST(GrammarGbnf, PrintsAndReparsesToTheSameLanguage) {
  const std::string src = R"(root ::= ("a" | b)+ [^\]\-x-z\n] c{2,3} "\"q\""
b ::= "\x01" [\u00e9-\u00ff]
c ::= "c"?)";
  const Grammar g = parse_gbnf(src);
  const Grammar again = parse_gbnf(g.to_gbnf());
  EXPECT_EQ(again.to_gbnf(), g.to_gbnf());
  const auto c1 = compile(g, byte_vocab()), c2 = compile(again, byte_vocab());
  for (const char* t : {"a\x01\xc3\xa9"
                        "0cc\"q\"",
                        "aa]c\"q\"", "a-cc\"q\"", "ax\"q\""}) {
    EXPECT_EQ(matches(c1, t), matches(c2, t)) << t;
  }
  EXPECT_TRUE(matches(c1, "a0\"q\""));
  EXPECT_FALSE(matches(c1, "a-\"q\""));
}

TEST(GrammarGbnf, SyntaxErrorsNameTheProblemAndPosition) {
  EXPECT_EQ(error_of("root ::= \"abc"), "grammar: line 1, column 10: unterminated string literal");
  EXPECT_EQ(error_of("root ::= [a-"), "grammar: line 1, column 10: unterminated character class");
  EXPECT_EQ(error_of("root ::= x\n"),
            "grammar: line 1, column 10: rule 'x' is used but never defined");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""),
            "grammar: line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(error_of("root = \"a\""),
            "grammar: line 1, column 6: expected '::=' after rule name 'root'");
  EXPECT_EQ(error_of("root ::= (\"a\""), "grammar: line 1, column 10: unclosed '('");
  EXPECT_EQ(error_of("root ::= \"a\"{3,1}"),
            "grammar: line 1, column 13: repetition {3,1} has max below min");
  EXPECT_EQ(error_of("root ::= \"a\"{99999}"),
            "grammar: line 1, column 14: repetition count above the limit of 10000");
  EXPECT_EQ(error_of("root ::= \"\\q\""),
            "grammar: line 1, column 11: unknown escape: backslash then 'q'");
  EXPECT_EQ(error_of("root ::= [z-a]"),
            "grammar: line 1, column 14: character range with its end before its start");
  EXPECT_EQ(error_of("root ::= \"a\" )"),
            "grammar: line 1, column 14: unexpected ')' after the rule");
  EXPECT_EQ(error_of("start ::= \"a\""),
            "grammar: there is no rule named 'root' (the rule generation starts from)");
  EXPECT_EQ(error_of("root ::= \"\xff\""), "grammar: line 1, column 11: invalid UTF-8");
  EXPECT_EQ(error_of(std::string(300, '(')),
            "grammar: line 1, column 1: expected a rule name, found '('");
  EXPECT_EQ(error_of("root ::= " + std::string(300, '(')),
            "grammar: line 1, column 266: expression nested deeper than 256");
}

TEST(GrammarGbnf, SemanticErrors) {
  EXPECT_EQ(
      error_of("root ::= root \"a\" | \"b\""),
      "grammar: rule 'root' is left-recursive (it can reach itself before matching any text); "
      "rewrite it with repetition, e.g. x ::= y (op y)*");
  EXPECT_NE(error_of("root ::= e x\ne ::= \"\"?\nx ::= root | \"b\"").find("left-recursive"),
            std::string::npos);
  EXPECT_EQ(error_of("root ::= \"a\" root"),
            "grammar: rule 'root' can never finish (every path needs infinitely much text)");
  EXPECT_NE(error_of("root ::= ([a-z]{10000}){50}").find("grammar too large"), std::string::npos);
}

TEST(GrammarMatcher, AmbiguousGrammarsKeepMasksExact) {
  // Every 'x' can open one or two more levels: the stacks multiply, and the mask must still say
  // exactly what the matcher accepts.
  const auto g = gbnf(R"(root ::= a "."
a ::= "x" a | "x" a a | "y" | "")");
  GrammarMatcher m(g);
  const TokenVocab& v = g->vocab();
  for (const char* step : {"x", "x", "x", "x", "x", "x", "x", "x", "y", "x"}) {
    const uint64_t* bits = m.mask();
    const std::vector<uint64_t> mask(bits, bits + v.mask_words());
    for (int id = 0; id < v.n_vocab(); ++id) {
      const bool ok = m.accept_token(id);
      if (ok) m.rollback(1);
      ASSERT_EQ(ok, ((mask[id >> 6] >> (id & 63)) & 1) != 0) << "token " << id;
    }
    ASSERT_TRUE(m.accept_text(step));
  }
  EXPECT_TRUE(m.accept_text("."));
  EXPECT_TRUE(m.can_end());
}

// Found by fuzz_grammar (seed fuzz/seeds/fuzz_grammar/gbnf_completion_past_the_thread_cap): past
// 512 parses the matcher dropped the extra ones silently, so the shortest completion, planned on
// a parse a later byte dropped, was accepted without completing the match. Past the cap is now
// a GrammarError, like the work limit: a completion completes the match or the grammar is refused.
TEST(GrammarMatcher, PastTheThreadCapIsAnErrorNotADroppedParse) {
  const auto g = gbnf("root ::= a \"2.\"\na ::= | \"x\" a a |.a a\"  \"|\n");
  GrammarMatcher m(g);
  ASSERT_TRUE(m.accept_text("zxx"));  // the fuzzer's sample, "zxxx.", 3 bytes at a time
  GrammarMatcher done = m;
  EXPECT_TRUE(done.accept_text(m.shortest_completion()));  // under the cap throughout
  EXPECT_TRUE(done.can_end());
  ASSERT_TRUE(m.accept_text("x."));
  ASSERT_FALSE(m.can_end());
  const std::string completion = m.shortest_completion();
  done = m;
  try {
    const bool ok = done.accept_text(completion);
    ADD_FAILURE() << "no error; accepted " << ok << ", can_end " << done.can_end();
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
  // The completion's first bytes stay under the cap: accepted, the match not yet complete.
  done = m;
  EXPECT_TRUE(done.accept_text(completion.substr(0, 2)));
  EXPECT_FALSE(done.can_end());
}

TEST(GrammarGbnf, DeadBranchesArePrunedSoTheMatcherNeverStrandsAWalk) {
  // "a" leads only into a rule that never ends: the compiled grammar must not offer it.
  const auto g = gbnf("root ::= \"a\" loop | \"b\"\nloop ::= \"x\" loop");
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_text("a"));
  EXPECT_TRUE(m.accept_text("b"));
  EXPECT_TRUE(m.is_done());
}

TEST(GrammarMatcher, RollbackResetAndShortestCompletion) {
  const auto g = gbnf(R"(root ::= "{" item ("," item)* "}"
item ::= "[" [0-9]+ "]" | "x")");
  GrammarMatcher m(g);
  EXPECT_EQ(m.shortest_completion(), "{x}");
  ASSERT_TRUE(m.accept_text("{["));
  ASSERT_TRUE(m.accept_text("12"));
  EXPECT_EQ(m.shortest_completion(), "]}");
  ASSERT_TRUE(m.accept_text("],x"));
  EXPECT_EQ(m.accepted(), 3);
  m.rollback(2);
  EXPECT_EQ(m.shortest_completion(), "0]}");
  EXPECT_FALSE(m.accept_text("}"));
  EXPECT_TRUE(m.accept_text("0]}"));
  EXPECT_TRUE(m.is_done());
  EXPECT_THROW(m.rollback(5), Error);
  m.reset();
  EXPECT_EQ(m.accepted(), 0);
  EXPECT_TRUE(m.accept_text("{x}"));
  EXPECT_TRUE(m.can_end());
}

TEST(GrammarMatcher, EndOfGenerationTokensOnlyWhenTheGrammarCanEnd) {
  const auto g = gbnf(R"(root ::= "ab" "c"?)");
  const TokenVocab& v = g->vocab();
  ASSERT_FALSE(v.eog_ids().empty());
  const int eos = v.eog_ids()[0];
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_token(eos));
  ASSERT_TRUE(m.accept_text("ab"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.is_done());  // "c" may still come
  const uint64_t* bits = m.mask();
  EXPECT_TRUE((bits[eos >> 6] >> (eos & 63)) & 1);
  EXPECT_TRUE(m.accept_token(eos));
  EXPECT_TRUE(m.is_done());
  EXPECT_FALSE(m.accept_text("c"));
  // Control tokens carry no text: never allowed.
  GrammarMatcher fresh(g);
  EXPECT_FALSE(fresh.accept_token(1));  // <|im_start|>
}

}  // namespace
}  // namespace smolrt::grammar
