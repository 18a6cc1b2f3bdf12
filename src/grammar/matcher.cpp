#include "grammar/matcher.h"

#include <algorithm>
#include <mutex>

#include "grammar/closure.h"

namespace smolrt::grammar {

using detail::Automaton;
using detail::Node;
using detail::Thread;

namespace {

// Cached configurations per grammar; beyond this the cache starts over (ids stay valid: they
// live in the vocab's mask store).
constexpr size_t kMaxCachedConfigs = 1 << 18;

// The matcher's node store: hash-consed, so equal stacks are equal ids.
struct MatcherStore {
  std::vector<Node>& nodes;
  detail::NodeIds& ids;

  Node at(int32_t id) const { return nodes[static_cast<size_t>(id)]; }
  int32_t add(int32_t state, int32_t parent) {
    const int32_t depth = parent < 0 ? 1 : at(parent).depth + 1;
    if (depth > GrammarMatcher::kMaxStackDepth) return -1;
    auto [it, fresh] =
        ids.try_emplace(detail::node_key(state, parent), static_cast<int32_t>(nodes.size()));
    if (fresh) nodes.push_back({state, parent, depth});
    return it->second;
  }
};

}  // namespace

size_t detail::KeyHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 1469598103934665603ull;
  for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

// --- CompiledGrammar --------------------------------------------------------------------------

CompiledGrammar::CompiledGrammar(Automaton a, std::shared_ptr<const TokenVocab> vocab)
    : a_(std::move(a)), vocab_(std::move(vocab)) {}

size_t CompiledGrammar::cached_configs() const {
  std::shared_lock lock(mu_);
  return masks_.size();
}

int32_t CompiledGrammar::find_mask(const std::vector<int32_t>& key) const {
  std::shared_lock lock(mu_);
  auto it = masks_.find(key);
  return it == masks_.end() ? -2 : it->second;
}

void CompiledGrammar::store_mask(const std::vector<int32_t>& key, int32_t id) const {
  std::unique_lock lock(mu_);
  if (masks_.size() >= kMaxCachedConfigs) masks_.clear();
  masks_.emplace(key, id);
}

std::shared_ptr<const CompiledGrammar> compile(const Grammar& g,
                                               std::shared_ptr<const TokenVocab> vocab) {
  if (!vocab) fail("grammar compile: no vocabulary");
  return std::make_shared<const CompiledGrammar>(detail::build_automaton(g), std::move(vocab));
}

// --- GrammarMatcher ---------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)) {
  if (!g_) fail("GrammarMatcher: no grammar");
  bits_.resize(static_cast<size_t>(g_->vocab().mask_words()));
  start();
}

void GrammarMatcher::start() {
  threads_.clear();
  nodes_.clear();
  node_ids_.clear();
  history_.clear();
  saved_threads_.clear();
  mask_id_ = -2;
  const Automaton& a = g_->automaton();
  MatcherStore store{nodes_, node_ids_};
  std::vector<Thread> work, seen;
  detail::Work w;
  can_end_ = detail::close_into(a, store, {a.root_start, -1}, threads_, 0, work, seen, w);
  std::sort(threads_.begin(), threads_.end(), [](Thread x, Thread y) {
    return x.state != y.state ? x.state < y.state : x.parent < y.parent;
  });
}

void GrammarMatcher::reset() {
  start();
}

void GrammarMatcher::push_snapshot(size_t n_nodes) {
  history_.push_back({saved_threads_.size(), threads_.size(), n_nodes, can_end_});
  saved_threads_.insert(saved_threads_.end(), threads_.begin(), threads_.end());
  mask_id_ = -2;
}

void GrammarMatcher::truncate_nodes(size_t n) {
  for (size_t i = n; i < nodes_.size(); ++i)
    node_ids_.erase(detail::node_key(nodes_[i].state, nodes_[i].parent));
  nodes_.resize(n);
}

void GrammarMatcher::rollback(int n) {
  if (n < 0 || n > accepted())
    fail("grammar rollback of ", n, " steps, but only ", accepted(), " were accepted");
  for (int i = 0; i < n; ++i) {
    const Snapshot s = history_.back();
    history_.pop_back();
    threads_.assign(
        saved_threads_.begin() + static_cast<std::ptrdiff_t>(s.threads_at),
        saved_threads_.begin() + static_cast<std::ptrdiff_t>(s.threads_at + s.n_threads));
    saved_threads_.resize(s.threads_at);
    can_end_ = s.can_end;
    truncate_nodes(s.n_nodes);
  }
  mask_id_ = -2;
}

bool GrammarMatcher::accept_token(int id) {
  const TokenVocab& v = g_->vocab();
  if (id < 0 || id >= v.n_vocab()) return false;
  if (v.is_eog(id)) {
    if (!can_end_) return false;
    push_snapshot(nodes_.size());
    threads_.clear();
    return true;
  }
  const std::string& bytes = v.token_bytes(id);
  return !bytes.empty() && accept_text(bytes);
}

bool GrammarMatcher::accept_text(std::string_view text) {
  const size_t n_nodes = nodes_.size();
  if (advance(text)) return true;
  truncate_nodes(n_nodes);
  return false;
}

// Steps every thread over the bytes; on success records the previous position in the history.
bool GrammarMatcher::advance(std::string_view bytes) {
  const size_t n_nodes = nodes_.size();
  const Automaton& a = g_->automaton();
  const auto nc = static_cast<size_t>(a.n_classes);
  MatcherStore store{nodes_, node_ids_};
  thread_local std::vector<Thread> cur, next, work, seen;
  detail::Work w;
  cur.assign(threads_.begin(), threads_.end());
  bool can = can_end_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    next.clear();
    can = false;
    const size_t c = a.byte_class[static_cast<uint8_t>(bytes[i])];
    for (const Thread t : cur) {
      const int32_t s2 = a.next[static_cast<size_t>(t.state) * nc + c];
      if (s2 < 0) continue;
      if (a.flags[static_cast<size_t>(s2)] & detail::kPlain) {
        detail::push_unique(next, 0, {s2, t.parent}, w);
      } else {
        can = detail::close_into(a, store, {s2, t.parent}, next, 0, work, seen, w) || can;
      }
    }
    if (next.empty() && (i + 1 < bytes.size() || !can)) return false;
    std::swap(cur, next);
  }
  push_snapshot(n_nodes);
  threads_.assign(cur.begin(), cur.end());
  std::sort(threads_.begin(), threads_.end(), [](Thread x, Thread y) {
    return x.state != y.state ? x.state < y.state : x.parent < y.parent;
  });
  can_end_ = can;
  mask_id_ = -2;
  return true;
}

// The configuration as a canonical key: can_end, then each thread's states from the top of its
// stack down (-1 after each), threads in lexicographic order.
void GrammarMatcher::build_key() {
  key_.clear();
  key_.push_back(can_end_ ? 1 : 0);
  thread_local std::vector<int32_t> flat;
  thread_local std::vector<std::pair<size_t, size_t>> spans;
  flat.clear();
  spans.clear();
  for (const Thread& t : threads_) {
    const size_t from = flat.size();
    flat.push_back(t.state);
    for (int32_t p = t.parent; p >= 0; p = nodes_[static_cast<size_t>(p)].parent)
      flat.push_back(nodes_[static_cast<size_t>(p)].state);
    flat.push_back(-1);
    spans.push_back({from, flat.size()});
  }
  if (spans.size() > 1) {
    std::sort(spans.begin(), spans.end(), [](auto x, auto y) {
      return std::lexicographical_compare(flat.begin() + static_cast<std::ptrdiff_t>(x.first),
                                          flat.begin() + static_cast<std::ptrdiff_t>(x.second),
                                          flat.begin() + static_cast<std::ptrdiff_t>(y.first),
                                          flat.begin() + static_cast<std::ptrdiff_t>(y.second));
    });
  }
  for (auto [from, to] : spans)
    key_.insert(key_.end(), flat.begin() + static_cast<std::ptrdiff_t>(from),
                flat.begin() + static_cast<std::ptrdiff_t>(to));
}

void GrammarMatcher::compute_bits() {
  detail::compute_mask(g_->automaton(), g_->vocab(), threads_, nodes_, node_ids_, can_end_,
                       bits_.data());
}

int32_t GrammarMatcher::mask_id() {
  if (mask_id_ != -2) return mask_id_;
  build_key();
  int32_t id = g_->find_mask(key_);
  if (id == -2) {
    compute_bits();
    id = g_->vocab().intern_mask(bits_);
    if (id >= 0) g_->store_mask(key_, id);
  }
  mask_id_ = id;
  return id;
}

const uint64_t* GrammarMatcher::mask() {
  const int32_t id = mask_id();
  return id >= 0 ? g_->vocab().mask(id) : bits_.data();
}

std::string GrammarMatcher::shortest_completion() const {
  if (can_end_) return "";
  const Automaton& a = g_->automaton();
  auto total = [&](const Thread& t) {
    int64_t d = a.dist[static_cast<size_t>(t.state)];
    for (int32_t p = t.parent; p >= 0; p = nodes_[static_cast<size_t>(p)].parent)
      d += a.dist[static_cast<size_t>(nodes_[static_cast<size_t>(p)].state)];
    return d;
  };
  const Thread* best = nullptr;
  for (const Thread& t : threads_)
    if (!best || total(t) < total(*best)) best = &t;
  if (!best) return "";
  // States still to finish, innermost last: the thread's state, then its stack's return states.
  std::vector<int32_t> todo;
  for (int32_t p = best->parent; p >= 0; p = nodes_[static_cast<size_t>(p)].parent)
    todo.push_back(nodes_[static_cast<size_t>(p)].state);
  std::reverse(todo.begin(), todo.end());
  todo.push_back(best->state);
  std::string out;
  const auto nc = static_cast<size_t>(a.n_classes);
  while (!todo.empty()) {
    int32_t s = todo.back();
    todo.pop_back();
    const auto ss = static_cast<size_t>(s);
    const int64_t d = a.dist[ss];
    if (d == 0 && (a.flags[ss] & detail::kAccept)) continue;
    auto below = [&](int32_t t) { return a.rank[static_cast<size_t>(t)] < a.rank[ss]; };
    bool moved = false;
    for (size_t c = 0; c < nc && !moved; ++c) {
      const int32_t t = a.next[ss * nc + c];
      if (t >= 0 && below(t) && 1 + a.dist[static_cast<size_t>(t)] == d) {
        out.push_back(static_cast<char>(a.class_byte[c]));
        todo.push_back(t);
        moved = true;
      }
    }
    for (int32_t k = a.call_begin[ss]; k < a.call_begin[ss + 1] && !moved; ++k) {
      const Automaton::Call call = a.calls[static_cast<size_t>(k)];
      const int32_t start = a.rule_start[static_cast<size_t>(call.rule)];
      if (below(start) && below(call.ret) &&
          a.dist[static_cast<size_t>(start)] + a.dist[static_cast<size_t>(call.ret)] == d) {
        todo.push_back(call.ret);
        todo.push_back(start);
        moved = true;
      }
    }
    if (!moved) fail("grammar: no shortest completion from state ", s, " (internal error)");
  }
  return out;
}

}  // namespace smolrt::grammar
