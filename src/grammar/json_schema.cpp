#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <vector>

#include "grammar/number_range.h"

namespace smolrt::grammar {

using nlohmann::ordered_json;

namespace {

constexpr int kMaxSchemaDepth = 64;
constexpr int kMaxIndent = 16;         // spaces after a newline in whitespace
constexpr int64_t kMaxCount = 100000;  // minItems / maxItems / minLength / maxLength
constexpr double kMaxBound = 4.0e18;   // |minimum|, |maximum| (int64 arithmetic stays exact)
constexpr size_t kRuleAbove = 24;      // expressions bigger than this become rules when reused

// Keywords that constrain values in ways the grammar does not express: refused, not ignored.
const std::set<std::string>& unsupported() {
  static const std::set<std::string> k = {"pattern",
                                          "patternProperties",
                                          "propertyNames",
                                          "minProperties",
                                          "maxProperties",
                                          "dependentRequired",
                                          "dependentSchemas",
                                          "dependencies",
                                          "if",
                                          "then",
                                          "else",
                                          "not",
                                          "oneOf",
                                          "contains",
                                          "minContains",
                                          "maxContains",
                                          "prefixItems",
                                          "additionalItems",
                                          "unevaluatedProperties",
                                          "unevaluatedItems",
                                          "multipleOf",
                                          "$dynamicRef",
                                          "$recursiveRef",
                                          "uniqueItems"};
  return k;
}

// Keywords that constrain values and that the converter handles (to spot ones beside $ref,
// anyOf and allOf, which would need schema intersection).
const std::set<std::string>& constraints() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "allOf",
                                          "$ref",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "minLength",
                                          "maxLength",
                                          "format"};
  return k;
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string dump(const ordered_json& v) {
  return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

size_t expr_size(const Expr& e) {
  size_t n = 1 + e.text.size();
  for (const Expr& i : e.items) n += expr_size(i);
  return n;
}

bool type_matches(const ordered_json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

Expr hex() {
  return char_class({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
}
Expr digit_run(int n) {
  return repeat(char_class({{'0', '9'}}), n, n);
}
Expr two_digits(char max_first, char max_second_at_max) {
  // 00 .. (max_first)(max_second_at_max), e.g. 23 for hours, 59 for minutes.
  return alt({seq({char_class({{'0', static_cast<uint32_t>(max_first - 1)}}), digit_run(1)}),
              seq({lit(std::string(1, max_first)),
                   char_class({{'0', static_cast<uint32_t>(max_second_at_max)}})})});
}
Expr date_expr() {  // YYYY-MM-DD (days 01..31 for every month)
  return seq(
      {digit_run(4), lit("-"),
       alt({seq({lit("0"), char_class({{'1', '9'}})}), seq({lit("1"), char_class({{'0', '2'}})})}),
       lit("-"),
       alt({seq({lit("0"), char_class({{'1', '9'}})}),
            seq({char_class({{'1', '2'}}), digit_run(1)}),
            seq({lit("3"), char_class({{'0', '1'}})})})});
}
Expr time_expr() {  // HH:MM:SS(.frac)?(Z|+HH:MM|-HH:MM)
  const Expr hh = two_digits('2', '3');
  const Expr mm = seq({char_class({{'0', '5'}}), digit_run(1)});
  return seq({hh, lit(":"), mm, lit(":"), mm,
              opt(seq({lit("."), repeat(char_class({{'0', '9'}}), 1, 9)})),
              alt({lit("Z"), seq({char_class({{'+', '+'}, {'-', '-'}}), hh, lit(":"), mm})})});
}

}  // namespace

SchemaError::SchemaError(std::string pointer, const std::string& what)
    : GrammarError(cat("json schema at '", pointer.empty() ? "#" : "#" + pointer, "': ", what)),
      pointer_(std::move(pointer)) {}

JsonSchemaConverter::JsonSchemaConverter(Grammar& g, std::string prefix)
    : g_(g), prefix_(std::move(prefix)) {}

// --- shared rules ---------------------------------------------------------------------------

int JsonSchemaConverter::shared(const std::string& name, Expr (JsonSchemaConverter::*make)()) {
  int r = g_.find(name);
  if (r >= 0) return r;
  r = g_.add_rule(name);
  Expr body = (this->*make)();
  g_.rules[static_cast<size_t>(r)].body = std::move(body);
  return r;
}

std::string JsonSchemaConverter::fresh_name(const std::string& hint) {
  std::string name;
  do {
    name = cat(prefix_, hint, "-", counter_++);
  } while (g_.find(name) >= 0);
  return name;
}

Expr JsonSchemaConverter::ws() {
  return ref(shared("ws", &JsonSchemaConverter::make_ws));
}
Expr JsonSchemaConverter::any_value() {
  return ref(shared("value", &JsonSchemaConverter::make_value));
}
Expr JsonSchemaConverter::any_object() {
  return ref(shared("object", &JsonSchemaConverter::make_object));
}

Expr JsonSchemaConverter::make_ws() {
  return opt(alt({lit(" "), seq({lit("\n"), repeat(lit(" "), 0, kMaxIndent)})}));
}
Expr JsonSchemaConverter::make_char() {
  return alt({char_class({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, /*negated=*/true),
              seq({lit("\\"), alt({char_class({{'"', '"'},
                                               {'\\', '\\'},
                                               {'/', '/'},
                                               {'b', 'b'},
                                               {'f', 'f'},
                                               {'n', 'n'},
                                               {'r', 'r'},
                                               {'t', 't'}}),
                                   seq({lit("u"), repeat(hex(), 4, 4)})})})});
}
Expr JsonSchemaConverter::make_string() {
  return seq({lit("\""), star(ref(shared("char", &JsonSchemaConverter::make_char))), lit("\"")});
}
Expr JsonSchemaConverter::make_number() {
  return detail::json_number();
}
Expr JsonSchemaConverter::make_integer() {
  return detail::json_integer();
}
Expr JsonSchemaConverter::make_value() {
  return alt({ref(shared("object", &JsonSchemaConverter::make_object)),
              ref(shared("array", &JsonSchemaConverter::make_array)),
              ref(shared("string", &JsonSchemaConverter::make_string)),
              ref(shared("number", &JsonSchemaConverter::make_number)), lit("true"), lit("false"),
              lit("null")});
}
// "{" ws ( string ":" ws value ws ( "," ws string ":" ws value ws )* )? "}". shared() adds a
// rule before making its body, so value -> object -> value ends at the existing rule.
Expr JsonSchemaConverter::make_object() {
  const Expr kv = seq({ref(shared("string", &JsonSchemaConverter::make_string)), lit(":"), ws(),
                       any_value(), ws()});
  return seq({lit("{"), ws(), opt(seq({kv, star(seq({lit(","), ws(), kv}))})), lit("}")});
}
// "[" ws ( value ws ( "," ws value ws )* )? "]"
Expr JsonSchemaConverter::make_array() {
  const Expr item = seq({any_value(), ws()});
  return seq({lit("["), ws(), opt(seq({item, star(seq({lit(","), ws(), item}))})), lit("]")});
}

// --- the schema walk ------------------------------------------------------------------------

Expr JsonSchemaConverter::convert(const ordered_json& schema, const std::string& pointer,
                                  const ordered_json* document) {
  doc_ = document ? document : &schema;
  return visit(schema, pointer);
}

Expr JsonSchemaConverter::visit(const ordered_json& s, const std::string& ptr) {
  struct Depth {
    int& d;
    explicit Depth(int& x) : d(++x) {}
    ~Depth() { --d; }
  } depth(depth_);
  if (depth_ > kMaxSchemaDepth)
    throw SchemaError(ptr, cat("nested deeper than ", kMaxSchemaDepth, " schemas"));
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    throw SchemaError(ptr, "the schema false matches nothing");
  }
  if (!s.is_object()) throw SchemaError(ptr, "a schema must be an object or a boolean");
  for (const auto& [key, value] : s.items()) {
    if (unsupported().count(key) && !(key == "uniqueItems" && value == false)) {
      throw SchemaError(ptr + "/" + escape_pointer(key),
                        cat("'", key, "' is not supported", key == "oneOf" ? " (use anyOf)" : ""));
    }
  }
  auto only = [&](const char* keyword) {
    for (const auto& [key, value] : s.items()) {
      if (key != keyword && constraints().count(key)) {
        throw SchemaError(ptr + "/" + escape_pointer(key),
                          cat("'", key, "' beside '", keyword, "' is not supported"));
      }
    }
  };
  if (s.contains("$ref")) {
    only("$ref");
    if (!s["$ref"].is_string()) throw SchemaError(ptr + "/$ref", "'$ref' must be a string");
    return reference(s["$ref"].get<std::string>(), ptr + "/$ref");
  }
  if (s.contains("const"))
    return literals(ordered_json::array({s["const"]}), s, ptr + "/const", "const");
  if (s.contains("enum")) return literals(s["enum"], s, ptr + "/enum", "enum");
  if (s.contains("anyOf") || s.contains("allOf")) {
    const char* kw = s.contains("anyOf") ? "anyOf" : "allOf";
    only(kw);
    const ordered_json& list = s[kw];
    const std::string at = ptr + "/" + kw;
    if (!list.is_array() || list.empty())
      throw SchemaError(at, cat("'", kw, "' must be a non-empty array"));
    if (std::string(kw) == "allOf") {
      if (list.size() != 1)
        throw SchemaError(at, "'allOf' with more than one schema is not supported");
      return visit(list[0], at + "/0");
    }
    std::vector<Expr> alts;
    for (size_t i = 0; i < list.size(); ++i) alts.push_back(visit(list[i], cat(at, "/", i)));
    return alt(std::move(alts));
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    const ordered_json& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& x : t) {
        if (!x.is_string()) throw SchemaError(ptr + "/type", "'type' entries must be strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      throw SchemaError(ptr + "/type", "'type' must be a string or a non-empty array of strings");
    }
  } else {  // no type: what the keywords imply, else any value
    auto has = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
    };
    if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (has({"items", "minItems", "maxItems"})) types.push_back("array");
    if (has({"minLength", "maxLength", "format"})) types.push_back("string");
    if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}))
      types.push_back("number");
    if (types.size() > 1)
      throw SchemaError(ptr, "keywords of several types without a 'type'; add one");
    if (types.empty()) return any_value();
  }
  std::vector<Expr> alts;
  for (const std::string& t : types) alts.push_back(visit_type(s, t, ptr));
  return alt(std::move(alts));
}

Expr JsonSchemaConverter::visit_type(const ordered_json& s, const std::string& type,
                                     const std::string& ptr) {
  if (type == "object") return object(s, ptr);
  if (type == "array") return array(s, ptr);
  if (type == "string") return string(s, ptr);
  if (type == "number") return number(s, ptr, false);
  if (type == "integer") return number(s, ptr, true);
  if (type == "boolean") return alt({lit("true"), lit("false")});
  if (type == "null") return lit("null");
  throw SchemaError(
      ptr + "/type",
      cat("unknown type '", type, "' (object, array, string, number, integer, boolean, null)"));
}

Expr JsonSchemaConverter::literals(const ordered_json& values, const ordered_json& s,
                                   const std::string& ptr, const char* keyword) {
  if (!values.is_array() || values.empty())
    throw SchemaError(ptr, cat("'", keyword, "' must be a non-empty array"));
  std::vector<std::string> types;
  if (s.contains("type")) {
    const ordered_json& t = s["type"];
    if (t.is_string()) types.push_back(t.get<std::string>());
    if (t.is_array())
      for (const auto& x : t)
        if (x.is_string()) types.push_back(x.get<std::string>());
  }
  std::vector<std::string> texts;
  for (const auto& v : values) {
    if (!types.empty() && std::none_of(types.begin(), types.end(),
                                       [&](const std::string& t) { return type_matches(v, t); }))
      continue;
    std::string text = dump(v);
    if (std::find(texts.begin(), texts.end(), text) == texts.end())
      texts.push_back(std::move(text));
  }
  if (texts.empty()) throw SchemaError(ptr, cat("no '", keyword, "' value has the schema's type"));
  std::vector<Expr> alts;
  for (std::string& t : texts) alts.push_back(lit(std::move(t)));
  return alt(std::move(alts));
}

Expr JsonSchemaConverter::reference(const std::string& target, const std::string& ptr) {
  if (target.empty() || target[0] != '#') {
    throw SchemaError(
        ptr,
        cat("only references inside the schema ('#/$defs/...') are supported, not '", target, "'"));
  }
  const std::string pointer = target.substr(1);
  if (auto it = refs_.find(pointer); it != refs_.end()) return ref(it->second);
  const ordered_json* found = nullptr;
  try {
    found = &doc_->at(ordered_json::json_pointer(pointer));
  } catch (const nlohmann::json::exception&) {
    throw SchemaError(ptr, cat("'$ref' target '", target, "' does not exist"));
  }
  std::string hint = "ref";  // the pointer, for messages about the rule (left recursion)
  for (char c : pointer) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (word) hint += c;
    if (!word && hint.back() != '-') hint += '-';
  }
  const int rule = g_.add_rule(fresh_name(hint));
  refs_[pointer] = rule;  // before the visit: a recursive schema finds its own rule
  Expr body = visit(*found, pointer);
  g_.rules[static_cast<size_t>(rule)].body = std::move(body);
  return ref(rule);
}

namespace {

// A non-negative count keyword (minItems, ...) or `fallback` when absent.
int64_t count(const ordered_json& s, const char* key, const std::string& ptr, int64_t fallback) {
  if (!s.contains(key)) return fallback;
  const ordered_json& v = s[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxCount)
    throw SchemaError(ptr + "/" + key, cat("'", key, "' must be an integer from 0 to ", kMaxCount));
  return v.get<int64_t>();
}

}  // namespace

Expr JsonSchemaConverter::object(const ordered_json& s, const std::string& ptr) {
  const ordered_json empty = ordered_json::object();
  const ordered_json& props = s.contains("properties") ? s["properties"] : empty;
  if (!props.is_object()) throw SchemaError(ptr + "/properties", "'properties' must be an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    const ordered_json& r = s["required"];
    if (!r.is_array()) throw SchemaError(ptr + "/required", "'required' must be an array of names");
    for (const auto& x : r) {
      if (!x.is_string())
        throw SchemaError(ptr + "/required", "'required' must be an array of names");
      if (!props.contains(x.get<std::string>())) {
        throw SchemaError(ptr + "/required", cat("required property '", x.get<std::string>(),
                                                 "' is not in 'properties'"));
      }
      required.insert(x.get<std::string>());
    }
  }
  const ordered_json* addl =
      s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
  if (addl && !addl->is_boolean() && !addl->is_object())
    throw SchemaError(ptr + "/additionalProperties",
                      "'additionalProperties' must be a boolean or a schema");
  if (props.empty()) {
    if (addl && addl->is_boolean() && !addl->get<bool>()) return seq({lit("{"), ws(), lit("}")});
    if (!addl || addl->is_boolean()) return any_object();
    // A map: any keys, values of one schema.
    Expr value = visit(*addl, ptr + "/additionalProperties");
    const int v = g_.add_rule(fresh_name("map-value"), std::move(value));
    const Expr kv = seq(
        {ref(shared("string", &JsonSchemaConverter::make_string)), lit(":"), ws(), ref(v), ws()});
    return seq({lit("{"), ws(), opt(seq({kv, star(seq({lit(","), ws(), kv}))})), lit("}")});
  }
  if (addl && !(addl->is_boolean() && !addl->get<bool>())) {
    throw SchemaError(
        ptr + "/additionalProperties",
        "'additionalProperties' other than false together with 'properties' is not supported");
  }
  std::vector<Expr> kv;
  std::vector<bool> req;
  for (const auto& [name, sub] : props.items()) {
    Expr value = visit(sub, ptr + "/properties/" + escape_pointer(name));
    if (expr_size(value) > kRuleAbove)
      value = ref(g_.add_rule(fresh_name("prop"), std::move(value)));
    kv.push_back(seq({lit(dump(ordered_json(name)) + ":"), ws(), std::move(value), ws()}));
    req.push_back(required.count(name) > 0);
  }
  const size_t n = kv.size();
  if (std::all_of(req.begin(), req.end(), [](bool b) { return b; })) {
    std::vector<Expr> items = {lit("{"), ws()};
    for (size_t i = 0; i < n; ++i) {
      if (i) {
        items.push_back(lit(","));
        items.push_back(ws());
      }
      items.push_back(kv[i]);
    }
    items.push_back(lit("}"));
    return seq(std::move(items));
  }
  // Optional properties, in order: tail[i] = the properties from i on after at least one was
  // written (each then starts with a comma); the object starts at the first property written.
  // Every start shares its tail: the tails are called, not copied (copies would grow with the
  // square of the number of properties).
  std::vector<int> tail(n + 1, -1);
  for (size_t i = n; i-- > 0;) {
    Expr item = seq({lit(","), ws(), kv[i]});
    if (!req[i]) item = opt(std::move(item));
    Expr rest = tail[i + 1] >= 0 ? ref(tail[i + 1]) : lit("");
    tail[i] = g_.add_rule(fresh_name("props"), seq({std::move(item), std::move(rest)}));
    g_.rules[static_cast<size_t>(tail[i])].no_inline = true;
  }
  std::vector<Expr> firsts;
  bool all_optional = true;
  for (size_t i = 0; i < n; ++i) {
    firsts.push_back(seq({kv[i], tail[i + 1] >= 0 ? ref(tail[i + 1]) : lit("")}));
    if (req[i]) {
      all_optional = false;
      break;
    }
  }
  if (all_optional) firsts.push_back(lit(""));
  return seq({lit("{"), ws(), alt(std::move(firsts)), lit("}")});
}

Expr JsonSchemaConverter::array(const ordered_json& s, const std::string& ptr) {
  Expr item = any_value();
  if (s.contains("items")) {
    const ordered_json& it = s["items"];
    if (it.is_array())
      throw SchemaError(ptr + "/items", "tuple 'items' (an array of schemas) is not supported");
    item = visit(it, ptr + "/items");
  }
  if (expr_size(item) > kRuleAbove) item = ref(g_.add_rule(fresh_name("item"), std::move(item)));
  const int64_t min = count(s, "minItems", ptr, 0);
  const int64_t max = count(s, "maxItems", ptr, -1);
  if (max >= 0 && max < min) throw SchemaError(ptr + "/maxItems", "'maxItems' is below 'minItems'");
  if (max == 0) return seq({lit("["), ws(), lit("]")});
  const Expr more = seq({lit(","), ws(), item, ws()});
  Expr body = seq({item, ws(),
                   repeat(more, static_cast<int>(std::max<int64_t>(min - 1, 0)),
                          max < 0 ? kUnbounded : static_cast<int>(max - 1))});
  if (min == 0) body = opt(std::move(body));
  return seq({lit("["), ws(), std::move(body), lit("]")});
}

Expr JsonSchemaConverter::string(const ordered_json& s, const std::string& ptr) {
  const int64_t min = count(s, "minLength", ptr, 0);
  const int64_t max = count(s, "maxLength", ptr, -1);
  if (max >= 0 && max < min)
    throw SchemaError(ptr + "/maxLength", "'maxLength' is below 'minLength'");
  if (s.contains("format") && s["format"].is_string()) {
    const std::string f = s["format"].get<std::string>();
    std::optional<Expr> body;
    if (f == "date") body = date_expr();
    if (f == "time") body = time_expr();
    if (f == "date-time")
      body = seq({date_expr(), char_class({{'T', 'T'}, {'t', 't'}}), time_expr()});
    if (f == "uuid") {
      body = seq({repeat(hex(), 8, 8), lit("-"), repeat(hex(), 4, 4), lit("-"), repeat(hex(), 4, 4),
                  lit("-"), repeat(hex(), 4, 4), lit("-"), repeat(hex(), 12, 12)});
    }
    if (body) {
      if (s.contains("minLength") || s.contains("maxLength"))
        throw SchemaError(ptr + "/format",
                          cat("'format' '", f, "' with minLength/maxLength is not supported"));
      return seq({lit("\""), std::move(*body), lit("\"")});
    }
  }
  if (min == 0 && max < 0) return ref(shared("string", &JsonSchemaConverter::make_string));
  const int c = shared("char", &JsonSchemaConverter::make_char);
  return seq({lit("\""),
              repeat(ref(c), static_cast<int>(min), max < 0 ? kUnbounded : static_cast<int>(max)),
              lit("\"")});
}

Expr JsonSchemaConverter::number(const ordered_json& s, const std::string& ptr, bool integer) {
  // Each side's tightest bound; draft-04 boolean exclusiveMinimum/Maximum modify minimum/maximum.
  auto bound = [&](const char* incl, const char* excl,
                   bool lower) -> std::optional<std::pair<double, bool>> {
    std::optional<std::pair<double, bool>> b;
    auto take = [&](double v, bool exclusive) {
      if (!b || (lower ? v > b->first || (v == b->first && exclusive)
                       : v < b->first || (v == b->first && exclusive)))
        b = std::pair(v, exclusive);
    };
    for (int k = 0; k < 2; ++k) {
      const char* key = k == 0 ? incl : excl;
      if (!s.contains(key) || s[key].is_boolean()) continue;
      if (!s[key].is_number())
        throw SchemaError(ptr + "/" + key, cat("'", key, "' must be a number"));
      const double v = s[key].get<double>();
      if (!(std::fabs(v) <= kMaxBound))
        throw SchemaError(ptr + "/" + key, cat("'", key, "' beyond +-4e18 is not supported"));
      const bool draft4 = k == 0 && s.contains(excl) && s[excl].is_boolean() && s[excl].get<bool>();
      take(v, k == 1 || draft4);
    }
    return b;
  };
  const auto lo = bound("minimum", "exclusiveMinimum", true);
  const auto hi = bound("maximum", "exclusiveMaximum", false);
  if (!lo && !hi)
    return ref(integer ? shared("integer", &JsonSchemaConverter::make_integer)
                       : shared("number", &JsonSchemaConverter::make_number));
  if (integer) {
    std::optional<int64_t> ilo, ihi;
    if (lo)
      ilo = static_cast<int64_t>(lo->second ? std::floor(lo->first) + 1 : std::ceil(lo->first));
    if (hi)
      ihi = static_cast<int64_t>(hi->second ? std::ceil(hi->first) - 1 : std::floor(hi->first));
    if (ilo && ihi && *ilo > *ihi) throw SchemaError(ptr, "no integer is within minimum/maximum");
    return detail::integer_range(ilo, ihi);
  }
  for (const auto& b : {lo, hi}) {
    if (b && std::trunc(b->first) != b->first) {
      throw SchemaError(ptr, cat("bounds of type number must be whole numbers (", b->first,
                                 " is not); use type integer or whole-number bounds"));
    }
  }
  std::optional<detail::Bound> blo, bhi;
  if (lo) blo = detail::Bound{static_cast<int64_t>(lo->first), lo->second};
  if (hi) bhi = detail::Bound{static_cast<int64_t>(hi->first), hi->second};
  if (blo && bhi &&
      (blo->value > bhi->value || (blo->value == bhi->value && (blo->exclusive || bhi->exclusive))))
    throw SchemaError(ptr, "no number is within minimum/maximum");
  return detail::number_range(blo, bhi);
}

// --- entry points ---------------------------------------------------------------------------

Grammar json_schema_grammar(const ordered_json& schema) {
  Grammar g;
  JsonSchemaConverter c(g, "");
  Expr e = c.convert(schema);
  g.root = g.add_rule("root", std::move(e));
  return g;
}

ordered_json parse_schema_text(std::string_view text) {
  try {
    return ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw SchemaError("", cat("not valid JSON: ", e.what()));
  }
}

Grammar json_object_grammar() {
  Grammar g;
  JsonSchemaConverter c(g, "");
  Expr e = c.any_object();
  g.root = g.add_rule("root", std::move(e));
  return g;
}

}  // namespace smolrt::grammar
