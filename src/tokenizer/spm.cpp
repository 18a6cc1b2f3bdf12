#include "tokenizer/spm.h"

#include <cstdio>
#include <queue>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace smolrt {

SpmModel::SpmModel(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                   const std::vector<int32_t>& types, int unk)
    : unk_(unk) {
  for (int& b : byte_id_) b = -1;
  pieces_.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto t = static_cast<TokenType>(types[i]);
    const std::string& p = tokens[i];
    if (t == TokenType::Byte) {
      unsigned v = 0;
      char tail = 0;
      if (p.size() == 6 && std::sscanf(p.c_str(), "<0x%2X%c", &v, &tail) == 2 && tail == '>') {
        byte_id_[v] = static_cast<int>(i);
      }
      continue;
    }
    if (t != TokenType::Normal && t != TokenType::UserDefined) continue;
    if (p.empty()) continue;
    // The first id of a duplicated piece wins.
    pieces_.emplace(p, Entry{static_cast<int>(i), scores.empty() ? 0.0f : scores[i]});
  }
}

void SpmModel::encode(std::string_view text, std::vector<int>& out) const {
  if (text.empty()) return;
  struct Sym {
    uint32_t start, len;
    int prev, next;
  };
  struct Cand {
    float score;
    int left, right;
    uint32_t len;  // bytes of the merged text, to detect stale entries
    bool operator<(const Cand& o) const {
      return score != o.score ? score < o.score : left > o.left;  // max score, then leftmost
    }
  };
  std::vector<unicode::Char> chars;
  unicode::decode_utf8(text, chars);
  const int n = static_cast<int>(chars.size());
  std::vector<Sym> sym(chars.size());
  for (int i = 0; i < n; ++i)
    sym[i] = {chars[i].offset, chars[i].len, i - 1, i + 1 < n ? i + 1 : -1};

  std::priority_queue<Cand> heap;
  auto consider = [&](int l) {
    if (l < 0 || sym[l].next < 0) return;
    const Sym& r = sym[sym[l].next];
    const uint32_t len = sym[l].len + r.len;
    auto it = pieces_.find(text.substr(sym[l].start, len));
    if (it != pieces_.end()) heap.push({it->second.score, l, sym[l].next, len});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = sym[c.left];
    if (l.len == 0 || l.next != c.right || l.len + sym[c.right].len != c.len) continue;  // stale
    Sym& r = sym[c.right];
    l.len += r.len;
    l.next = r.next;
    if (l.next >= 0) sym[l.next].prev = c.left;
    r.len = 0;
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].len);
    auto it = pieces_.find(piece);
    if (it != pieces_.end()) {
      out.push_back(it->second.id);
      continue;
    }
    for (unsigned char b : piece) {
      if (byte_id_[b] >= 0) {
        out.push_back(byte_id_[b]);
      } else if (unk_ >= 0) {
        out.push_back(unk_);
      } else {
        fail("SPM vocab has neither a <0x", std::hex, int{b},
             "> byte token nor an unknown token; cannot encode this text");
      }
    }
  }
}

}  // namespace smolrt
