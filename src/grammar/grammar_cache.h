// Compiled grammars shared across requests: keyed by their source text, least recently used
// evicted beyond a capacity, thread-safe. Concurrent requests for the same new key compile it
// once (the others wait for that compile). A compile that throws caches nothing: every request
// sees the error.
#pragma once

#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "grammar/matcher.h"

namespace smolrt::grammar {

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t capacity = 256);

  // The grammar for `key`, built by `build` and compiled on a miss. Throws what build or
  // compile throw (GrammarError / SchemaError for bad input).
  std::shared_ptr<const CompiledGrammar> get(const std::string& key,
                                             const std::function<Grammar()>& build);
  // response_format json_schema (parse its text with nlohmann::ordered_json to keep property
  // order), json_object, and llama.cpp's `grammar` (GBNF, root rule "root").
  std::shared_ptr<const CompiledGrammar> json_schema(const nlohmann::ordered_json& schema);
  std::shared_ptr<const CompiledGrammar> json_object();
  std::shared_ptr<const CompiledGrammar> gbnf(std::string_view text);

  struct Stats {
    size_t hits = 0, misses = 0, size = 0;
  };
  Stats stats() const;
  const std::shared_ptr<const TokenVocab>& vocab() const { return vocab_; }

 private:
  using Future = std::shared_future<std::shared_ptr<const CompiledGrammar>>;
  struct Entry {
    Future compiled;
    std::list<std::string>::iterator lru;
    uint64_t serial;  // which compile made it
  };

  std::shared_ptr<const TokenVocab> vocab_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // most recent first
  size_t hits_ = 0, misses_ = 0;
  uint64_t serial_ = 0;
};

}  // namespace smolrt::grammar
