// Tokenizer: special-token splitting, dispatch to byte-level BPE or SPM, decoding, streaming.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"

namespace smolrt {

namespace {
const char kSpmSpace[] = "\xE2\x96\x81";  // U+2581 "▁"

// Pieces that mark the end of a generation when they are control tokens, besides eos/eot.
constexpr const char* kEogPieces[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",   "<|end|>",
                                      "</s>",       "<|eom_id|>",    "<end_of_turn>"};
}  // namespace

struct Tokenizer::Impl {
  VocabData v;
  bool spm = false;
  PreTokenizer pre = PreTokenizer::Gpt2;
  std::optional<BpeModel> bpe;
  std::optional<SpmModel> spm_model;
  std::vector<bool> eog;
  // Tokens matched in raw text, longest first; `always` = user-defined (matched even without
  // parse_special), else control/unknown.
  struct Special {
    std::string text;
    int id;
    bool always;
  };
  std::vector<Special> specials;
  bool first_byte[256] = {};

  void encode_text(std::string_view text, bool prefix_space, std::vector<int>& out) const;
};

// --- construction ---------------------------------------------------------------------------

Tokenizer::Tokenizer(VocabData v) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const size_t n = v.tokens.size();
  if (n == 0) fail("tokenizer.ggml.tokens is empty; the file has no vocabulary");
  if (v.token_types.empty()) v.token_types.assign(n, static_cast<int32_t>(TokenType::Normal));
  if (v.token_types.size() != n) {
    fail("tokenizer.ggml.token_type has ", v.token_types.size(), " entries but there are ", n,
         " tokens; the vocab arrays must be the same length");
  }
  for (int id : {v.bos, v.eos, v.unk, v.pad, v.eot}) {
    if (id >= static_cast<int>(n)) {
      fail("special token id ", id, " is out of range for a vocab of ", n,
           " tokens; fix tokenizer.ggml.*_token_id");
    }
  }
  if (v.model == "gpt2") {
    m.pre = pre_tokenizer_from_name(v.pre);
    PieceMap piece_to_id;
    piece_to_id.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto t = static_cast<TokenType>(v.token_types[i]);
      if (t == TokenType::Normal || t == TokenType::Byte) {
        piece_to_id.emplace(v.tokens[i], static_cast<int>(i));
      }
    }
    const bool ignore = v.ignore_merges < 0 ? m.pre == PreTokenizer::Llama3 : v.ignore_merges != 0;
    m.bpe.emplace(v.merges, piece_to_id, v.unk, ignore);
  } else if (v.model == "llama") {
    m.spm = true;
    if (!v.scores.empty() && v.scores.size() != n) {
      fail("tokenizer.ggml.scores has ", v.scores.size(), " entries but there are ", n,
           " tokens; the vocab arrays must be the same length");
    }
    m.spm_model.emplace(v.tokens, v.scores, v.token_types, v.unk);
  } else {
    fail("unknown tokenizer model '", v.model,
         "' (tokenizer.ggml.model); known: gpt2 (byte-level BPE), llama (SentencePiece BPE)");
  }
  m.eog.assign(n, false);
  for (int id : {v.eos, v.eot}) {
    if (id >= 0) m.eog[id] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    const auto t = static_cast<TokenType>(v.token_types[i]);
    const bool control = t == TokenType::Control || t == TokenType::Unknown;
    if ((control || t == TokenType::UserDefined) && !v.tokens[i].empty()) {
      m.specials.push_back({v.tokens[i], static_cast<int>(i), t == TokenType::UserDefined});
      m.first_byte[static_cast<unsigned char>(v.tokens[i][0])] = true;
    }
    if (t == TokenType::Control) {
      for (const char* p : kEogPieces) {
        if (v.tokens[i] == p) m.eog[i] = true;
      }
    }
  }
  std::stable_sort(m.specials.begin(), m.specials.end(),
                   [](const auto& a, const auto& b) { return a.text.size() > b.text.size(); });
  m.v = std::move(v);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

// --- encoding -------------------------------------------------------------------------------

void Tokenizer::Impl::encode_text(std::string_view text, bool prefix_space,
                                  std::vector<int>& out) const {
  if (spm) {
    // Spaces become "▁"; with add_space_prefix a "▁" is prepended at the start of the text and
    // after a token written in it (prefix_space).
    std::string esc;
    esc.reserve(text.size() + text.size() / 4 + 3);
    if (prefix_space) esc += kSpmSpace;
    for (char c : text) {
      if (c == ' ') {
        esc += kSpmSpace;
      } else {
        esc.push_back(c);
      }
    }
    spm_model->encode(esc, out);
    return;
  }
  thread_local std::vector<unicode::Char> chars;
  thread_local std::vector<WordSpan> words;
  unicode::decode_utf8(text, chars);
  words.clear();
  pre_tokenize(pre, chars, words);
  for (const auto& [b, e] : words) bpe->encode_word(text.substr(b, e - b), out);
}

std::vector<int> Tokenizer::encode(std::string_view text, bool parse_special, int add_bos,
                                   std::span<const std::pair<size_t, size_t>> plain) const {
  const Impl& m = *impl_;
  std::vector<int> out;
  out.reserve(text.size() / 3 + 2);
  const bool bos = add_bos < 0 ? m.v.add_bos : add_bos > 0;
  if (bos && m.v.bos >= 0) out.push_back(m.v.bos);
  // SPM with add_space_prefix: a leading "▁" on the first text run and after every token matched
  // in the text (llama.cpp's rule).
  bool after_special = m.v.add_space_prefix;
  size_t start = 0, i = 0;
  size_t r = 0;  // the first plain range not entirely before i
  while (i < text.size()) {
    const Impl::Special* hit = nullptr;
    if (m.first_byte[static_cast<unsigned char>(text[i])]) {
      while (r < plain.size() && plain[r].second <= i) ++r;
      for (const auto& s : m.specials) {  // longest first: leftmost-longest match
        if (!(parse_special || s.always) || text.compare(i, s.text.size(), s.text) != 0) continue;
        // A control token overlapping plain text is plain text.
        if (!s.always && r < plain.size() && plain[r].first < i + s.text.size()) continue;
        hit = &s;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    if (i > start) m.encode_text(text.substr(start, i - start), after_special, out);
    out.push_back(hit->id);
    after_special = m.v.add_space_prefix;
    i += hit->text.size();
    start = i;
  }
  if (start < text.size()) m.encode_text(text.substr(start), after_special, out);
  if (m.v.add_eos && add_bos != 0 && m.v.eos >= 0) out.push_back(m.v.eos);
  return out;
}

// --- decoding -------------------------------------------------------------------------------

namespace detail {

// Appends the text of one token. `at_start` is true at the beginning of a sequence and after a
// control, unknown or (SPM) user-defined token: there an SPM vocab with add_space_prefix drops
// the "▁" that encoding prepended. Updated for the next token.
void decode_token(const VocabData& v, int id, bool special, std::string& out, bool& at_start) {
  if (id < 0 || id >= static_cast<int>(v.tokens.size())) {
    fail("token id ", id, " is out of range (vocab has ", v.tokens.size(), " tokens)");
  }
  const std::string& p = v.tokens[id];
  const auto t = static_cast<TokenType>(v.token_types[id]);
  if (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::Unused) {
    if (special && t != TokenType::Unused) out += p;
    at_start = true;
    return;
  }
  if (v.model == "llama") {
    if (t == TokenType::Byte) {
      unsigned b = 0;
      if (p.size() == 6 && std::sscanf(p.c_str(), "<0x%2X", &b) == 1) {
        out.push_back(static_cast<char>(b));
        at_start = false;
        return;
      }
    }
    size_t i = 0;
    if (at_start && v.add_space_prefix && p.compare(0, 3, kSpmSpace) == 0) i = 3;
    at_start = t == TokenType::UserDefined;  // encoding prepends "▁" after one, as after controls
    for (; i < p.size(); ++i) {
      if (p.compare(i, 3, kSpmSpace) == 0) {
        out.push_back(' ');
        i += 2;
      } else {
        out.push_back(p[i]);
      }
    }
    return;
  }
  at_start = false;
  if (t == TokenType::UserDefined) {  // stored as raw text, matched as raw text
    out += p;
    return;
  }
  // Byte-level: every code point of the piece is one byte of the text.
  const auto* s = reinterpret_cast<const unsigned char*>(p.data());
  for (size_t i = 0; i < p.size();) {
    uint32_t cp = 0;
    const int len = unicode::utf8_decode_one(s + i, p.size() - i, &cp);
    const int b = len ? unicode::cp_to_byte(cp) : -1;
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
      i += static_cast<size_t>(len);
    } else {  // not a byte-level code point: keep the piece's bytes as they are
      const size_t k = len ? static_cast<size_t>(len) : 1;
      out.append(p, i, k);
      i += k;
    }
  }
}

}  // namespace detail

std::string Tokenizer::decode(std::span<const int> ids, bool special) const {
  std::string out;
  bool at_start = true;
  for (int id : ids) detail::decode_token(impl_->v, id, special, out, at_start);
  return out;
}

std::string Tokenizer::token_text(int id) const {
  std::string out;
  bool at_start = false;
  detail::decode_token(impl_->v, id, /*special=*/false, out, at_start);
  return out;
}

const std::string& Tokenizer::piece(int id) const {
  if (id < 0 || id >= n_vocab()) {
    fail("token id ", id, " is out of range (vocab has ", n_vocab(), " tokens)");
  }
  return impl_->v.tokens[id];
}

int Tokenizer::n_vocab() const {
  return static_cast<int>(impl_->v.tokens.size());
}
const VocabData& Tokenizer::vocab() const {
  return impl_->v;
}
bool Tokenizer::is_eog(int id) const {
  return id >= 0 && id < n_vocab() && impl_->eog[static_cast<size_t>(id)];
}

// --- streaming ------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& t, bool special) : tok_(&t), special_(special) {}

std::string StreamDecoder::push(int id) {
  detail::decode_token(tok_->vocab(), id, special_, pending_, first_);
  const size_t hold = unicode::incomplete_utf8_tail(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  rest.swap(pending_);
  first_ = true;
  return rest;
}

}  // namespace smolrt
