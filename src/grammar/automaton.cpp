// Grammar -> byte-level NFA per called rule (inlining small non-recursive rules, code-point
// classes split into UTF-8 byte-range sequences) -> DFA per rule by subset construction (call
// edges are symbols like bytes) -> fewest-bytes-to-finish per state (Knuth's generalization of
// Dijkstra, since a call edge costs the callee's shortest text), dead transitions removed, a
// left-recursion check, and the fewest nested calls to finish per state (the same way).
#include "grammar/automaton.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <unordered_map>
#include <utility>

#include "tokenizer/unicode.h"

namespace smolrt::grammar::detail {

namespace {

constexpr int kInlineMaxStates = 3000;  // a rule inlined at each use when its NFA is this small
constexpr int kInlineMaxDepth = 600;    // emission recursion depth beyond which rules are called
constexpr size_t kMaxSubsetWork = size_t{4} << 20;  // NFA states summed over the DFA states

// --- UTF-8 byte-range sequences for a code-point range ------------------------------------------

using ByteRange = std::pair<uint8_t, uint8_t>;
using Utf8Seq = std::vector<ByteRange>;

int utf8_len(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

std::string encode(uint32_t cp) {
  std::string s;
  unicode::append_utf8(cp, s);
  return s;
}

// Splits [lo, hi] (no surrogates) until each piece is a product of byte ranges (RE2's method).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<Utf8Seq>& out) {
  if (lo > hi) return;
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && max < hi) {
      utf8_sequences(lo, max, out);
      utf8_sequences(max + 1, hi, out);
      return;
    }
  }
  const int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = encode(lo), b = encode(hi);
  Utf8Seq seq;
  for (size_t i = 0; i < a.size(); ++i)
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  out.push_back(std::move(seq));
}

// The class's code points as sorted disjoint ranges, negation applied, surrogates removed.
std::vector<CharRange> normalize(const Expr& e) {
  std::vector<CharRange> r;
  for (CharRange c : e.ranges) {
    if (c.lo > c.hi || c.lo > kMaxCodePoint) continue;
    r.push_back({c.lo, std::min(c.hi, kMaxCodePoint)});
  }
  std::sort(r.begin(), r.end(), [](CharRange a, CharRange b) { return a.lo < b.lo; });
  std::vector<CharRange> merged;
  for (CharRange c : r) {
    if (!merged.empty() && c.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, c.hi);
    } else {
      merged.push_back(c);
    }
  }
  if (e.negated) {
    std::vector<CharRange> comp;
    uint32_t next = 0;
    for (CharRange c : merged) {
      if (c.lo > next) comp.push_back({next, c.lo - 1});
      next = c.hi + 1;
    }
    if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
    merged = std::move(comp);
  }
  std::vector<CharRange> out;
  for (CharRange c : merged) {
    if (c.hi < 0xD800 || c.lo > 0xDFFF) {
      out.push_back(c);
      continue;
    }
    if (c.lo < 0xD800) out.push_back({c.lo, 0xD7FF});
    if (c.hi > 0xDFFF) out.push_back({0xE000, c.hi});
  }
  return out;
}

// --- rules that are (mutually) recursive: never inlined -----------------------------------------

void collect_refs(const Expr& e, std::vector<int>& out) {
  if (e.kind == Expr::Kind::kRef) out.push_back(e.rule);
  for (const Expr& i : e.items) collect_refs(i, out);
}

// Iterative Tarjan: a rule is recursive when its strongly connected component has more than one
// rule or it references itself.
std::vector<bool> recursive_rules(const Grammar& g) {
  const int n = static_cast<int>(g.rules.size());
  std::vector<std::vector<int>> adj(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    collect_refs(g.rules[static_cast<size_t>(r)].body, adj[static_cast<size_t>(r)]);
  std::vector<int> index(static_cast<size_t>(n), -1), low(static_cast<size_t>(n), 0);
  std::vector<bool> on_stack(static_cast<size_t>(n), false), rec(static_cast<size_t>(n), false);
  std::vector<int> stack;
  std::vector<std::pair<int, size_t>> call;  // (rule, next edge)
  int counter = 0;
  for (int s = 0; s < n; ++s) {
    if (index[static_cast<size_t>(s)] >= 0) continue;
    call.push_back({s, 0});
    while (!call.empty()) {
      auto& [v, ei] = call.back();
      const auto vs = static_cast<size_t>(v);
      if (ei == 0 && index[vs] < 0) {
        index[vs] = low[vs] = counter++;
        stack.push_back(v);
        on_stack[vs] = true;
      }
      if (ei < adj[vs].size()) {
        const int w = adj[vs][ei++];
        const auto ws = static_cast<size_t>(w);
        if (w == v) rec[vs] = true;
        if (index[ws] < 0) {
          call.push_back({w, 0});
        } else if (on_stack[ws]) {
          low[vs] = std::min(low[vs], index[ws]);
        }
        continue;
      }
      if (low[vs] == index[vs]) {
        std::vector<int> comp;
        int w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[static_cast<size_t>(w)] = false;
          comp.push_back(w);
        } while (w != v);
        if (comp.size() > 1)
          for (int c : comp) rec[static_cast<size_t>(c)] = true;
      }
      const int done = v;
      call.pop_back();
      if (!call.empty()) {
        const auto p = static_cast<size_t>(call.back().first);
        low[p] = std::min(low[p], low[static_cast<size_t>(done)]);
      }
    }
  }
  return rec;
}

// --- NFA ----------------------------------------------------------------------------------------

enum class EdgeKind : uint8_t { kEps, kByte, kCall };

struct NfaEdge {
  int32_t to;
  int32_t rule;  // kCall
  uint8_t lo, hi;
  EdgeKind kind;
};

class NfaBuilder {
 public:
  explicit NfaBuilder(const Grammar& g)
      : rule_start(g.rules.size(), -1),
        rule_end(g.rules.size(), -1),
        g_(g),
        recursive_(recursive_rules(g)),
        inline_(g.rules.size(), 0) {}

  std::vector<std::vector<NfaEdge>> out;
  std::vector<int> rule_start, rule_end;  // NFA states of the called rules

  // Emits the root and every rule called from what was emitted.
  void build(int root) {
    std::vector<int> queue = {root};
    rule_start[static_cast<size_t>(root)] = new_state();
    while (!queue.empty()) {
      const int r = queue.back();
      queue.pop_back();
      const size_t mark = out.size();
      const auto rs = static_cast<size_t>(r);
      rule_end[rs] = emit(g_.rules[rs].body, rule_start[rs], 0);
      // New call edges leave the rule's start state or the states just emitted.
      auto scan = [&](size_t state) {
        for (size_t k = 0; k < out[state].size(); ++k) {
          const NfaEdge e = out[state][k];
          if (e.kind != EdgeKind::kCall || rule_start[static_cast<size_t>(e.rule)] >= 0) continue;
          rule_start[static_cast<size_t>(e.rule)] = new_state();
          queue.push_back(e.rule);
        }
      };
      scan(static_cast<size_t>(rule_start[rs]));
      for (size_t state = mark; state < out.size(); ++state) scan(state);
    }
  }

 private:
  const Grammar& g_;
  std::vector<bool> recursive_;
  std::vector<int8_t> inline_;  // per rule: 0 undecided, 1 inline, -1 call

  int new_state() {
    if (out.size() >= static_cast<size_t>(kMaxNfaStates)) {
      throw GrammarError(cat("grammar too large: its automaton exceeds ", kMaxNfaStates,
                             " states (large repetition counts or deeply nested rules)"));
    }
    out.emplace_back();
    return static_cast<int>(out.size()) - 1;
  }
  void add(int from, NfaEdge e) { out[static_cast<size_t>(from)].push_back(e); }
  void eps(int from, int to) { add(from, {to, -1, 0, 0, EdgeKind::kEps}); }

  int emit(const Expr& e, int from, int depth) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: {
        int cur = from;
        for (unsigned char b : e.text) {
          const int n = new_state();
          add(cur, {n, -1, b, b, EdgeKind::kByte});
          cur = n;
        }
        return cur;
      }
      case Expr::Kind::kClass: {
        const int end = new_state();
        std::vector<Utf8Seq> seqs;
        for (CharRange r : normalize(e)) utf8_sequences(r.lo, r.hi, seqs);
        for (const Utf8Seq& s : seqs) {
          int cur = from;
          for (size_t i = 0; i + 1 < s.size(); ++i) {
            const int n = new_state();
            add(cur, {n, -1, s[i].first, s[i].second, EdgeKind::kByte});
            cur = n;
          }
          add(cur, {end, -1, s.back().first, s.back().second, EdgeKind::kByte});
        }
        return end;
      }
      case Expr::Kind::kRef:
        return emit_ref(e.rule, from, depth);
      case Expr::Kind::kSeq: {
        int cur = from;
        for (const Expr& i : e.items) cur = emit(i, cur, depth + 1);
        return cur;
      }
      case Expr::Kind::kAlt: {
        const int end = new_state();
        for (const Expr& i : e.items) eps(emit(i, from, depth + 1), end);
        return end;
      }
      case Expr::Kind::kRepeat: {
        const Expr& body = e.items[0];
        int cur = from;
        for (int i = 0; i < e.min; ++i) cur = emit(body, cur, depth + 1);
        if (e.max == kUnbounded) {
          const int loop = new_state();
          eps(cur, loop);
          eps(emit(body, loop, depth + 1), loop);
          return loop;
        }
        const int end = new_state();
        for (int i = e.min; i < e.max; ++i) {
          eps(cur, end);
          cur = emit(body, cur, depth + 1);
        }
        eps(cur, end);
        return end;
      }
    }
    return from;
  }

  int emit_ref(int rule, int from, int depth) {
    const auto rs = static_cast<size_t>(rule);
    if (!recursive_[rs] && !g_.rules[rs].no_inline && inline_[rs] >= 0 && depth < kInlineMaxDepth) {
      const size_t mark = out.size();
      const int fresh = new_state();
      eps(from, fresh);
      const int end = emit(g_.rules[rs].body, fresh, depth + 1);
      if (inline_[rs] == 1 || out.size() - mark <= static_cast<size_t>(kInlineMaxStates)) {
        inline_[rs] = 1;
        return end;
      }
      out.resize(mark);  // too big to copy at every use: call it instead
      out[static_cast<size_t>(from)].pop_back();
      inline_[rs] = -1;
    }
    const int end = new_state();
    add(from, {end, rule, 0, 0, EdgeKind::kCall});
    return end;
  }
};

// --- subset construction ----------------------------------------------------------------------

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

class Determinizer {
 public:
  Determinizer(const NfaBuilder& nfa, Automaton& a) : nfa_(nfa), a_(a) {
    mark_.assign(nfa.out.size(), 0);
    is_end_.assign(nfa.out.size(), false);
    for (int e : nfa.rule_end)
      if (e >= 0) is_end_[static_cast<size_t>(e)] = true;
    classes();
  }

  void run() {
    a_.rule_start.assign(nfa_.rule_start.size(), -1);
    for (size_t r = 0; r < nfa_.rule_start.size(); ++r) {
      if (nfa_.rule_start[r] >= 0) a_.rule_start[r] = intern(closure({nfa_.rule_start[r]}));
    }
    const auto nc = static_cast<size_t>(a_.n_classes);
    std::vector<std::vector<int32_t>> bucket(nc);
    std::vector<std::pair<int32_t, std::vector<int32_t>>> call_bucket;
    for (size_t d = 0; d < sets_.size(); ++d) {
      for (auto& b : bucket) b.clear();
      call_bucket.clear();
      bool accept = false;
      for (int32_t s : sets_[d]) {
        if (is_end_[static_cast<size_t>(s)]) accept = true;
        for (const NfaEdge& e : nfa_.out[static_cast<size_t>(s)]) {
          if (e.kind == EdgeKind::kByte) {
            for (int c = a_.byte_class[e.lo]; c <= a_.byte_class[e.hi]; ++c)
              bucket[static_cast<size_t>(c)].push_back(e.to);
          } else if (e.kind == EdgeKind::kCall) {
            auto it = std::find_if(call_bucket.begin(), call_bucket.end(),
                                   [&](const auto& p) { return p.first == e.rule; });
            if (it == call_bucket.end()) {
              call_bucket.push_back({e.rule, {}});
              it = call_bucket.end() - 1;
            }
            it->second.push_back(e.to);
          }
        }
      }
      a_.flags.push_back(accept ? kAccept : 0);
      a_.next.resize((d + 1) * nc, -1);
      for (size_t c = 0; c < nc; ++c) {
        if (!bucket[c].empty()) a_.next[d * nc + c] = intern(closure(bucket[c]));
      }
      std::sort(call_bucket.begin(), call_bucket.end(),
                [](const auto& x, const auto& y) { return x.first < y.first; });
      for (auto& [rule, targets] : call_bucket) calls_.push_back({rule, intern(closure(targets))});
      a_.call_begin.push_back(static_cast<int32_t>(calls_.size()));  // this state's end
    }
    a_.n_states = static_cast<int>(sets_.size());
    a_.calls = std::move(calls_);
    a_.call_begin.insert(a_.call_begin.begin(), 0);
  }

 private:
  const NfaBuilder& nfa_;
  Automaton& a_;
  std::vector<uint32_t> mark_;
  uint32_t stamp_ = 0;
  std::vector<bool> is_end_;
  std::vector<std::vector<int32_t>> sets_;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids_;
  std::vector<Automaton::Call> calls_;
  size_t work_ = 0;  // NFA states over all DFA states: bounds time and memory

  // Byte equivalence classes: bytes no edge range tells apart share a class.
  void classes() {
    std::array<bool, 257> cut{};
    cut[0] = true;
    for (const auto& edges : nfa_.out) {
      for (const NfaEdge& e : edges) {
        if (e.kind != EdgeKind::kByte) continue;
        cut[e.lo] = true;
        cut[static_cast<size_t>(e.hi) + 1] = true;
      }
    }
    int c = -1;
    for (int b = 0; b < 256; ++b) {
      if (cut[static_cast<size_t>(b)]) {
        ++c;
        a_.class_byte.push_back(static_cast<uint8_t>(b));
      }
      a_.byte_class[static_cast<size_t>(b)] = static_cast<uint8_t>(c);
    }
    a_.n_classes = c + 1;
  }

  std::vector<int32_t> closure(const std::vector<int32_t>& seeds) {
    if (++stamp_ == 0) {
      std::fill(mark_.begin(), mark_.end(), 0);
      stamp_ = 1;
    }
    std::vector<int32_t> todo(seeds), out;
    while (!todo.empty()) {
      const int32_t s = todo.back();
      todo.pop_back();
      if (mark_[static_cast<size_t>(s)] == stamp_) continue;
      mark_[static_cast<size_t>(s)] = stamp_;
      out.push_back(s);
      for (const NfaEdge& e : nfa_.out[static_cast<size_t>(s)])
        if (e.kind == EdgeKind::kEps) todo.push_back(e.to);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  int32_t intern(std::vector<int32_t> set) {
    auto it = ids_.find(set);
    if (it != ids_.end()) return it->second;
    work_ += set.size();
    if (sets_.size() >= static_cast<size_t>(kMaxDfaStates) || work_ > kMaxSubsetWork) {
      throw GrammarError(cat("grammar too large: its automaton would exceed ", kMaxDfaStates,
                             " states (large repetition counts, many alternatives, long "
                             "enumerations, or heavy ambiguity)"));
    }
    const auto id = static_cast<int32_t>(sets_.size());
    ids_.emplace(set, id);
    sets_.push_back(std::move(set));
    return id;
  }
};

// --- shortest completions, pruning, left recursion -------------------------------------------

// The least fixed point of v[s] = 0 where s may end its rule, else the least over s's edges of
// value(edge, v), by Knuth's generalization of Dijkstra: an edge's value is a "superior
// function" of its inputs (no less than any of them, growing with each), final once they all
// are. A byte edge's input is its target; a call's are its return state and, where
// start_in(call), the called rule's start (otherwise value() takes the start's cost from
// elsewhere). rank: the order in which values became final.
struct Hyper {
  int32_t target;
  int32_t in0, in1;  // inputs (-1: none)
  int32_t call;      // an index into a.calls, or -1 for a byte edge (input in0)
  int pending;       // inputs not final yet
};

template <class StartIn, class Value>
void least_fixed_point(const Automaton& a, StartIn start_in, Value value, std::vector<int64_t>& v,
                       std::vector<int32_t>& rank) {
  const auto n = static_cast<size_t>(a.n_states);
  const auto nc = static_cast<size_t>(a.n_classes);
  std::vector<Hyper> hyper;
  for (size_t s = 0; s < n; ++s) {
    for (size_t c = 0; c < nc; ++c) {
      const int32_t t = a.next[s * nc + c];
      if (t >= 0) hyper.push_back({static_cast<int32_t>(s), t, -1, -1, 1});
    }
    for (int32_t k = a.call_begin[s]; k < a.call_begin[s + 1]; ++k) {
      const Automaton::Call& call = a.calls[static_cast<size_t>(k)];
      const int32_t start = a.rule_start[static_cast<size_t>(call.rule)];
      const int32_t in1 = start_in(call) && start != call.ret ? start : -1;
      hyper.push_back({static_cast<int32_t>(s), call.ret, in1, k, in1 >= 0 ? 2 : 1});
    }
  }
  // uses[use_begin[s], use_begin[s + 1]): the hyperedges with input s.
  std::vector<int32_t> use_begin(n + 1, 0), uses;
  for (const Hyper& e : hyper) {
    ++use_begin[static_cast<size_t>(e.in0) + 1];
    if (e.in1 >= 0) ++use_begin[static_cast<size_t>(e.in1) + 1];
  }
  for (size_t s = 0; s < n; ++s) use_begin[s + 1] += use_begin[s];
  uses.resize(static_cast<size_t>(use_begin[n]));
  {
    std::vector<int32_t> at(use_begin.begin(), use_begin.end() - 1);
    for (size_t h = 0; h < hyper.size(); ++h) {
      uses[static_cast<size_t>(at[static_cast<size_t>(hyper[h].in0)]++)] = static_cast<int32_t>(h);
      if (hyper[h].in1 >= 0)
        uses[static_cast<size_t>(at[static_cast<size_t>(hyper[h].in1)]++)] =
            static_cast<int32_t>(h);
    }
  }
  v.assign(n, kUnreachable);
  rank.assign(n, std::numeric_limits<int32_t>::max());
  int32_t finalized = 0;
  std::vector<bool> done(n, false);
  using Item = std::pair<int64_t, int32_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> pq;
  for (size_t s = 0; s < n; ++s) {
    if (a.flags[s] & kAccept) {
      v[s] = 0;
      pq.push({0, static_cast<int32_t>(s)});
    }
  }
  while (!pq.empty()) {
    const auto [d, u] = pq.top();
    pq.pop();
    const auto us = static_cast<size_t>(u);
    if (done[us] || d != v[us]) continue;
    done[us] = true;
    rank[us] = finalized++;
    for (int32_t k = use_begin[us]; k < use_begin[us + 1]; ++k) {
      Hyper& e = hyper[static_cast<size_t>(uses[static_cast<size_t>(k)])];
      if (--e.pending > 0) continue;
      const int64_t x = std::min(value(e, v), kUnreachable);
      const auto ts = static_cast<size_t>(e.target);
      if (x < v[ts]) {
        v[ts] = x;
        pq.push({x, e.target});
      }
    }
  }
}

// dist[s] = fewest bytes from s to its rule's end: a byte edge costs 1 + dist[t], a call edge
// dist[start(R)] + dist[ret].
void shortest_distances(Automaton& a) {
  least_fixed_point(
      a, [](const Automaton::Call&) { return true; },
      [&](const Hyper& e, const std::vector<int64_t>& v) {
        if (e.call < 0) return 1 + v[static_cast<size_t>(e.in0)];
        const Automaton::Call& c = a.calls[static_cast<size_t>(e.call)];
        return v[static_cast<size_t>(a.rule_start[static_cast<size_t>(c.rule)])] +
               v[static_cast<size_t>(c.ret)];
      },
      a.dist, a.rank);
}

}  // namespace

void bounded_distances(const Automaton& a, std::span<const int64_t> below,
                       std::vector<int64_t>& dist, std::vector<int32_t>& rank) {
  auto tail = [&](const Automaton::Call& c) {
    return (a.flags[static_cast<size_t>(c.ret)] & kSinkFinal) != 0;
  };
  least_fixed_point(
      a, tail,
      [&](const Hyper& e, const std::vector<int64_t>& v) {
        if (e.call < 0) return 1 + v[static_cast<size_t>(e.in0)];
        const Automaton::Call& c = a.calls[static_cast<size_t>(e.call)];
        const auto start = static_cast<size_t>(a.rule_start[static_cast<size_t>(c.rule)]);
        const int64_t inner = tail(c) ? v[start] : below.empty() ? kUnreachable : below[start];
        return inner + v[static_cast<size_t>(c.ret)];
      },
      dist, rank);
}

namespace {

// min_depth (after pruning, so that tail calls are known): an accepting state needs 0, a byte
// edge what its target needs, a call 1 + what the rule's start needs (0 more for a tail call:
// it pushes nothing) or what the return state needs, whichever is more.
void min_depths(Automaton& a) {
  if (a.calls.empty()) {  // one DFA (e.g. a schema without recursion): nothing nests
    a.min_depth.resize(a.dist.size());
    for (size_t s = 0; s < a.dist.size(); ++s)
      a.min_depth[s] = a.dist[s] < kUnreachable ? 0 : kMaxStackDepth + 1;
    a.max_min_depth = 0;
    return;
  }
  std::vector<int64_t> v;
  std::vector<int32_t> rank;
  least_fixed_point(
      a, [](const Automaton::Call&) { return true; },
      [&](const Hyper& e, const std::vector<int64_t>& d) {
        if (e.call < 0) return d[static_cast<size_t>(e.in0)];
        const Automaton::Call& c = a.calls[static_cast<size_t>(e.call)];
        const int64_t push = (a.flags[static_cast<size_t>(c.ret)] & kSinkFinal) ? 0 : 1;
        return std::max(push + d[static_cast<size_t>(a.rule_start[static_cast<size_t>(c.rule)])],
                        d[static_cast<size_t>(c.ret)]);
      },
      v, rank);
  a.min_depth.resize(v.size());
  a.max_min_depth = 0;
  for (size_t s = 0; s < v.size(); ++s) {
    a.min_depth[s] = static_cast<uint16_t>(std::min<int64_t>(v[s], kMaxStackDepth + 1));
    if (a.dist[s] < kUnreachable)
      a.max_min_depth = std::max<int32_t>(a.max_min_depth, a.min_depth[s]);
  }
}

// dist_depth: by rank, the fewest calls nesting above a state over its steps that a shortest
// completion may take (those achieving dist whose targets rank below it).
void dist_depths(Automaton& a) {
  const auto n = static_cast<size_t>(a.n_states);
  const auto nc = static_cast<size_t>(a.n_classes);
  constexpr int32_t kTooDeep = kMaxStackDepth + 1;
  if (a.calls.empty()) {
    a.dist_depth = a.min_depth;
    return;
  }
  std::vector<int32_t> order;
  for (size_t s = 0; s < n; ++s)
    if (a.dist[s] < kUnreachable) order.push_back(static_cast<int32_t>(s));
  std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
    return a.rank[static_cast<size_t>(x)] < a.rank[static_cast<size_t>(y)];
  });
  a.dist_depth.assign(n, kTooDeep);
  for (int32_t s : order) {
    const auto ss = static_cast<size_t>(s);
    if (a.flags[ss] & kAccept) {
      a.dist_depth[ss] = 0;
      continue;
    }
    const int64_t d = a.dist[ss];
    auto below = [&](int32_t t) { return a.rank[static_cast<size_t>(t)] < a.rank[ss]; };
    int32_t best = kTooDeep;
    for (size_t c = 0; c < nc; ++c) {
      const int32_t t = a.next[ss * nc + c];
      if (t >= 0 && below(t) && 1 + a.dist[static_cast<size_t>(t)] == d)
        best = std::min<int32_t>(best, a.dist_depth[static_cast<size_t>(t)]);
    }
    for (int32_t k = a.call_begin[ss]; k < a.call_begin[ss + 1]; ++k) {
      const Automaton::Call call = a.calls[static_cast<size_t>(k)];
      const int32_t start = a.rule_start[static_cast<size_t>(call.rule)];
      if (below(start) && below(call.ret) &&
          a.dist[static_cast<size_t>(start)] + a.dist[static_cast<size_t>(call.ret)] == d) {
        const int32_t push = (a.flags[static_cast<size_t>(call.ret)] & kSinkFinal) ? 0 : 1;
        best = std::min<int32_t>(best,
                                 std::max<int32_t>(push + a.dist_depth[static_cast<size_t>(start)],
                                                   a.dist_depth[static_cast<size_t>(call.ret)]));
      }
    }
    a.dist_depth[ss] = static_cast<uint16_t>(std::min(best, kTooDeep));
  }
}

// Removes transitions and calls that lead where the rule can no longer end.
void prune_dead(Automaton& a) {
  const auto n = static_cast<size_t>(a.n_states);
  const auto nc = static_cast<size_t>(a.n_classes);
  auto live = [&](int32_t s) { return a.dist[static_cast<size_t>(s)] < kUnreachable; };
  for (int32_t& t : a.next)
    if (t >= 0 && !live(t)) t = -1;
  std::vector<Automaton::Call> kept;
  std::vector<int32_t> begin = {0};
  for (size_t s = 0; s < n; ++s) {
    for (int32_t k = a.call_begin[s]; k < a.call_begin[s + 1]; ++k) {
      const Automaton::Call c = a.calls[static_cast<size_t>(k)];
      if (live(a.rule_start[static_cast<size_t>(c.rule)]) && live(c.ret)) kept.push_back(c);
    }
    begin.push_back(static_cast<int32_t>(kept.size()));
  }
  a.calls = std::move(kept);
  a.call_begin = std::move(begin);
  for (size_t s = 0; s < n; ++s) {
    uint8_t f = a.flags[s] & kAccept;
    for (size_t c = 0; c < nc; ++c) {
      if (a.next[s * nc + c] >= 0) {
        f |= kHasBytes;
        break;
      }
    }
    if (a.call_begin[s + 1] > a.call_begin[s]) f |= kHasCalls;
    if (f == kHasBytes) f |= kPlain;
    if (f == kAccept) f |= kSinkFinal;
    a.flags[s] = f;
  }
}

// Rule R "left-calls" Q when Q is called from a state reachable from R's start through calls of
// rules that can match the empty text only. A cycle there would grow the stack forever.
void check_left_recursion(const Automaton& a) {
  const size_t nr = a.rule_start.size();
  std::vector<std::vector<int32_t>> left(nr);
  for (size_t r = 0; r < nr; ++r) {
    if (a.rule_start[r] < 0) continue;
    std::vector<int32_t> todo = {a.rule_start[r]};
    std::vector<int32_t> seen;
    while (!todo.empty()) {
      const int32_t s = todo.back();
      todo.pop_back();
      if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
      seen.push_back(s);
      const auto ss = static_cast<size_t>(s);
      for (int32_t k = a.call_begin[ss]; k < a.call_begin[ss + 1]; ++k) {
        const Automaton::Call& c = a.calls[static_cast<size_t>(k)];
        left[r].push_back(c.rule);
        if (a.dist[static_cast<size_t>(a.rule_start[static_cast<size_t>(c.rule)])] == 0)
          todo.push_back(c.ret);
      }
    }
  }
  // Cycle search by iterative DFS with colors.
  std::vector<uint8_t> color(nr, 0);
  for (size_t r0 = 0; r0 < nr; ++r0) {
    if (color[r0]) continue;
    std::vector<std::pair<size_t, size_t>> st = {{r0, 0}};
    color[r0] = 1;
    while (!st.empty()) {
      auto& [r, i] = st.back();
      if (i < left[r].size()) {
        const auto q = static_cast<size_t>(left[r][i++]);
        if (color[q] == 1) {
          throw GrammarError(cat("grammar: rule '", a.rule_names[q],
                                 "' is left-recursive (it can reach itself before matching any "
                                 "text); rewrite it with repetition, e.g. x ::= y (op y)*"));
        }
        if (color[q] == 0) {
          color[q] = 1;
          st.push_back({q, 0});
        }
        continue;
      }
      color[r] = 2;
      st.pop_back();
    }
  }
}

}  // namespace

Automaton build_automaton(const Grammar& g) {
  if (g.root < 0 || g.root >= static_cast<int>(g.rules.size()))
    throw GrammarError("grammar has no root rule");
  NfaBuilder nfa(g);
  nfa.build(g.root);
  Automaton a;
  for (const Rule& r : g.rules) a.rule_names.push_back(r.name);
  Determinizer(nfa, a).run();
  a.root_start = a.rule_start[static_cast<size_t>(g.root)];
  shortest_distances(a);
  if (a.dist[static_cast<size_t>(a.root_start)] >= kUnreachable) {
    throw GrammarError(cat("grammar: rule '", g.rules[static_cast<size_t>(g.root)].name,
                           "' can never finish (every path needs infinitely much text)"));
  }
  prune_dead(a);
  check_left_recursion(a);
  min_depths(a);
  if (a.min_depth[static_cast<size_t>(a.root_start)] > kMaxStackDepth) {
    throw GrammarError(cat("grammar: rule '", g.rules[static_cast<size_t>(g.root)].name,
                           "' cannot finish within ", kMaxStackDepth,
                           " nested rule calls (every text it matches nests deeper)"));
  }
  dist_depths(a);
  return a;
}

}  // namespace smolrt::grammar::detail
