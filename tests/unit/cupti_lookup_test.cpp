// common/cupti_lookup.h: the order libcupti is looked for in, for toolkits, cu12 and cu13
// wheels, CUDA_HOME and an explicit OFFLOAD_CUPTI_LIB.
#include "common/cupti_lookup.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "scratch_dir.h"

namespace offload {
namespace {

// The position of `path` in `v`, or -1.
long index_of(const std::vector<std::string>& v, const std::string& path) {
  auto it = std::find(v.begin(), v.end(), path);
  return it == v.end() ? -1 : it - v.begin();
}

// A scratch directory holding fake libraries (empty files: the lookup never opens them).
class CuptiLookupTest : public testing::ScratchDirTest {};

TEST(CuptiLookup, SoMajorReadsTheFileNamesVersion) {
  EXPECT_EQ(so_major("/x/nvidia/cuda_runtime/lib/libcudart.so.12"), 12);
  EXPECT_EQ(so_major("libcudart.so.13"), 13);
  EXPECT_EQ(so_major("/usr/local/cuda-12.4/lib64/libcudart.so.12.4.127"), 12);
  EXPECT_EQ(so_major("/usr/lib/libcudart.so"), 0);
  EXPECT_EQ(so_major(""), 0);
  EXPECT_EQ(so_major("/opt/lib.so.12/libcudart.so"), 0) << "a directory's name is not the file's";
  EXPECT_EQ(so_major("libcudart.so.12x"), 0);
}

TEST(CuptiLookup, TheHintComesFirstThenTheLoadersSearch) {
  const auto c = cupti_candidates({"/opt/cupti/libcupti.so.13", "", ""});
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[0], "/opt/cupti/libcupti.so.13");
  EXPECT_EQ(c[1], "libcupti.so.13") << "no runtime loaded: the default major";
  EXPECT_LT(index_of(c, "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"), index_of(c, "libcupti.so.12"))
      << "every place of the preferred major before the other major";
}

TEST(CuptiLookup, WithoutARuntimeOrCudaHomeTheToolkitIsSearchedForBothMajors) {
  const std::vector<std::string> want = {
      "libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13", "/usr/local/cuda/lib64/libcupti.so.13",
      "libcupti.so.12", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.12", "/usr/local/cuda/lib64/libcupti.so.12"};
  EXPECT_EQ(cupti_candidates({}), want);
}

TEST_F(CuptiLookupTest, ACu12WheelFindsCuptiInItsOwnPackage) {
  // pip's cu12 layout: the runtime and CUPTI in sibling packages under site-packages/nvidia.
  const std::string cudart = touch("site-packages/nvidia/cuda_runtime/lib/libcudart.so.12");
  const std::string cupti = touch("site-packages/nvidia/cuda_cupti/lib/libcupti.so.12");
  touch("cuda13/extras/CUPTI/lib64/libcupti.so.13");  // a CUDA 13 toolkit in CUDA_HOME
  const CuptiSearch s{"", cudart, root_ + "/cuda13"};
  EXPECT_EQ(preferred_cupti_major(s), 12);
  const auto c = cupti_candidates(s);
  EXPECT_EQ(c[0], "libcupti.so.12") << "the runtime's major first";
  const long beside = index_of(c, root_ + "/site-packages/nvidia/cuda_runtime/lib/libcupti.so.12");
  const long package = index_of(c, cupti);
  ASSERT_GE(beside, 0);
  ASSERT_GE(package, 0);
  EXPECT_EQ(package, beside + 1);
  EXPECT_LT(package, index_of(c, root_ + "/cuda13/extras/CUPTI/lib64/libcupti.so.12"));
  EXPECT_LT(index_of(c, "/usr/local/cuda/lib64/libcupti.so.12"), index_of(c, "libcupti.so.13"))
      << "CUPTI 13 only after every place of CUPTI 12";
  EXPECT_EQ(first_present(c), cupti) << "the wheel's CUPTI 12, not the toolkit's 13";
}

TEST_F(CuptiLookupTest, ACu13WheelFindsCuptiBesideTheRuntime) {
  // pip's cu13 layout: one nvidia/cu13/lib for the runtime and CUPTI.
  const std::string cudart = touch("site-packages/nvidia/cu13/lib/libcudart.so.13");
  const std::string cupti = touch("site-packages/nvidia/cu13/lib/libcupti.so.13");
  touch("cuda12/extras/CUPTI/lib64/libcupti.so.12");
  const CuptiSearch s{"", cudart, root_ + "/cuda12"};
  EXPECT_EQ(preferred_cupti_major(s), 13);
  const auto c = cupti_candidates(s);
  EXPECT_EQ(c[0], "libcupti.so.13");
  EXPECT_EQ(c[1], cupti);
  EXPECT_EQ(index_of(c, root_ + "/site-packages/nvidia/cuda_cupti/lib/libcupti.so.13"), -1)
      << "the cu12 package layout only beside a cu12 runtime package";
  EXPECT_EQ(first_present(c), cupti);
}

TEST_F(CuptiLookupTest, CudaHomeComesBeforeUsrLocalCuda) {
  const std::string home_cupti = touch("cuda/extras/CUPTI/lib64/libcupti.so.13");
  const auto c = cupti_candidates({"", "", root_ + "/cuda/"});
  const long home = index_of(c, home_cupti);
  ASSERT_GE(home, 0) << "a trailing slash on CUDA_HOME makes no double slash";
  EXPECT_EQ(index_of(c, root_ + "/cuda/lib64/libcupti.so.13"), home + 1);
  EXPECT_LT(home, index_of(c, "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"));
  EXPECT_EQ(first_present(c), home_cupti);
}

TEST_F(CuptiLookupTest, AHintThatExistsIsTheFilePresentAndDuplicatesAreDropped) {
  const std::string hint = touch("mine/libcupti.so.12");
  const auto c = cupti_candidates({hint, "/usr/local/cuda/lib64/libcudart.so.13", "/usr/local/cuda"});
  EXPECT_EQ(c[0], hint);
  EXPECT_EQ(first_present(c), hint);
  for (const std::string& p : c) EXPECT_EQ(std::count(c.begin(), c.end(), p), 1) << p;
  EXPECT_EQ(first_present({"libcupti.so.13", root_ + "/absent/libcupti.so.13"}), "")
      << "a bare soname is the loader's to resolve; an absent file is no file";
}

}  // namespace
}  // namespace offload
