#include "runtime/tool_parser.h"

#include <nlohmann/json.hpp>

namespace smolrt {

namespace {

constexpr std::string_view kOpenTag = "<tool_call>";
constexpr std::string_view kCloseTag = "</tool_call>";

bool blank(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

bool is_args_key(const std::string& k) {
  return k == "arguments" || k == "parameters";
}

}  // namespace

ToolCallParser::ToolCallParser(ToolFormat format, uint64_t id_seed)
    : format_(format),
      rng_(id_seed),
      mode_(format == ToolFormat::kLlama3 ? Mode::kStart : Mode::kText) {}

std::string ToolCallParser::new_id() {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) {
    uint64_t z = (rng_ += 0x9E3779B97F4A7C15ull);  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    id += kChars[(z ^ (z >> 31)) % 62];
  }
  return id;
}

bool ToolCallParser::calls_ok() const {
  if (abandoned_) return false;
  for (const Call& c : calls_) {
    if (!c.complete || !c.named) return false;
    const auto args = nlohmann::json::parse(c.args, nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) return false;
  }
  return true;
}

void ToolCallParser::emit_content(std::string_view s) {
  out_.content += s;
}

void ToolCallParser::emit_args(std::string_view s) {
  Call& c = calls_.back();
  c.args += s;
  if (!c.named) {
    pending_args_ += s;
    return;
  }
  const int index = static_cast<int>(calls_.size()) - 1;
  if (out_.tool_calls.empty() || out_.tool_calls.back().index != index)
    out_.tool_calls.push_back({index, "", "", ""});
  out_.tool_calls.back().arguments += s;
}

void ToolCallParser::start_call() {
  calls_.push_back({});
  scan_ = Scan::kOpen;
  key_.clear();
  value_.clear();
  pending_args_.clear();
  depth_ = 0;
  in_string_ = escaped_ = string_value_ = false;
  mode_ = Mode::kBody;
}

// The call's text is not a call. Before its name went out it is content after all; after, the
// call stays (incomplete: parse_tool_reply then keeps the reply as text) and the rest is content.
void ToolCallParser::fail_call() {
  abandoned_ = true;
  if (!calls_.back().named) {
    calls_.pop_back();
    emit_content(raw_);
  }
  raw_.clear();
  mode_ = Mode::kText;
}

void ToolCallParser::end_value() {
  Call& c = calls_.back();
  if (key_ == "name" && !c.named) {
    const auto name = nlohmann::json::parse(value_, nullptr, /*allow_exceptions=*/false);
    if (!string_value_ || !name.is_string() || name.get<std::string>().empty()) {
      scan_ = Scan::kDone;  // marks the failure for body_char
      return;
    }
    c.name = name.get<std::string>();
    c.id = new_id();
    c.named = true;
    const int index = static_cast<int>(calls_.size()) - 1;
    out_.tool_calls.push_back({index, c.id, c.name, pending_args_});
    pending_args_.clear();
  }
  scan_ = Scan::kNext;
}

// One character of a call's JSON object.
void ToolCallParser::body_char(char c) {
  raw_ += c;
  Call& call = calls_.back();
  switch (scan_) {
    case Scan::kOpen:
      if (blank(c)) return;
      if (c == '{') {
        scan_ = Scan::kKey;
        return;
      }
      return fail_call();
    case Scan::kKey:
      if (blank(c)) return;
      if (c == '"') {
        value_.assign(1, '"');
        escaped_ = false;
        scan_ = Scan::kInKey;
        return;
      }
      if (c == '}') break;  // the end of the object (after '{' or a trailing ',')
      return fail_call();
    case Scan::kInKey:
      value_ += c;
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        const auto key = nlohmann::json::parse(value_, nullptr, /*allow_exceptions=*/false);
        key_ = key.is_string() ? key.get<std::string>() : "";
        scan_ = Scan::kColon;
      }
      return;
    case Scan::kColon:
      if (blank(c)) return;
      if (c == ':') {
        scan_ = Scan::kValue;
        return;
      }
      return fail_call();
    case Scan::kValue:
      if (blank(c)) return;
      if (c == ',' || c == '}' || c == ']' || c == ':') return fail_call();
      value_.assign(1, c);
      depth_ = c == '{' || c == '[' ? 1 : 0;
      in_string_ = string_value_ = c == '"';
      escaped_ = false;
      scan_ = Scan::kInValue;
      if (is_args_key(key_)) emit_args(std::string_view(&c, 1));
      return;
    case Scan::kInValue: {
      bool complete = false;
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
          complete = depth_ == 0;
        }
      } else if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if ((c == '}' || c == ']') && depth_ > 0) {
        complete = --depth_ == 0;
      } else if (depth_ == 0 && (blank(c) || c == ',' || c == '}')) {
        // A number, true, false or null ends at a delimiter, which then counts for the object.
        raw_.pop_back();
        end_value();
        if (scan_ == Scan::kDone) return fail_call();
        return body_char(c);
      }
      value_ += c;
      if (is_args_key(key_)) emit_args(std::string_view(&c, 1));
      if (complete) {
        end_value();
        if (scan_ == Scan::kDone) return fail_call();
      }
      return;
    }
    case Scan::kNext:
      if (blank(c)) return;
      if (c == ',') {
        scan_ = Scan::kKey;
        return;
      }
      if (c == '}') break;
      return fail_call();
    case Scan::kDone:
      return;
  }
  // The object closed.
  if (!call.named) return fail_call();
  if (call.args.empty()) emit_args("{}");  // a call without arguments takes none
  call.complete = true;
  scan_ = Scan::kDone;
  raw_.clear();
  held_.clear();
  mode_ = Mode::kAfterBody;
}

// Text outside calls. Hermes holds back trailing blanks and a possible "<tool_call>" start;
// Llama 3 text is all content.
void ToolCallParser::text_char(char c) {
  if (format_ == ToolFormat::kLlama3) return emit_content(std::string_view(&c, 1));
  const size_t blanks = held_.find('<') == std::string::npos ? held_.size() : held_.find('<');
  if (blanks < held_.size() || c == '<') {  // inside a possible tag
    std::string tag = held_.substr(blanks) + c;
    if (tag == kOpenTag) {  // blanks before a call are dropped
      held_.clear();
      start_call();
      raw_.assign(kOpenTag);
      return;
    }
    if (kOpenTag.starts_with(tag)) {
      held_ += c;
      return;
    }
    emit_content(held_);
    held_.clear();
    if (c == '<') {
      held_ = "<";
      return;
    }
  }
  if (blank(c)) {
    held_ += c;
    return;
  }
  emit_content(held_);
  held_.clear();
  emit_content(std::string_view(&c, 1));
}

// After a call's closing brace: Hermes expects "</tool_call>", Llama 3 ';' and another call.
void ToolCallParser::after_char(char c) {
  if (format_ == ToolFormat::kLlama3) {
    if (blank(c)) return;
    if (c == ';') {
      mode_ = Mode::kStart;
      return;
    }
    mode_ = Mode::kText;
    return text_char(c);
  }
  const size_t blanks = held_.find('<') == std::string::npos ? held_.size() : held_.find('<');
  if (blanks == held_.size() && blank(c)) {
    held_ += c;
    return;
  }
  const std::string tag = held_.substr(blanks) + c;
  if (tag == kCloseTag) {
    held_.clear();
    mode_ = Mode::kText;
    return;
  }
  if (kCloseTag.starts_with(tag)) {
    held_ += c;
    return;
  }
  // No closing tag: the call stands; the text goes on (another call may start).
  const std::string again = held_ + c;
  held_.clear();
  mode_ = Mode::kText;
  for (char x : again) text_char(x);
}

ReplyDelta ToolCallParser::push(std::string_view text) {
  out_ = {};
  for (char c : text) {
    switch (mode_) {
      case Mode::kStart:  // Llama 3: a call when the first non-blank character is '{'
        if (blank(c)) {
          held_ += c;
        } else if (c == '{') {
          raw_ = held_;
          held_.clear();
          start_call();
          body_char(c);
        } else {
          mode_ = Mode::kText;
          if (calls_.empty()) emit_content(held_);
          held_.clear();
          text_char(c);
        }
        break;
      case Mode::kText:
        text_char(c);
        break;
      case Mode::kBody:
        body_char(c);
        break;
      case Mode::kAfterBody:
        after_char(c);
        break;
    }
  }
  return std::move(out_);
}

ReplyDelta ToolCallParser::finish() {
  out_ = {};
  if (mode_ == Mode::kBody) {
    abandoned_ = true;
    if (!calls_.back().named) {  // an unfinished call without a name: it was text
      calls_.pop_back();
      emit_content(raw_);
    }
  } else if (mode_ == Mode::kText || mode_ == Mode::kStart) {
    // Blanks at the very end are the reply's own unless calls came before them.
    const bool only_blanks = held_.find_first_not_of(" \n\r\t") == std::string::npos;
    if (!(only_blanks && !calls_.empty())) emit_content(held_);
  }
  held_.clear();
  raw_.clear();
  mode_ = Mode::kText;
  return std::move(out_);
}

ParsedReply parse_tool_reply(ToolFormat format, std::string_view text, uint64_t id_seed) {
  ToolCallParser p(format, id_seed);
  ParsedReply r;
  std::vector<ToolCallDelta> deltas;
  for (ReplyDelta d : {p.push(text), p.finish()}) {
    r.content += d.content;
    deltas.insert(deltas.end(), d.tool_calls.begin(), d.tool_calls.end());
  }
  if (p.n_calls() == 0 || !p.calls_ok()) return {std::string(text), {}};
  r.tool_calls.resize(static_cast<size_t>(p.n_calls()));
  for (const ToolCallDelta& d : deltas) {
    ChatToolCall& c = r.tool_calls[static_cast<size_t>(d.index)];
    if (!d.id.empty()) c.id = d.id;
    if (!d.name.empty()) c.name = d.name;
    c.arguments += d.arguments;
  }
  for (ChatToolCall& c : r.tool_calls)
    if (c.arguments.empty()) c.arguments = "{}";
  return r;
}

}  // namespace smolrt
