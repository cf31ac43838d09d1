// A test fixture with a scratch directory of its own, removed with everything in it after each
// test; touch() makes files in it (empty, or of a given size) with their directories.
#pragma once

#include <gtest/gtest.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace offload::testing {

class ScratchDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offload-unit-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    nftw(root_.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  // ROOT/rel, made with its directories: empty, or `bytes` long (a sparse file).
  std::string touch(const std::string& rel, uint64_t bytes = 0) {
    const std::string path = root_ + "/" + rel;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << "";
    if (bytes) {
      EXPECT_EQ(truncate(path.c_str(), static_cast<off_t>(bytes)), 0);
    }
    return path;
  }
  std::string root_;
};

}  // namespace offload::testing
