// The shim's NVTX marks as a tool sees them: a fake tool (fake_nvtx_tool.cpp), injected the
// way Nsight Systems is (NVTX_INJECTION64_PATH), records what the marks tell it.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "nvtx_marks.h"

namespace {

// The tool's record; NVTX loads the tool at the first mark of the process.
std::string tool_log() {
  void* h = dlopen(OFFLOAD_FAKE_NVTX_TOOL, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return "(tool not loaded)";
  auto f = reinterpret_cast<const char* (*)()>(dlsym(h, "fake_nvtx_log"));
  std::string s = f ? f() : "(no fake_nvtx_log)";
  dlclose(h);
  return s;
}

struct NvtxMarks : ::testing::Test {
  void SetUp() override { setenv("NVTX_INJECTION64_PATH", OFFLOAD_FAKE_NVTX_TOOL, 1); }
};

TEST_F(NvtxMarks, EvictionsAndReloadsAreNamedRangesWithTheirBytes) {
  {
    offload::nvtx::Range r(offload::nvtx::Move::Evict, 4096);
    EXPECT_NE(tool_log().find("push liboffload liboffload evict 4096\n"), std::string::npos) << tool_log();
    EXPECT_EQ(tool_log().find("pop"), std::string::npos) << "open while in scope: " << tool_log();
  }
  { offload::nvtx::Range r(offload::nvtx::Move::Reload, 1ull << 33); }
  EXPECT_EQ(tool_log(),
            "domain liboffload\n"
            "push liboffload liboffload evict 4096\n"
            "pop liboffload\n"
            "push liboffload liboffload reload 8589934592\n"
            "pop liboffload\n");
}

TEST_F(NvtxMarks, StreamsAreNamed) {
  offload::nvtx::name_stream(0x1234, "liboffload copies");
  EXPECT_NE(tool_log().find("stream 4660 liboffload copies\n"), std::string::npos) << tool_log();
}

}  // namespace
