// JsonWriter: writes one JSON value (objects, arrays, numbers, booleans, null, escaped strings)
// into a string, placing the commas itself, for the stats the shim and its parts report.
//
// Numbers are written as an std::ostream writes them (doubles with its default six significant
// digits), so that output moved onto the writer keeps its figures. Strings are escaped: quotes,
// backslashes and control characters. raw() takes a value that is JSON already (a part's own
// writer). Misuse (a value in an object without a key, end() with nothing open) is the caller's
// bug and is not checked. Not thread-safe: one writer per thread.
#pragma once

#include <cstdio>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "offload/text.h"

namespace offload {

class JsonWriter {
 public:
  JsonWriter& object() {
    before_value();
    os_ << '{';
    open_.push_back('}');
    first_.push_back(true);
    return *this;
  }
  JsonWriter& array() {
    before_value();
    os_ << '[';
    open_.push_back(']');
    first_.push_back(true);
    return *this;
  }
  // Closes the innermost object or array.
  JsonWriter& end() {
    os_ << open_.back();
    open_.pop_back();
    first_.pop_back();
    return *this;
  }
  JsonWriter& key(std::string_view k) {
    comma();
    string(k);
    os_ << ':';
    keyed_ = true;
    return *this;
  }

  JsonWriter& value(bool b) {
    before_value();
    os_ << (b ? "true" : "false");
    return *this;
  }
  JsonWriter& value(std::string_view s) {
    before_value();
    string(s);
    return *this;
  }
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  template <class T>
    requires(std::is_arithmetic_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, char>)
  JsonWriter& value(T n) {
    before_value();
    os_ << n;
    return *this;
  }
  JsonWriter& null() {
    before_value();
    os_ << "null";
    return *this;
  }
  // A value written as JSON elsewhere, put in as it is.
  JsonWriter& raw(std::string_view json) {
    before_value();
    os_ << json;
    return *this;
  }
  template <class T>
  JsonWriter& field(std::string_view k, const T& v) {
    return key(k).value(v);
  }
  // Opens an object or an array as the value of `k`.
  JsonWriter& object(std::string_view k) { return key(k).object(); }
  JsonWriter& array(std::string_view k) { return key(k).array(); }

  std::string str() const { return os_.str(); }

 private:
  // A value after a key takes no comma; one in an array after another does.
  void before_value() {
    if (keyed_) keyed_ = false;
    else comma();
  }
  void comma() {
    if (first_.empty()) return;
    if (!first_.back()) os_ << ',';
    first_.back() = false;
  }
  void string(std::string_view s) { os_ << '"' << json_escape(s) << '"'; }

  std::ostringstream os_;
  std::vector<char> open_;   // per open container: the character that closes it
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool keyed_ = false;       // a key was written: its value comes next
};

}  // namespace offload
