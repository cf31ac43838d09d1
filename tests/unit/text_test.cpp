// Text in every format we write stays valid UTF-8: fixed fields are cut between characters,
// stray bytes are replaced, and one escaper serves JSON and another Prometheus labels.
#include <gtest/gtest.h>

#include <string>

#include "offload/text.h"

namespace offload {
namespace {

bool valid_utf8(const std::string& s) { return utf8_clean(s) == s; }

TEST(Text, FixedFieldsAreCutBetweenCharacters) {
  // "é" is 2 bytes, "€" 3, "𝄞" 4: after "abcdef" each straddles an 8-byte field's 7 text bytes.
  for (const std::string tail : {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9d\x84\x9e"}) {
    char field[8];
    copy_utf8(field, sizeof field, "abcdef" + tail + tail);
    EXPECT_EQ(std::string(field), "abcdef") << tail;
  }
  char field[8];
  copy_utf8(field, sizeof field, "abcde\xc3\xa9xyz");  // the character ends at the last byte
  EXPECT_EQ(std::string(field), "abcde\xc3\xa9");
  copy_utf8(field, sizeof field, "ab\xff");  // stray bytes are replaced first
  EXPECT_EQ(std::string(field), "ab?");
  EXPECT_TRUE(valid_utf8(field));
  char one[1] = {'x'};
  copy_utf8(one, sizeof one, "x");
  EXPECT_EQ(one[0], '\0');
}

TEST(Text, StrayBytesAreReplaced) {
  EXPECT_EQ(utf8_clean("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(utf8_clean("cut \xe2\x82"), "cut ??");         // a sequence cut at the end
  EXPECT_EQ(utf8_clean("\x80x"), "?x");                    // a lone continuation byte
  EXPECT_EQ(utf8_clean("\xc0\xaf"), "??");                 // an overlong '/'
  EXPECT_EQ(utf8_clean("\xed\xa0\x80"), "???");            // a surrogate
  EXPECT_EQ(utf8_clean("\xf4\x90\x80\x80"), "????");       // past U+10FFFF
  EXPECT_EQ(utf8_clean(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(Text, OneJsonEscaper) {
  EXPECT_EQ(json_escape("a\"b\\c"), "a\\\"b\\\\c");
  EXPECT_EQ(json_escape("line\nnext\ttab\r\x01\x1f\x7f"), "line\\nnext\\ttab\\r\\u0001\\u001f\x7f");
  EXPECT_EQ(json_escape("caf\xc3\xa9 \xff"), "caf\xc3\xa9 ?");
}

TEST(Text, PrometheusLabelsUseTheTextFormatsEscapes) {
  EXPECT_EQ(label_escape("python3 -c \"x\\y\"\nz\t\xe2\x82"), "python3 -c \\\"x\\\\y\\\"\\nz ??");
}

}  // namespace
}  // namespace offload
