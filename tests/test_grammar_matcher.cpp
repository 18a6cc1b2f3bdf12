// The token matcher over the real SmolLM2 vocabulary: masks equal a brute-force check (a token
// is allowed iff the matcher accepts it), random walks over 29 schemas give JSON, mask ids are
// shared and stable, the grammar cache compiles once and is thread-safe. The jsonschema oracle
// (tests/grammar/test_schema_walks.py) validates the walks' texts against their schemas.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "grammar_walk.h"
#include "test_util.h"

namespace smolrt::grammar {
namespace {

using nlohmann::ordered_json;
using test::mask_has;

#define REQUIRE_VOCAB(v)                                                                 \
  const Tokenizer* tok_ = test::smollm_tokenizer();                                      \
  if (!tok_)                                                                             \
    GTEST_SKIP() << "skipped: fixtures not found ("                                      \
                 << (fixtures_dir() / "tokenizers/smollm2-135m/tokenizer.json").string() \
                 << "); set SMOLRT_FIXTURES";                                            \
  const std::shared_ptr<const TokenVocab> v = smollm_vocab(*tok_)

std::shared_ptr<const TokenVocab> smollm_vocab(const Tokenizer& tok) {
  static const auto v = std::make_shared<const TokenVocab>(tok);
  return v;
}

const ordered_json& schemas() {
  static const ordered_json s = [] {
    std::ifstream in(std::string(SMOLRT_SOURCE_DIR) + "/tests/grammar/schemas.json");
    return ordered_json::parse(in);
  }();
  return s;
}

// Every token: in the mask iff the matcher accepts it (then undone).
void expect_mask_is_exact(GrammarMatcher& m) {
  const std::vector<uint64_t> bits(m.mask(), m.mask() + m.grammar().vocab().mask_words());
  int allowed = 0, mismatches = 0;
  for (int id = 0; id < m.grammar().vocab().n_vocab(); ++id) {
    const bool ok = m.accept_token(id);
    if (ok) {
      m.rollback(1);
      ++allowed;
    }
    if (ok != mask_has(bits.data(), id) && ++mismatches <= 5) {
      ADD_FAILURE() << "token " << id << " '" << m.grammar().vocab().token_bytes(id)
                    << "': mask says " << mask_has(bits.data(), id) << ", matcher says " << ok;
    }
  }
  EXPECT_GT(allowed, 0) << "no token allowed in a state that is not done";
}

TEST(GrammarMatcherVocab, MaskEqualsBruteForceAlongWalks) {
  REQUIRE_VOCAB(v);
  std::vector<std::shared_ptr<const CompiledGrammar>> grammars;
  for (const char* name : {"ten_fields", "recursive_tree", "unicode_enum", "bounded_numbers"}) {
    for (const auto& s : schemas())
      if (s["name"] == name) grammars.push_back(compile(json_schema_grammar(s["schema"]), v));
  }
  grammars.push_back(compile(json_object_grammar(), v));
  grammars.push_back(compile(parse_gbnf(R"g(root ::= (expr "\n")+
expr ::= term (("+" | "-") term)*
term ::= [0-9]+ | "(" expr ")" | "caf\u00e9" | [\u4e00-\u9fff]{1,2})g"),
                             v));
  std::mt19937 rng(7);
  for (const auto& g : grammars) {
    GrammarMatcher m(g);
    for (int step = 0; step < 40 && !m.is_done(); ++step) {
      if (step % 5 == 0) expect_mask_is_exact(m);
      const uint64_t* bits = m.mask();
      std::vector<int> allowed;
      for (int id = 0; id < v->n_vocab(); ++id)
        if (mask_has(bits, id) && !v->is_eog(id)) allowed.push_back(id);
      if (allowed.empty()) break;
      ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
    }
    if (HasFailure()) return;
  }
}

TEST(GrammarMatcherVocab, RandomWalksOverEverySchemaGiveJson) {
  REQUIRE_VOCAB(v);
  ASSERT_GE(schemas().size(), 20u);
  std::mt19937 rng(1);
  for (const auto& s : schemas()) {
    SCOPED_TRACE(s["name"].get<std::string>());
    const auto g = compile(json_schema_grammar(s["schema"]), v);
    for (int walk = 0; walk < 4; ++walk) {
      GrammarMatcher m(g);
      const std::string text = test::random_walk(m, *tok_, rng, 8 + 8 * walk);
      EXPECT_TRUE(m.is_done());
      EXPECT_TRUE(nlohmann::json::accept(text)) << text;
    }
  }
}

TEST(GrammarMatcherVocab, SpecialTokensNeverMatchAndEosOnlyAtTheEnd) {
  REQUIRE_VOCAB(v);
  const auto g = compile(json_schema_grammar(parse_schema_text(R"({"enum": ["<|im_end|>"]})")), v);
  GrammarMatcher m(g);
  const int im_end = tok_->encode("<|im_end|>", /*parse_special=*/true, 0).at(0);
  EXPECT_TRUE(v->is_eog(im_end));
  EXPECT_FALSE(mask_has(m.mask(), im_end));
  EXPECT_FALSE(m.accept_token(im_end));
  ASSERT_TRUE(m.accept_text("\"<|im_end|>\""));  // the literal text, spelled by normal tokens
  EXPECT_TRUE(mask_has(m.mask(), im_end));
  EXPECT_TRUE(m.accept_token(im_end));
}

TEST(GrammarMatcherVocab, MaskIdsAreSharedStableAndDeduplicated) {
  REQUIRE_VOCAB(v);
  const auto g = compile(json_schema_grammar(schemas()[0]["schema"]), v);
  GrammarMatcher a(g), b(g);
  ASSERT_TRUE(a.accept_text("{\"name\": \"x"));
  ASSERT_TRUE(b.accept_text("{\"name\": \"yz"));
  const int32_t ia = a.mask_id(), ib = b.mask_id();
  EXPECT_GE(ia, 0);
  EXPECT_EQ(ia, ib);  // the same configuration: the same id
  const std::vector<uint64_t> bits(v->mask(ia), v->mask(ia) + v->mask_words());
  // Another grammar in the same string state shares the mask itself (the store dedupes).
  const auto g2 = compile(json_schema_grammar(schemas()[1]["schema"]), v);
  GrammarMatcher c(g2);
  ASSERT_TRUE(c.accept_text("{\"id\":1,\"nickname\":\"q"));
  const int32_t ic = c.mask_id();
  EXPECT_NE(c.grammar().cached_configs(), 0u);
  EXPECT_EQ(std::memcmp(v->mask(ia), bits.data(), bits.size() * 8), 0);  // stable
  const int n_before = v->n_masks();
  a.rollback(1);
  ASSERT_TRUE(a.accept_text("{\"name\": \"x"));
  EXPECT_EQ(a.mask_id(), ia);
  EXPECT_EQ(v->n_masks(), n_before);  // a cache hit adds nothing
  (void)ic;
}

// A grammar so ambiguous that its stacks multiply with every byte (a rule that can match nothing,
// calling itself twice per byte, "." matching any byte) would take seconds per mask over a real
// vocabulary; past the matcher's work limit it is a GrammarError naming the cause, and an
// unambiguous grammar of the same language is not.
TEST(GrammarMatcherVocab, AGrammarPastTheWorkLimitIsAnError) {
  REQUIRE_VOCAB(v);
  const auto bad = compile(parse_gbnf("root ::= a \".\"\na ::= | \"x\" a a | . a a | \"\""), v);
  GrammarMatcher m(bad);
  try {
    m.mask();
    ADD_FAILURE() << "no error";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
  GrammarMatcher ok(compile(parse_gbnf("root ::= [^\\x00]* \".\""), v));
  EXPECT_NE(ok.mask(), nullptr);
  EXPECT_TRUE(ok.accept_text("xx."));
}

TEST(GrammarMatcherVocab, FullMaskStoreStillGivesMasks) {
  REQUIRE_VOCAB(v);
  const auto small = std::make_shared<const TokenVocab>(*tok_, /*max_masks=*/1);
  const auto g = compile(json_object_grammar(), small);
  GrammarMatcher m(g);
  EXPECT_EQ(m.mask_id(), 0);
  const int brace = tok_->encode("{", false, 0).at(0);
  EXPECT_TRUE(mask_has(m.mask(), brace));
  ASSERT_TRUE(m.accept_token(brace));
  EXPECT_EQ(m.mask_id(), -1);  // no room for a second mask: bits without an id
  const int quote = tok_->encode("\"", false, 0).at(0);
  EXPECT_TRUE(mask_has(m.mask(), quote));
  EXPECT_FALSE(mask_has(m.mask(), brace));
}

TEST(GrammarCache, CompilesOnceSharesAndEvicts) {
  REQUIRE_VOCAB(v);
  GrammarCache cache(v, /*capacity=*/2);
  const ordered_json s1 = parse_schema_text(R"({"type": "integer"})");
  const ordered_json s2 = parse_schema_text(R"({"type": "boolean"})");
  const ordered_json s3 = parse_schema_text(R"({"type": "null"})");
  const auto a = cache.json_schema(s1);
  EXPECT_EQ(cache.json_schema(s1), a);
  cache.json_schema(s2);
  cache.json_schema(s3);  // evicts s1 (least recently used)
  EXPECT_EQ(cache.stats().size, 2u);
  EXPECT_NE(cache.json_schema(s1), a);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 4u);
  // Errors are not cached, and every caller sees them.
  const ordered_json bad = parse_schema_text(R"({"type": "string", "pattern": "x"})");
  EXPECT_THROW(cache.json_schema(bad), SchemaError);
  EXPECT_THROW(cache.json_schema(bad), SchemaError);
  EXPECT_THROW(cache.gbnf("root ::= ("), GrammarError);
  EXPECT_EQ(cache.gbnf("root ::= \"a\""), cache.gbnf("root ::= \"a\""));
  EXPECT_EQ(cache.json_object(), cache.json_object());
}

TEST(GrammarCache, ConcurrentRequestsCompileOnceAndAgreeOnMasks) {
  REQUIRE_VOCAB(v);
  GrammarCache cache(v);
  const ordered_json& schema = schemas()[21]["schema"];  // ten_fields
  std::vector<std::thread> threads;
  std::vector<std::string> texts(4);
  std::vector<std::vector<int32_t>> ids(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const auto g = cache.json_schema(schema);
      GrammarMatcher m(g);
      std::mt19937 rng(42);  // the same walk in every thread
      texts[t] = test::random_walk(m, *tok_, rng, 30);
      m.reset();
      ASSERT_TRUE(m.accept_text(texts[t]));
      ids[t].push_back(m.mask_id());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(cache.stats().misses, 1u);
  for (int t = 1; t < 4; ++t) {
    EXPECT_EQ(texts[t], texts[0]);
    EXPECT_EQ(ids[t], ids[0]);
  }
}

}  // namespace
}  // namespace smolrt::grammar
