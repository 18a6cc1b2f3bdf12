// JSON Schema -> grammar, for the subset OpenAI's strict structured outputs accept and a bit
// more (docs/grammar.md lists it): object (properties in the order given, required,
// additionalProperties false/absent, or a map with additionalProperties and no properties),
// array (items, minItems, maxItems), string (enum, const, minLength, maxLength, format date /
// time / date-time / uuid; other formats are annotations), number and integer (minimum,
// maximum, exclusiveMinimum, exclusiveMaximum: exact for integers; for numbers when the bounds
// are integers), boolean, null, enum, const, anyOf, allOf of one schema, type arrays,
// $ref into the document ($defs, definitions, any JSON pointer; recursion allowed), true/{} =
// any JSON value. Everything else that constrains values (pattern, oneOf, not, if/then/else,
// multipleOf, uniqueItems, prefixItems, patternProperties, ...) is refused with a SchemaError
// naming the keyword and its JSON pointer; annotations (title, description, default, examples,
// ...) and unknown keywords are ignored.
//
// The text generated is JSON with bounded whitespace: after { [ , and : and before } ] at most
// one space, or one newline followed by up to 16 spaces (so pretty-printed output works but a
// model cannot pad forever); no whitespace before the first value or after the last. Digit runs
// are capped (number_range.h): integers 19 digits, fractions 16, exponents 3.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace smolrt::grammar {

class SchemaError : public GrammarError {
 public:
  // message: "json schema at <pointer>: <what>".
  SchemaError(std::string pointer, const std::string& what);
  const std::string& pointer() const { return pointer_; }

 private:
  std::string pointer_;
};

// The schema's grammar (root rule "root"). Property order follows the document, so parse the
// schema text with nlohmann::ordered_json. Throws SchemaError.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema);
// Schema text as ordered_json (keeping property order); SchemaError (pointer "") when malformed.
nlohmann::ordered_json parse_schema_text(std::string_view text);
// Any JSON object (response_format {"type": "json_object"}).
Grammar json_object_grammar();

// Adds a schema's rules to a grammar that holds other things too (the tool-call grammars wrap
// several schemas); shared rules (ws, string, number, value, ...) are made once per grammar,
// the schema's own rules get `prefix`. convert() returns the expression for one instance;
// `document` is what $ref pointers resolve against (the schema itself when null).
class JsonSchemaConverter {
 public:
  JsonSchemaConverter(Grammar& g, std::string prefix);
  Expr convert(const nlohmann::ordered_json& schema, const std::string& pointer = "",
               const nlohmann::ordered_json* document = nullptr);
  // JSON whitespace as described above, any value, any object.
  Expr ws();
  Expr any_value();
  Expr any_object();

 private:
  Grammar& g_;
  std::string prefix_;
  const nlohmann::ordered_json* doc_ = nullptr;
  std::map<std::string, int> refs_;  // pointer -> rule
  int depth_ = 0;
  int counter_ = 0;

  Expr visit(const nlohmann::ordered_json& s, const std::string& ptr);
  Expr visit_type(const nlohmann::ordered_json& s, const std::string& type, const std::string& ptr);
  Expr object(const nlohmann::ordered_json& s, const std::string& ptr);
  Expr array(const nlohmann::ordered_json& s, const std::string& ptr);
  Expr string(const nlohmann::ordered_json& s, const std::string& ptr);
  Expr number(const nlohmann::ordered_json& s, const std::string& ptr, bool integer);
  Expr literals(const nlohmann::ordered_json& values, const nlohmann::ordered_json& s,
                const std::string& ptr, const char* keyword);
  Expr reference(const std::string& target, const std::string& ptr);
  int shared(const std::string& name, Expr (JsonSchemaConverter::*make)());
  std::string fresh_name(const std::string& hint);
  Expr make_ws();
  Expr make_string();
  Expr make_char();
  Expr make_value();
  Expr make_object();
  Expr make_array();
  Expr make_number();
  Expr make_integer();
};

}  // namespace smolrt::grammar
