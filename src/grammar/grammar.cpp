#include "grammar/grammar.h"

#include <algorithm>
#include <climits>
#include <cstdio>

namespace smolrt::grammar {

Expr lit(std::string text) {
  Expr e;
  e.kind = Expr::Kind::kLiteral;
  e.text = std::move(text);
  return e;
}

Expr char_class(std::vector<CharRange> ranges, bool negated) {
  Expr e;
  e.kind = Expr::Kind::kClass;
  e.ranges = std::move(ranges);
  e.negated = negated;
  return e;
}

Expr any_char() {
  return char_class({{0, kMaxCodePoint}});
}

Expr ref(int rule) {
  Expr e;
  e.kind = Expr::Kind::kRef;
  e.rule = rule;
  return e;
}

namespace {

Expr group(Expr::Kind kind, std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = kind;
  e.items = std::move(items);
  return e;
}

}  // namespace

Expr seq(std::vector<Expr> items) {
  return group(Expr::Kind::kSeq, std::move(items));
}

Expr alt(std::vector<Expr> items) {
  return group(Expr::Kind::kAlt, std::move(items));
}

Expr repeat(Expr item, int min, int max) {
  // A repetition of an open-ended one (x+ then + or *, (x*)+, (x?)* ...) is one open-ended
  // repetition: the automaton emits a repeated body twice for x{n,}, so stacked operators would
  // double it per level. (x{a,}){b,c} with b >= 1 is x{a*b,}; with b = 0 it is x{0,} when a <= 1;
  // (x?){b,} is x{0,}.
  if (item.kind == Expr::Kind::kRepeat && max != 0) {
    const bool open = item.max == kUnbounded;
    if (open && (min >= 1 || item.min <= 1)) {
      const long long lo = min >= 1 ? static_cast<long long>(item.min) * min : 0;
      Expr body = std::move(item.items[0]);
      return repeat(std::move(body), static_cast<int>(std::min<long long>(lo, INT_MAX)),
                    kUnbounded);
    }
    if (item.min == 0 && item.max == 1 && max == kUnbounded) {
      Expr body = std::move(item.items[0]);
      return repeat(std::move(body), 0, kUnbounded);
    }
  }
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.min = min;
  e.max = max;
  e.items.push_back(std::move(item));
  return e;
}

Expr opt(Expr item) {
  return repeat(std::move(item), 0, 1);
}
Expr star(Expr item) {
  return repeat(std::move(item), 0, kUnbounded);
}
Expr plus(Expr item) {
  return repeat(std::move(item), 1, kUnbounded);
}

int Grammar::add_rule(std::string name, Expr body) {
  if (find(name) >= 0) throw GrammarError(cat("grammar rule '", name, "' is defined twice"));
  rules.push_back({std::move(name), std::move(body)});
  return static_cast<int>(rules.size()) - 1;
}

int Grammar::find(std::string_view name) const {
  for (size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

// --- GBNF printing --------------------------------------------------------------------------

namespace {

// One code point (or raw byte >= 0x80 of a literal) as GBNF text; `special` lists the characters
// that need a backslash in this context.
void print_char(std::string& out, uint32_t c, std::string_view special) {
  char buf[16];
  if (c == '\n') {
    out += "\\n";
  } else if (c == '\r') {
    out += "\\r";
  } else if (c == '\t') {
    out += "\\t";
  } else if (c < 0x20 || c == 0x7F) {
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out += buf;
  } else if (c < 0x80 && special.find(static_cast<char>(c)) != std::string_view::npos) {
    out.push_back('\\');
    out.push_back(static_cast<char>(c));
  } else if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c <= 0xFFFF) {
    std::snprintf(buf, sizeof buf, "\\u%04X", c);
    out += buf;
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", c);
    out += buf;
  }
}

void print_expr(const Grammar& g, const Expr& e, std::string& out);

void print_atom(const Grammar& g, const Expr& e, std::string& out) {
  const bool atomic =
      e.kind == Expr::Kind::kLiteral || e.kind == Expr::Kind::kClass || e.kind == Expr::Kind::kRef;
  if (!atomic) out += "(";
  print_expr(g, e, out);
  if (!atomic) out += ")";
}

void print_expr(const Grammar& g, const Expr& e, std::string& out) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      out += '"';
      // Bytes >= 0x80 print as they are: a literal holds UTF-8, which the parser reads back.
      for (unsigned char c : e.text) {
        if (c >= 0x80) {
          out.push_back(static_cast<char>(c));
        } else {
          print_char(out, c, "\"\\");
        }
      }
      out += '"';
      return;
    case Expr::Kind::kClass:
      out += e.negated ? "[^" : "[";
      for (const CharRange& r : e.ranges) {
        print_char(out, r.lo, "]\\^-[");
        if (r.hi != r.lo) {
          out += '-';
          print_char(out, r.hi, "]\\^-[");
        }
      }
      out += ']';
      return;
    case Expr::Kind::kRef:
      out += g.rules[static_cast<size_t>(e.rule)].name;
      return;
    case Expr::Kind::kSeq:
      if (e.items.empty()) out += "\"\"";
      for (size_t i = 0; i < e.items.size(); ++i) {
        if (i) out += ' ';
        if (e.items[i].kind == Expr::Kind::kAlt) {
          print_atom(g, e.items[i], out);
        } else {
          print_expr(g, e.items[i], out);
        }
      }
      return;
    case Expr::Kind::kAlt:
      if (e.items.empty()) out += "[^\\x00-\\U0010FFFF]";  // matches nothing
      for (size_t i = 0; i < e.items.size(); ++i) {
        if (i) out += " | ";
        print_expr(g, e.items[i], out);
      }
      return;
    case Expr::Kind::kRepeat:
      print_atom(g, e.items[0], out);
      if (e.min == 0 && e.max == kUnbounded) {
        out += '*';
      } else if (e.min == 1 && e.max == kUnbounded) {
        out += '+';
      } else if (e.min == 0 && e.max == 1) {
        out += '?';
      } else if (e.max == kUnbounded) {
        out += cat('{', e.min, ",}");
      } else if (e.min == e.max) {
        out += cat('{', e.min, '}');
      } else {
        out += cat('{', e.min, ',', e.max, '}');
      }
      return;
  }
}

}  // namespace

std::string Grammar::to_gbnf() const {
  std::string out;
  auto print_rule = [&](const Rule& r) {
    out += r.name;
    out += " ::= ";
    print_expr(*this, r.body, out);
    out += '\n';
  };
  if (root >= 0) print_rule(rules[static_cast<size_t>(root)]);
  for (size_t i = 0; i < rules.size(); ++i) {
    if (static_cast<int>(i) != root) print_rule(rules[i]);
  }
  return out;
}

}  // namespace smolrt::grammar
