// common/files.h: a directory another user owns or may write to is refused, and a symlink
// planted at a file's name is never followed.
#include "common/files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "scratch_dir.h"

namespace offload {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class FilesTest : public testing::ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    // What an attacker would like overwritten: a file of the user's, outside the directory.
    victim_ = root_ + "/victim";
    std::ofstream(victim_) << "precious";
  }
  void TearDown() override {
    chmod(root_.c_str(), 0700);  // its own mode back before everything in it is removed
    ScratchDirTest::TearDown();
  }
  std::string victim_;
};

TEST_F(FilesTest, WriteDoesNotFollowASymlinkPlantedAtTheName) {
  const std::string target = root_ + "/step-000001.trace";
  ASSERT_EQ(symlink(victim_.c_str(), target.c_str()), 0);
  std::string why;
  EXPECT_FALSE(write_file_nofollow(target, "trace", &why));
  EXPECT_NE(why.find("symlink"), std::string::npos) << why;
  EXPECT_EQ(slurp(victim_), "precious");

  const std::string plain = root_ + "/step-000002.trace";
  ASSERT_TRUE(write_file_nofollow(plain, "one", &why)) << why;
  ASSERT_TRUE(write_file_nofollow(plain, "two", &why)) << why;
  EXPECT_EQ(slurp(plain), "two") << "an existing regular file is truncated and rewritten";
  struct stat st;
  ASSERT_EQ(stat(plain.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(FilesTest, ReplaceSwapsASymlinkForTheFileAndLeavesItsTargetAlone) {
  const std::string target = root_ + "/summary.json";
  // Symlinks at the name and at the fixed temporary name an older writer used.
  ASSERT_EQ(symlink(victim_.c_str(), target.c_str()), 0);
  ASSERT_EQ(symlink(victim_.c_str(), (target + ".tmp").c_str()), 0);
  std::string why;
  ASSERT_TRUE(replace_file(target, "{}\n", &why)) << why;
  EXPECT_EQ(slurp(victim_), "precious");
  struct stat st;
  ASSERT_EQ(lstat(target.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the symlink was replaced by the file";
  EXPECT_EQ(slurp(target), "{}\n");
  ASSERT_TRUE(replace_file(target, "[]\n", &why)) << why;
  EXPECT_EQ(slurp(target), "[]\n");
}

TEST_F(FilesTest, ADirectoryOthersMayWriteIsRefused) {
  const std::string open_dir = root_ + "/traces";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  std::string why;
  EXPECT_FALSE(prepare_trace_dir(open_dir, &why));
  EXPECT_NE(why.find("mode 0777"), std::string::npos) << why;
  EXPECT_FALSE(ensure_private_dir(open_dir, kNoGroupOrOther, &why));

  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  EXPECT_TRUE(prepare_trace_dir(open_dir, &why)) << "others may read traces, not write: " << why;
  EXPECT_FALSE(ensure_private_dir(open_dir, kNoGroupOrOther, &why)) << "the socket's directory is 0700";
}

TEST_F(FilesTest, ADirectoryOfAnotherOwnerIsRefusedSayingWhoOwnsIt) {
  const std::string d = root_ + "/traces";
  ASSERT_EQ(mkdir(d.c_str(), 0700), 0);
  std::string why;
  EXPECT_TRUE(prepare_trace_dir(d, &why)) << why;
  // Ours, but seen by another user: owned by someone else.
  const uid_t other = getuid() + 1;
  EXPECT_FALSE(prepare_trace_dir(d, &why, other));
  EXPECT_NE(why.find("belongs to"), std::string::npos) << why;
  EXPECT_NE(why.find("uid " + std::to_string(getuid())), std::string::npos) << "names the owner: " << why;
  if (geteuid() == 0) {  // root can hand it to another user for real
    ASSERT_EQ(chown(d.c_str(), 65534, static_cast<gid_t>(-1)), 0);
    EXPECT_FALSE(prepare_trace_dir(d, &why));
    EXPECT_NE(why.find("belongs to"), std::string::npos) << why;
    EXPECT_NE(why.find("uid 65534"), std::string::npos) << why;
  } else {  // a directory root really owns
    EXPECT_FALSE(check_private_dir("/", kNoGroupOrOtherWrite, &why));
    EXPECT_NE(why.find("uid 0"), std::string::npos) << why;
  }
}

TEST_F(FilesTest, ASymlinkToADirectoryIsRefusedAndAMissingOneIsMade) {
  const std::string real = root_ + "/real";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  const std::string link = root_ + "/link";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  std::string why;
  EXPECT_FALSE(prepare_trace_dir(link, &why));
  EXPECT_NE(why.find("not a directory"), std::string::npos) << why;

  const std::string fresh = root_ + "/fresh";
  ASSERT_TRUE(prepare_trace_dir(fresh, &why)) << why;
  struct stat st;
  ASSERT_EQ(lstat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(DirOf, SplitsAtTheLastSlash) {
  EXPECT_EQ(dir_of("/a/b/c.sock"), "/a/b");
  EXPECT_EQ(dir_of("c.sock"), ".");
  EXPECT_EQ(dir_of("/c.sock"), "/");
}

}  // namespace
}  // namespace offload
