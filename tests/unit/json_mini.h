// A strict, minimal JSON parser for tests: enough to check that output is well-formed JSON
// and to read values back. Rejects trailing commas, unquoted keys, bad escapes, trailing
// garbage. Numbers are kept both as text and as double.
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace offload::testing {

struct Json {
  enum Type { Null, Bool, Number, String, Array, Object } type = Null;
  bool b = false;
  double num = 0;
  std::string text;  // String: the value; Number: the literal as written
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  bool has(const std::string& k) const { return type == Object && fields.count(k); }
  const Json& operator[](const std::string& k) const { return fields.at(k); }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  // Parses the whole input; false (and *error) if it is not exactly one JSON value.
  bool parse(Json* out, std::string* error) {
    i_ = 0;
    err_.clear();
    bool ok = value(out, 0);
    ws();
    if (ok && i_ != s_.size()) ok = fail("trailing characters");
    if (!ok && error) *error = err_ + " at offset " + std::to_string(i_);
    return ok;
  }

 private:
  bool fail(const char* why) {
    if (err_.empty()) err_ = why;
    return false;
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool lit(const char* w) {
    size_t n = std::char_traits<char>::length(w);
    if (s_.compare(i_, n, w) != 0) return fail("bad literal");
    i_ += n;
    return true;
  }
  bool value(Json* v, int depth) {
    if (depth > 64) return fail("too deep");
    ws();
    if (i_ >= s_.size()) return fail("unexpected end");
    char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->type = Json::String;
      return string(&v->text);
    }
    if (c == 't') { v->type = Json::Bool; v->b = true; return lit("true"); }
    if (c == 'f') { v->type = Json::Bool; v->b = false; return lit("false"); }
    if (c == 'n') { v->type = Json::Null; return lit("null"); }
    return number(v);
  }
  bool number(Json* v) {
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return fail("bad number");
    if (s_[i_] == '0') ++i_;
    else while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return fail("bad fraction");
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[i_]))) return fail("bad exponent");
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    v->type = Json::Number;
    v->text = s_.substr(start, i_ - start);
    v->num = std::strtod(v->text.c_str(), nullptr);
    return true;
  }
  bool string(std::string* out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= s_.size()) break;
      char e = s_[i_++];
      switch (e) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) return fail("short \\u escape");
          for (int k = 0; k < 4; ++k)
            if (!std::isxdigit(static_cast<unsigned char>(s_[i_ + k]))) return fail("bad \\u escape");
          unsigned cp = static_cast<unsigned>(std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16));
          i_ += 4;
          *out += cp < 0x80 ? static_cast<char>(cp) : '?';
          break;
        }
        default: return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }
  bool array(Json* v, int depth) {
    v->type = Json::Array;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == ']') { ++i_; return true; }
    for (;;) {
      v->items.emplace_back();
      if (!value(&v->items.back(), depth + 1)) return false;
      ws();
      if (i_ >= s_.size()) return fail("unterminated array");
      if (s_[i_] == ',') { ++i_; continue; }
      if (s_[i_] == ']') { ++i_; return true; }
      return fail("expected ',' or ']'");
    }
  }
  bool object(Json* v, int depth) {
    v->type = Json::Object;
    ++i_;
    ws();
    if (i_ < s_.size() && s_[i_] == '}') { ++i_; return true; }
    for (;;) {
      ws();
      if (i_ >= s_.size() || s_[i_] != '"') return fail("expected a key");
      std::string key;
      if (!string(&key)) return false;
      ws();
      if (i_ >= s_.size() || s_[i_] != ':') return fail("expected ':'");
      ++i_;
      if (v->fields.count(key)) return fail("duplicate key");
      if (!value(&v->fields[key], depth + 1)) return false;
      ws();
      if (i_ >= s_.size()) return fail("unterminated object");
      if (s_[i_] == ',') { ++i_; continue; }
      if (s_[i_] == '}') { ++i_; return true; }
      return fail("expected ',' or '}'");
    }
  }

  const std::string& s_;
  size_t i_ = 0;
  std::string err_;
};

inline bool parse_json(const std::string& s, Json* out, std::string* error = nullptr) {
  return JsonParser(s).parse(out, error);
}

}  // namespace offload::testing
