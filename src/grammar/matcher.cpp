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
  const bool nests = a.max_min_depth > 0;  // else every step fits
  for (size_t i = 0; i < bytes.size(); ++i) {
    next.clear();
    can = false;
    const size_t c = a.byte_class[static_cast<uint8_t>(bytes[i])];
    for (const Thread t : cur) {
      const int32_t s2 = a.next[static_cast<size_t>(t.state) * nc + c];
      if (s2 < 0 || (nests && !detail::fits(a, store, s2, t.parent))) continue;
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

// Each frame of the chosen thread is finished in turn, top first, each with the calls that may
// still nest above it (its room). Where a.dist_depth fits the room, the shortest path of a.dist
// does; elsewhere (near the nesting limit) the distances within k nested calls are computed for
// k up to the largest such room, from 0 up (bounded_distances), and followed instead.
std::string GrammarMatcher::shortest_completion() const {
  if (can_end_) return "";
  const Automaton& a = g_->automaton();
  struct Frame {
    int32_t state, room;
  };
  // The frames of a thread: its state, then its stack's return states (top first).
  auto frames = [&](const Thread& t, auto&& visit) {
    int32_t room =
        kMaxStackDepth - (t.parent < 0 ? 0 : nodes_[static_cast<size_t>(t.parent)].depth);
    visit(Frame{t.state, room});
    for (int32_t p = t.parent; p >= 0; p = nodes_[static_cast<size_t>(p)].parent) {
      const Node& n = nodes_[static_cast<size_t>(p)];
      visit(Frame{n.state, kMaxStackDepth - n.depth + 1});
    }
  };
  auto unbounded = [&](Frame f) { return a.dist_depth[static_cast<size_t>(f.state)] <= f.room; };
  int32_t max_room = -1;  // the largest room a shortest path does not fit
  for (const Thread& t : threads_)
    frames(t, [&](Frame f) {
      if (!unbounded(f)) max_room = std::max(max_room, f.room);
    });
  // bdist[k], brank[k]: within k nested calls, for k up to max_room or until the distances stop
  // changing (the next k would compute from the same distances: the same again).
  std::vector<std::vector<int64_t>> bdist;
  std::vector<std::vector<int32_t>> brank;
  for (int32_t k = 0; k <= max_room; ++k) {
    bdist.emplace_back();
    brank.emplace_back();
    detail::bounded_distances(
        a, k ? std::span<const int64_t>(bdist[bdist.size() - 2]) : std::span<const int64_t>(),
        bdist.back(), brank.back());
    if (k && bdist.back() == bdist[bdist.size() - 2]) break;
  }
  auto layer = [&](int32_t room) { return std::min(static_cast<size_t>(room), bdist.size() - 1); };
  auto cost = [&](Frame f) {
    const auto ss = static_cast<size_t>(f.state);
    return unbounded(f) ? a.dist[ss] : bdist[layer(f.room)][ss];
  };
  const Thread* best = nullptr;
  int64_t best_cost = 0;
  for (const Thread& t : threads_) {
    int64_t total = 0;
    frames(t, [&](Frame f) { total += cost(f); });
    if (!best || total < best_cost) {
      best = &t;
      best_cost = total;
    }
  }
  if (!best) return "";
  std::vector<Frame> todo;  // innermost last
  frames(*best, [&](Frame f) { todo.push_back(f); });
  std::reverse(todo.begin(), todo.end());
  std::string out;
  const auto nc = static_cast<size_t>(a.n_classes);
  while (!todo.empty()) {
    const Frame f = todo.back();
    todo.pop_back();
    const auto ss = static_cast<size_t>(f.state);
    if (a.flags[ss] & detail::kAccept) continue;  // cost 0: done
    const bool free = unbounded(f);
    const std::vector<int64_t>& dist = free ? a.dist : bdist[layer(f.room)];
    const std::vector<int32_t>& rank = free ? a.rank : brank[layer(f.room)];
    const int64_t d = dist[ss];
    // A step is taken when it achieves d, its inputs from the same distances rank below the state
    // (so the walk ends), and, on the shortest path of a.dist, each target's dist_depth fits.
    auto below = [&](int32_t t) { return rank[static_cast<size_t>(t)] < rank[ss]; };
    auto fits = [&](int32_t t, int32_t room) {
      return !free || a.dist_depth[static_cast<size_t>(t)] <= room;
    };
    bool moved = false;
    for (size_t c = 0; c < nc && !moved; ++c) {
      const int32_t t = a.next[ss * nc + c];
      if (t >= 0 && below(t) && 1 + dist[static_cast<size_t>(t)] == d && fits(t, f.room)) {
        out.push_back(static_cast<char>(a.class_byte[c]));
        todo.push_back({t, f.room});
        moved = true;
      }
    }
    for (int32_t k = a.call_begin[ss]; k < a.call_begin[ss + 1] && !moved; ++k) {
      const Automaton::Call call = a.calls[static_cast<size_t>(k)];
      const int32_t start = a.rule_start[static_cast<size_t>(call.rule)];
      const bool tail = (a.flags[static_cast<size_t>(call.ret)] & detail::kSinkFinal) != 0;
      const int32_t inner = tail ? f.room : f.room - 1;  // the callee's room
      if (inner < 0) continue;
      // The callee's cost: from the same distances, or (a frame pushed, near the limit) from
      // those within one call less, which are final already.
      const bool same = free || tail;
      const int64_t start_cost =
          same ? dist[static_cast<size_t>(start)] : bdist[layer(inner)][static_cast<size_t>(start)];
      if ((!same || below(start)) && below(call.ret) &&
          start_cost + dist[static_cast<size_t>(call.ret)] == d && fits(start, inner) &&
          fits(call.ret, f.room)) {
        todo.push_back({call.ret, f.room});
        todo.push_back({start, inner});
        moved = true;
      }
    }
    if (!moved) fail("grammar: no shortest completion from state ", f.state, " (internal error)");
  }
  return out;
}

}  // namespace smolrt::grammar
