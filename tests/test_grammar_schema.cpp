// JSON schema -> grammar: each construct accepts the instances it should and nothing else
// (text-level over a byte vocabulary), number ranges exhaustively, and the errors for
// unsupported constructs name the keyword and its JSON pointer.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar_test_util.h"

namespace smolrt::grammar {
namespace {

using nlohmann::ordered_json;

using test::byte_vocab;
using test::matches;

std::shared_ptr<const CompiledGrammar> schema(const std::string& text) {
  return compile(json_schema_grammar(parse_schema_text(text)), byte_vocab());
}

std::string error_of(const std::string& text) {
  return test::error_of([&] { schema(text); });
}

TEST(GrammarSchema, ObjectWithRequiredPropertiesInOrder) {
  const auto g = schema(R"({"type": "object", "properties": {"b": {"type": "string"},
      "a": {"type": "integer"}}, "required": ["b", "a"], "additionalProperties": false})");
  EXPECT_TRUE(matches(g, R"({"b":"x","a":1})"));
  EXPECT_TRUE(matches(g, "{\n  \"b\": \"x\",\n  \"a\": -12\n}"));
  EXPECT_TRUE(matches(g, R"({ "b": "", "a": 0 })"));
  EXPECT_FALSE(matches(g, R"({"a":1,"b":"x"})"));  // order as given
  EXPECT_FALSE(matches(g, R"({"b":"x"})"));
  EXPECT_FALSE(matches(g, R"({"b":"x","a":1,"c":2})"));
  EXPECT_FALSE(matches(g, R"( {"b":"x","a":1})"));        // no leading whitespace
  EXPECT_FALSE(matches(g, R"({"b":"x",  "a":1})"));       // at most one space
  EXPECT_FALSE(matches(g, "{\n\n\"b\":\"x\",\"a\":1}"));  // one newline
  EXPECT_FALSE(matches(g, "{\"b\":\"x\",\n" + std::string(17, ' ') + "\"a\":1}"));
}

TEST(GrammarSchema, OptionalPropertiesKeepOrderAndCommas) {
  const auto g = schema(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
      "c": {"type": "integer"}}, "required": ["b"]})");
  for (const char* ok :
       {R"({"b":1})", R"({"a":1,"b":2})", R"({"b":1,"c":2})", R"({"a":1,"b":2,"c":3})"})
    EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {R"({})", R"({"a":1})", R"({"b":1,"a":2})", R"({,"b":1})", R"({"b":1,})",
                          R"({"a":1,"c":2})"})
    EXPECT_FALSE(matches(g, bad)) << bad;
  const auto none = schema(R"({"properties": {"a": {"type": "null"}, "b": {"type": "boolean"}}})");
  for (const char* ok : {R"({})", R"({"a":null})", R"({"b":true})", R"({"a":null,"b":false})"})
    EXPECT_TRUE(matches(none, ok)) << ok;
  EXPECT_FALSE(matches(none, R"({"b":true,"a":null})"));
}

TEST(GrammarSchema, ManyOptionalPropertiesStayLinearInSize) {
  // Each optional property's tail is shared (called), not copied per possible first property:
  // twice the properties, twice the states (copies would make it four times).
  auto optional_props = [](int n) {
    std::string props;
    for (int i = 0; i < n; ++i)
      props += cat(i ? ", " : "", "\"p", i, "\": {\"type\": \"integer\"}");
    return schema("{\"type\": \"object\", \"properties\": {" + props + "}}");
  };
  const auto g = optional_props(100);
  EXPECT_LT(g->n_states(), optional_props(50)->n_states() * 2.2);
  EXPECT_TRUE(matches(g, R"({"p3":1,"p50":2, "p99":3})"));
  EXPECT_TRUE(matches(g, R"({})"));
  EXPECT_FALSE(matches(g, R"({"p50":2,"p3":1})"));
}

TEST(GrammarSchema, MapsAnyObjectsAndEmptyObjects) {
  const auto map = schema(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(matches(map, R"({"x":1,"y z":2})"));
  EXPECT_TRUE(matches(map, R"({})"));
  EXPECT_FALSE(matches(map, R"({"x":"1"})"));
  const auto any = schema(R"({"type": "object"})");
  EXPECT_TRUE(matches(any, R"({"a":[1,{"b":null}],"c":"d","e":-1.5e3})"));
  EXPECT_FALSE(matches(any, R"([1])"));
  const auto none = schema(R"({"type": "object", "additionalProperties": false})");
  EXPECT_TRUE(matches(none, "{}"));
  EXPECT_TRUE(matches(none, "{ }"));
  EXPECT_FALSE(matches(none, R"({"a":1})"));
}

TEST(GrammarSchema, ArraysWithBounds) {
  const auto g =
      schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
  EXPECT_TRUE(matches(g, "[1]"));
  EXPECT_TRUE(matches(g, "[1, 2,3]"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, "[1,2,3,4]"));
  EXPECT_FALSE(matches(g, "[1,]"));
  const auto any = schema(R"({"type": "array"})");
  EXPECT_TRUE(matches(any, R"([])"));
  EXPECT_TRUE(matches(any, R"([1,"a",[true],{}])"));
  const auto empty = schema(R"({"type": "array", "maxItems": 0})");
  EXPECT_TRUE(matches(empty, "[]"));
  EXPECT_FALSE(matches(empty, "[1]"));
}

TEST(GrammarSchema, StringsEscapesLengthsAndFormats) {
  const auto s = schema(R"({"type": "string"})");
  EXPECT_TRUE(matches(s, R"("a\"b\\c\n\u00e9/\/")"));
  EXPECT_TRUE(matches(s, "\"caf\xc3\xa9 \xf0\x9f\x98\x80\""));
  EXPECT_FALSE(matches(s, "\"a\nb\""));  // raw control characters are not JSON
  EXPECT_FALSE(matches(s, R"("\x")"));
  EXPECT_FALSE(matches(s, R"("\u12")"));
  const auto len = schema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(matches(len, R"("ab")"));
  EXPECT_TRUE(matches(len, "\"\xc3\xa9\\n\xe2\x82\xac\""));  // three characters
  EXPECT_FALSE(matches(len, R"("a")"));
  EXPECT_FALSE(matches(len, R"("abcd")"));
  const auto date = schema(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(matches(date, R"("2024-02-29")"));
  EXPECT_FALSE(matches(date, R"("2024-13-01")"));
  EXPECT_FALSE(matches(date, R"("2024-1-01")"));
  const auto dt = schema(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(matches(dt, R"("2024-02-29T23:59:60Z")") == false);
  EXPECT_TRUE(matches(dt, R"("2024-02-29T23:59:59.123+05:30")"));
  const auto uuid = schema(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(matches(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(matches(uuid, R"("123e4567e89b12d3a456426614174000")"));
  const auto email = schema(R"({"type": "string", "format": "email"})");  // an annotation
  EXPECT_TRUE(matches(email, R"("not an email")"));
}

TEST(GrammarSchema, EnumConstAnyOfTypeArraysBooleanNull) {
  const auto e = schema(R"({"enum": ["red", 1, null, {"a": [true]}, "caf\u00e9"]})");
  for (const char* ok : {R"("red")", "1", "null", R"({"a":[true]})", "\"caf\xc3\xa9\""})
    EXPECT_TRUE(matches(e, ok)) << ok;
  EXPECT_FALSE(matches(e, R"("blue")"));
  EXPECT_FALSE(matches(e, R"({"a": [true]})"));  // a const value is written compactly
  const auto typed = schema(R"({"type": "string", "enum": ["a", 1]})");
  EXPECT_TRUE(matches(typed, R"("a")"));
  EXPECT_FALSE(matches(typed, "1"));
  const auto c = schema(R"({"const": "x"})");
  EXPECT_TRUE(matches(c, R"("x")"));
  EXPECT_FALSE(matches(c, R"("y")"));
  const auto any_of =
      schema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})");
  EXPECT_TRUE(matches(any_of, "12"));
  EXPECT_TRUE(matches(any_of, R"("a")"));
  EXPECT_FALSE(matches(any_of, R"("ab")"));
  const auto nullable = schema(R"({"type": ["string", "null"]})");
  EXPECT_TRUE(matches(nullable, "null"));
  EXPECT_TRUE(matches(nullable, R"("s")"));
  EXPECT_FALSE(matches(nullable, "1"));
  const auto b = schema(R"({"type": "boolean"})");
  EXPECT_TRUE(matches(b, "true"));
  EXPECT_TRUE(matches(b, "false"));
  EXPECT_FALSE(matches(b, "null"));
  const auto all = schema(R"({"allOf": [{"type": "null"}], "description": "x"})");
  EXPECT_TRUE(matches(all, "null"));
  const auto anything = schema("true");
  EXPECT_TRUE(matches(anything, R"([{"a":1.5e-3}, "x", null])"));
}

TEST(GrammarSchema, RefsDefsAndRecursion) {
  const auto g =
      schema(R"({"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}},
      "required": ["x"]}}, "type": "array", "items": {"$ref": "#/$defs/pt"}})");
  EXPECT_TRUE(matches(g, R"([{"x":1},{"x":2}])"));
  EXPECT_FALSE(matches(g, R"([{"y":1}])"));
  const auto tree = schema(R"({"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v", "kids"]})");
  EXPECT_TRUE(
      matches(tree, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(matches(tree, R"({"v":1,"kids":[{"v":2}]})"));
  const auto defs =
      schema(R"({"definitions": {"a": {"$ref": "#/definitions/b"}, "b": {"type": "null"}},
      "$ref": "#/definitions/a"})");
  EXPECT_TRUE(matches(defs, "null"));
}

TEST(GrammarSchema, IntegerRangesAreExact) {
  struct Range {
    const char* schema;
    long lo, hi;
  };
  const Range ranges[] = {
      {R"({"type": "integer", "minimum": 0, "maximum": 150})", 0, 150},
      {R"({"type": "integer", "minimum": -50, "maximum": -3})", -50, -3},
      {R"({"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 100})", -9, 99},
      {R"({"type": "integer", "minimum": 7, "maximum": 7})", 7, 7},
      {R"({"type": "integer", "minimum": 1.5, "maximum": 19.9})", 2, 19},
      {R"({"type": "integer", "minimum": 95})", 95, LONG_MAX},
      {R"({"type": "integer", "maximum": -95})", LONG_MIN, -95},
  };
  for (const Range& r : ranges) {
    const auto g = schema(r.schema);
    for (long v = -400; v <= 400; ++v) {
      const bool in = v >= r.lo && v <= r.hi;
      ASSERT_EQ(matches(g, std::to_string(v)), in) << r.schema << " " << v;
    }
    EXPECT_FALSE(matches(g, "007"));
    EXPECT_FALSE(matches(g, "1.0"));
    EXPECT_EQ(matches(g, "123456"), 123456 >= r.lo && 123456 <= r.hi) << r.schema;
  }
  EXPECT_FALSE(matches(schema(R"({"type": "integer"})"), "12345678901234567890"));  // 20 digits
  EXPECT_TRUE(matches(schema(R"({"type": "integer"})"), "-1234567890123456789"));
}

TEST(GrammarSchema, NumberRangesAreExact) {
  struct Range {
    const char* schema;
    double lo, hi;
    bool lo_ex, hi_ex;
  };
  const Range ranges[] = {
      {R"({"type": "number", "minimum": -1, "maximum": 1})", -1, 1, false, false},
      {R"({"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 1})", -1, 1, true, true},
      {R"({"type": "number", "minimum": 0})", 0, 1e9, false, false},
      {R"({"type": "number", "exclusiveMinimum": 0, "maximum": 3})", 0, 3, true, false},
      {R"({"type": "number", "minimum": -12, "exclusiveMaximum": -2})", -12, -2, false, true},
      {R"({"type": "number", "minimum": 2, "maximum": 2})", 2, 2, false, false},
  };
  const char* texts[] = {"0",      "-0.5", "0.5",  "1",    "1.0",      "1.01",    "-1",
                         "-1.000", "-1.5", "2",    "2.00", "2.5",      "3",       "3.0",
                         "3.1",    "-2",   "-2.0", "-2.5", "-11.99",   "-12",     "-12.01",
                         "0.0",    "-0.0", "99",   "-0",   "0.000001", "2.000001"};
  for (const Range& r : ranges) {
    const auto g = schema(r.schema);
    for (const char* t : texts) {
      const double v = std::strtod(t, nullptr);
      const bool in = (r.lo_ex ? v > r.lo : v >= r.lo) && (r.hi_ex ? v < r.hi : v <= r.hi);
      EXPECT_EQ(matches(g, t), in && std::string(t) != "-0" && std::string(t) != "-0.0")
          << r.schema << " " << t;
    }
    EXPECT_FALSE(matches(g, "1e2"));  // bounded numbers have no exponent
  }
  const auto n = schema(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "1.5", "-2e10", "3E-7", "1.25e+3"})
    EXPECT_TRUE(matches(n, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "NaN", "1.12345678901234567"})
    EXPECT_FALSE(matches(n, bad)) << bad;
}

TEST(GrammarSchema, UnsupportedConstructsNameKeywordAndPointer) {
  EXPECT_EQ(
      error_of(R"({"type": "object", "properties": {"e": {"type": "string", "pattern": "^a"}}})"),
      "json schema at '#/properties/e/pattern': 'pattern' is not supported");
  EXPECT_EQ(error_of(R"({"oneOf": [{"type": "string"}]})"),
            "json schema at '#/oneOf': 'oneOf' is not supported (use anyOf)");
  EXPECT_EQ(error_of(R"({"type": "array", "items": {"not": {}}})"),
            "json schema at '#/items/not': 'not' is not supported");
  EXPECT_EQ(error_of(R"({"type": "number", "multipleOf": 2})"),
            "json schema at '#/multipleOf': 'multipleOf' is not supported");
  EXPECT_EQ(error_of(R"({"type": "array", "uniqueItems": true})"),
            "json schema at '#/uniqueItems': 'uniqueItems' is not supported");
  EXPECT_EQ(
      error_of(R"({"type": "object", "properties": {"a/b~": {"type": "strin"}}})"),
      "json schema at '#/properties/a~1b~0/type': unknown type 'strin' (object, array, string, "
      "number, integer, boolean, null)");
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})"),
            "json schema at '#/required': required property 'b' is not in 'properties'");
  EXPECT_EQ(
      error_of(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true})"),
      "json schema at '#/additionalProperties': 'additionalProperties' other than false together "
      "with 'properties' is not supported");
  EXPECT_EQ(error_of(R"({"$ref": "https://example.com/s.json"})"),
            "json schema at '#/$ref': only references inside the schema ('#/$defs/...') are "
            "supported, not "
            "'https://example.com/s.json'");
  EXPECT_EQ(error_of(R"({"$ref": "#/$defs/missing"})"),
            "json schema at '#/$ref': '$ref' target '#/$defs/missing' does not exist");
  EXPECT_EQ(error_of(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "json schema at '#': no integer is within minimum/maximum");
  EXPECT_EQ(error_of(R"({"type": "number", "minimum": 0.5})"),
            "json schema at '#': bounds of type number must be whole numbers (0.5 is not); use "
            "type integer "
            "or whole-number bounds");
  EXPECT_EQ(error_of(R"({"type": "array", "items": [{"type": "string"}]})"),
            "json schema at '#/items': tuple 'items' (an array of schemas) is not supported");
  EXPECT_EQ(error_of(R"({"anyOf": [{"type": "string"}], "type": "string"})"),
            "json schema at '#/type': 'type' beside 'anyOf' is not supported");
  EXPECT_EQ(error_of(R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})"),
            "json schema at '#/allOf': 'allOf' with more than one schema is not supported");
  EXPECT_EQ(error_of(R"({"enum": []})"),
            "json schema at '#/enum': 'enum' must be a non-empty array");
  EXPECT_EQ(error_of("false"), "json schema at '#': the schema false matches nothing");
  EXPECT_EQ(error_of("[1]"), "json schema at '#': a schema must be an object or a boolean");
  EXPECT_EQ(error_of("{\"type\": "), error_of("{\"type\": "));
  EXPECT_NE(error_of("{\"type\": ").find("json schema at '#': not valid JSON"), std::string::npos);
  std::string deep = "{}";
  for (int i = 0; i < 70; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NE(error_of(deep).find("nested deeper than 64 schemas"), std::string::npos);
  // $ref cycles that consume no text: a left-recursive grammar, or one that never finishes.
  EXPECT_EQ(
      error_of(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}, {"type": "null"}]},
      "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
      "grammar: rule 'ref-defs-a-0' is left-recursive (it can reach itself before matching any "
      "text); rewrite it with repetition, e.g. x ::= y (op y)*");
  EXPECT_EQ(
      error_of(
          R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
      "grammar: rule 'root' can never finish (every path needs infinitely much text)");
}

TEST(GrammarSchema, IgnoresAnnotationsAndUnknownKeywords) {
  const auto g = schema(R"({"title": "T", "description": "d", "type": "object", "x-vendor": 1,
      "properties": {"a": {"type": "string", "default": "q", "examples": ["e"]}}, "required": ["a"],
      "additionalProperties": false, "$schema": "https://json-schema.org/draft/2020-12/schema"})");
  EXPECT_TRUE(matches(g, R"({"a":"z"})"));
}

TEST(GrammarSchema, JsonObjectModeIsAnyObject) {
  const auto g = compile(json_object_grammar(), byte_vocab());
  EXPECT_TRUE(matches(g, R"({"a": {"b": [1, 2.5, "c", null, true, false, {}]}})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, R"("a")"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
}

TEST(GrammarSchema, JsonObjectModeNestsToTheDepthLimitWithoutADeadEnd) {
  // Objects opened until the grammar refuses one more: every one kept can still be closed. (The
  // matcher once took a 257th {"a": whose value needed a call past the limit: a shortest
  // completion that did not complete.)
  const auto g = compile(json_object_grammar(), byte_vocab());
  GrammarMatcher m(g);
  int opened = 0;
  while (opened < 300 && m.accept_text(R"({"a":)")) ++opened;
  EXPECT_EQ(opened, GrammarMatcher::kMaxStackDepth);
  const uint64_t* bits = m.mask();
  bool any = false;
  for (int w = 0; w < g->vocab().mask_words(); ++w) any = any || bits[w] != 0;
  EXPECT_TRUE(any);
  const std::string completion = m.shortest_completion();
  EXPECT_EQ(completion, cat("0", std::string(static_cast<size_t>(opened), '}')));
  EXPECT_TRUE(m.accept_text(completion));
  EXPECT_TRUE(m.can_end());
}

}  // namespace
}  // namespace smolrt::grammar
