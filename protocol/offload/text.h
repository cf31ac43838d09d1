// Text in every format liboffload writes (status frames, JSON, Prometheus labels, traces):
// valid UTF-8, cut only at character boundaries, and escaped by one escaper. A command line
// is arbitrary bytes, and a frame's fixed field cut inside a character made the metrics page
// and `offloadctl status --json` invalid UTF-8, which Prometheus and json.loads reject whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace offload {

// The length of the well-formed UTF-8 sequence starting at s[i], or 0 if none starts there
// (a stray continuation byte, a truncated sequence, an overlong form, a surrogate, past U+10FFFF).
inline size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) n = 3, lo = 0xA0;
  else if (c == 0xED) n = 3, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) n = 3;
  else if (c == 0xF0) n = 4, lo = 0x90;
  else if (c == 0xF4) n = 4, hi = 0x8F;
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else return 0;
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

// `s` with every byte that is not part of a well-formed sequence replaced by '?'.
inline std::string utf8_clean(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n) o.append(s.substr(i, n));
    else o += '?';
    i += n ? n : 1;
  }
  return o;
}

// The longest prefix of the clean text `s` of at most `max` bytes that ends between characters.
inline size_t utf8_prefix(std::string_view s, size_t max) {
  if (s.size() <= max) return s.size();
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // s[n] continues a character
  return n;
}

// Into a fixed field of `cap` bytes (a frame's): cleaned, cut between characters, NUL-ended.
inline void copy_utf8(char* dst, size_t cap, std::string_view s) {
  if (!cap) return;
  const std::string c = utf8_clean(s);
  const size_t n = utf8_prefix(c, cap - 1);
  std::memcpy(dst, c.data(), n);
  std::memset(dst + n, 0, cap - n);
}

// A JSON string's body: cleaned, quotes and backslashes escaped, control characters as their
// short escapes or \u00XX.
inline std::string json_escape(std::string_view s) {
  static const char hex[] = "0123456789abcdef";
  std::string o;
  for (char ch : utf8_clean(s)) {
    switch (ch) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          o += "\\u00";
          o += hex[static_cast<unsigned char>(ch) >> 4];
          o += hex[ch & 15];
        } else {
          o += ch;
        }
    }
  }
  return o;
}

// A Prometheus label value: cleaned; backslash, quote and newline escaped (the text format's
// three escapes), other control characters as spaces.
inline std::string label_escape(std::string_view s) {
  std::string o;
  for (char ch : utf8_clean(s)) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (c == '\n') {
      o += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      o += ' ';
    } else {
      o += ch;
    }
  }
  return o;
}

}  // namespace offload
