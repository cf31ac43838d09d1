#include "common/json_writer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "json_mini.h"

namespace offload {
namespace {

TEST(JsonWriter, WritesNestedObjectsAndArraysWithTheirCommas) {
  JsonWriter w;
  w.object().field("version", 1).field("on", true).field("off", false).field("name", "plan");
  w.object("counters").field("kernels", uint64_t{18446744073709551615ull}).field("delta", int64_t{-3}).end();
  w.array("empty").end().object("none").end();
  w.array("waits");
  w.array().value(int64_t{7}).value(1.5).value("w").value(-1).end();
  w.array().value(int64_t{9}).value(0.25).value("a").value(1).end();
  w.end().key("persistent").null().key("cupti").raw("{\"records\":2}").end();
  EXPECT_EQ(w.str(),
            "{\"version\":1,\"on\":true,\"off\":false,\"name\":\"plan\","
            "\"counters\":{\"kernels\":18446744073709551615,\"delta\":-3},\"empty\":[],\"none\":{},"
            "\"waits\":[[7,1.5,\"w\",-1],[9,0.25,\"a\",1]],\"persistent\":null,\"cupti\":{\"records\":2}}");
}

TEST(JsonWriter, EscapesQuotesBackslashesAndControlCharacters) {
  JsonWriter w;
  w.object().field("a\"b", std::string("say \"hi\"\\ C:\\dir\n\ttab\r\b\f") + '\x01' + '\x1f' + "\x7f end").end();
  const std::string expected =
      "{\"a\\\"b\":\"say \\\"hi\\\"\\\\ C:\\\\dir\\n\\ttab\\r\\b\\f\\u0001\\u001f\x7f end\"}";
  EXPECT_EQ(w.str(), expected);
  // And a strict parser reads the value back as written.
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(w.str(), &j, &err)) << err;
  EXPECT_EQ(j["a\"b"].text, std::string("say \"hi\"\\ C:\\dir\n\ttab\r\b\f") + '\x01' + '\x1f' + "\x7f end");
}

TEST(JsonWriter, WritesNumbersAsAStreamDoes) {
  // The stats' figures kept what std::ostream printed before the writer: six significant digits.
  JsonWriter w;
  w.array().value(1.0).value(1.15).value(0.1234567).value(12345678.0).value(0.0).value(uint32_t{3}).end();
  EXPECT_EQ(w.str(), "[1,1.15,0.123457,1.23457e+07,0,3]");
}

}  // namespace
}  // namespace offload
