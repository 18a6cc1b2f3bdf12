#include "grammar/token_vocab.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace smolrt::grammar {

namespace {

constexpr size_t kDefaultMaskBytes = size_t{128} << 20;

uint64_t hash_words(std::span<const uint64_t> w) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (uint64_t x : w) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  }
  return h;
}

}  // namespace

TokenVocab::TokenVocab(const Tokenizer& tok, size_t max_masks) {
  const int n = tok.n_vocab();
  bytes_.resize(static_cast<size_t>(n));
  eog_.assign(static_cast<size_t>(n), false);
  for (int id = 0; id < n; ++id) {
    if (tok.is_eog(id)) {
      eog_[static_cast<size_t>(id)] = true;
      eog_ids_.push_back(id);
    } else {
      bytes_[static_cast<size_t>(id)] = tok.token_text(id);
    }
  }

  // The trie: sorted token strings, one node per new byte of each (preorder by construction).
  std::vector<int32_t> order;
  for (int id = 0; id < n; ++id)
    if (!bytes_[static_cast<size_t>(id)].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string& x = bytes_[static_cast<size_t>(a)];
    const std::string& y = bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  std::vector<int32_t> path;  // node index at each depth of the current string
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t lcp = 0;
    if (prev) {
      const size_t m = std::min(prev->size(), s.size());
      while (lcp < m && (*prev)[lcp] == s[lcp]) ++lcp;
    }
    while (path.size() > lcp) {
      trie_.nodes[static_cast<size_t>(path.back())].skip = static_cast<int32_t>(trie_.nodes.size());
      path.pop_back();
    }
    if (s.size() > 65535) fail("token ", id, " is longer than 65535 bytes");
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(trie_.nodes.size()));
      trie_.nodes.push_back({-1, static_cast<int32_t>(trie_.tokens.size()),
                             static_cast<uint16_t>(d + 1), static_cast<uint8_t>(s[d])});
    }
    trie_.tokens.push_back(id);  // belongs to the last node created: its string is s
    trie_.max_depth = std::max(trie_.max_depth, static_cast<int>(s.size()));
    prev = &s;
  }
  for (int32_t node : path)
    trie_.nodes[static_cast<size_t>(node)].skip = static_cast<int32_t>(trie_.nodes.size());
  trie_.nodes.push_back({-1, static_cast<int32_t>(trie_.tokens.size()), 0, 0});  // the sentinel

  const size_t mask_bytes = static_cast<size_t>(mask_words()) * 8;
  if (max_masks == 0)
    max_masks = std::max<size_t>(256, kDefaultMaskBytes / std::max<size_t>(mask_bytes, 1));
  slots_.resize(max_masks);
}

int32_t TokenVocab::intern_mask(std::span<const uint64_t> bits) const {
  const size_t words = static_cast<size_t>(mask_words());
  if (bits.size() != words) fail("intern_mask: ", bits.size(), " words, expected ", words);
  const uint64_t h = hash_words(bits);
  std::lock_guard<std::mutex> lock(mu_);
  auto [lo, hi] = by_hash_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (std::memcmp(slots_[static_cast<size_t>(it->second)].get(), bits.data(), words * 8) == 0)
      return it->second;
  }
  const int32_t id = count_.load(std::memory_order_relaxed);
  if (static_cast<size_t>(id) >= slots_.size()) return -1;
  slots_[static_cast<size_t>(id)] = std::make_unique<uint64_t[]>(words);
  std::memcpy(slots_[static_cast<size_t>(id)].get(), bits.data(), words * 8);
  by_hash_.emplace(h, id);
  count_.store(id + 1, std::memory_order_release);
  return id;
}

}  // namespace smolrt::grammar
