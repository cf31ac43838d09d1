// Compares `got` with the checked-in file at `path` (tests/data/...); with
// OFFLOAD_UPDATE_EXPECTED=1 rewrites the file instead and skips the test. Call it last in a
// test: its ASSERTs and GTEST_SKIP return from here, not from the test.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// A file of several expected texts: each section opens with a line "=== NAME ===" and runs to
// the next such line. Compares `got` with section `name` of the file at `path`; with
// OFFLOAD_UPDATE_EXPECTED=1 rewrites that section (added at the end if new) and skips.
inline std::vector<std::pair<std::string, std::string>> read_sections(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream is(path);
  std::string line;
  while (std::getline(is, line)) {
    if (line.size() > 8 && line.rfind("=== ", 0) == 0 && line.compare(line.size() - 4, 4, " ===") == 0)
      out.emplace_back(line.substr(4, line.size() - 8), std::string());
    else if (!out.empty())
      out.back().second += line + "\n";
  }
  return out;
}

inline void expect_section_matches(const std::string& path, const std::string& name, const std::string& got,
                                   const std::string& what) {
  const char* update = std::getenv("OFFLOAD_UPDATE_EXPECTED");
  if (update && std::string(update) == "1") {
    // Tests run in parallel processes: each rewrites the file under a lock, keeping the others' sections.
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << "cannot open " << path;
    ::flock(fd, LOCK_EX);
    auto sections = read_sections(path);
    auto it = sections.begin();
    while (it != sections.end() && it->first != name) ++it;
    if (it == sections.end()) sections.emplace_back(name, got);
    else it->second = got;
    std::ofstream os(path, std::ios::trunc);
    for (const auto& [n, text] : sections) os << "=== " << n << " ===\n" << text;
    os.close();
    ::close(fd);
    ASSERT_FALSE(os.fail()) << "cannot write " << path;
    GTEST_SKIP() << "rewrote " << name << " in " << path << " (OFFLOAD_UPDATE_EXPECTED=1): nothing compared";
  }
  auto sections = read_sections(path);
  auto it = sections.begin();
  while (it != sections.end() && it->first != name) ++it;
  ASSERT_TRUE(it != sections.end()) << "no expected " << name << " in " << path
                                    << "; write it with OFFLOAD_UPDATE_EXPECTED=1";
  EXPECT_EQ(it->second, got) << what << " changed; if that is intended, rerun with OFFLOAD_UPDATE_EXPECTED=1 and check the diff";
}

}  // namespace offload
