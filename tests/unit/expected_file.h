// Compares `got` with the checked-in file at `path` (tests/data/...); with
// OFFLOAD_UPDATE_EXPECTED=1 rewrites the file instead and skips the test. Call it last in a
// test: its ASSERTs and GTEST_SKIP return from here, not from the test.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace offload {

inline void expect_file_matches(const std::string& path, const std::string& got, const std::string& what) {
  const char* update = std::getenv("OFFLOAD_UPDATE_EXPECTED");
  if (update && std::string(update) == "1") {
    std::ofstream os(path, std::ios::trunc);
    os << got;
    ASSERT_TRUE(os.good()) << "cannot write " << path;
    GTEST_SKIP() << "rewrote " << path << " (OFFLOAD_UPDATE_EXPECTED=1): nothing compared";
  }
  std::ifstream is(path);
  ASSERT_TRUE(is) << "no expected plan " << path << "; write it with OFFLOAD_UPDATE_EXPECTED=1";
  std::stringstream want;
  want << is.rdbuf();
  EXPECT_EQ(want.str(), got) << what << " changed; if that is intended, rerun with OFFLOAD_UPDATE_EXPECTED=1 and check the diff";
}

}  // namespace offload
