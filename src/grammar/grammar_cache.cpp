#include "grammar/grammar_cache.h"

#include <algorithm>

#include "grammar/json_schema.h"

namespace smolrt::grammar {

GrammarCache::GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(std::max<size_t>(capacity, 1)) {
  if (!vocab_) fail("GrammarCache: no vocabulary");
}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& key,
                                                         const std::function<Grammar()>& build) {
  std::promise<std::shared_ptr<const CompiledGrammar>> promise;
  Future future;
  uint64_t serial = 0;  // nonzero: this call compiles
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      future = it->second.compiled;
    } else {
      ++misses_;
      serial = ++serial_;
      future = promise.get_future().share();
      lru_.push_front(key);
      entries_[key] = {future, lru_.begin(), serial};
      while (entries_.size() > capacity_) {  // waiters hold their own copies of the future
        entries_.erase(lru_.back());
        lru_.pop_back();
      }
    }
  }
  if (serial) {  // compile outside the lock; waiters for the same key block on the future
    try {
      promise.set_value(compile(build(), vocab_));
    } catch (...) {
      promise.set_exception(std::current_exception());
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = entries_.find(key); it != entries_.end() && it->second.serial == serial) {
        lru_.erase(it->second.lru);
        entries_.erase(it);
      }
    }
  }
  return future.get();
}

std::shared_ptr<const CompiledGrammar> GrammarCache::json_schema(
    const nlohmann::ordered_json& schema) {
  return get("json_schema:" +
                 schema.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
             [&] { return json_schema_grammar(schema); });
}

std::shared_ptr<const CompiledGrammar> GrammarCache::json_object() {
  return get("json_object", [] { return json_object_grammar(); });
}

std::shared_ptr<const CompiledGrammar> GrammarCache::gbnf(std::string_view text) {
  return get("gbnf:" + std::string(text), [&] { return parse_gbnf(text); });
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {hits_, misses_, entries_.size()};
}

}  // namespace smolrt::grammar
