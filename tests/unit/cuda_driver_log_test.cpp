// CudaDriver on a fake libcuda (fake_libcuda.cpp): a failed driver call is logged with the entry
// point's name and its CUresult, at warn level for the first 32 of a process and at debug after;
// a query's CUDA_ERROR_NOT_READY is an answer and is not logged.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/log.h"
#include "cuda_driver.h"
#include "hooks/hook_table.h"

namespace offload {
namespace {

// Loads the fake driver and returns its knob; exits with 2 when it cannot. Only in a death test's
// child: a libcuda loaded into the test binary's own process would change what the hook tests see.
using FailFn = void (*)(const char* fn, int result);
FailFn load_fake_driver() {
  void* lib = dlopen(OFFLOAD_FAKE_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
  auto fail = lib ? reinterpret_cast<FailFn>(hooks::real_dlsym(lib, "offload_fake_fail")) : nullptr;
  if (!fail || dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) != lib) std::_Exit(2);
  return fail;
}

std::string line(const char* level, const std::string& text) {
  return "\\[offload " + std::string(level) + "\\] pid [0-9]+: " + text + "\n";
}
const std::string kReserveFailed = "cuMemAddressReserve failed: CUresult 2 \\(CUDA_ERROR_OUT_OF_MEMORY\\)";

TEST(CudaDriverLog, AFailedCallIsLoggedWithItsNameAndResultAndNotReadyIsNot) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process, with no libcuda loaded yet
  auto run = [] {
    FailFn fail = load_fake_driver();
    CudaDriver d;
    fail("cuMemAddressReserve", 2);
    if (d.reserve(1 << 21) != 0) std::_Exit(3);
    fail("cuEventQuery", 600);
    if (d.event_query(0x10) != 0) std::_Exit(4);
    fail("cuEventQuery", 999);  // a result the driver has no name for: the number alone
    if (d.event_query(0x10) != -1) std::_Exit(5);
    fail("cuMemAddressReserve", 4);  // CUDA_ERROR_DEINITIALIZED: the process is exiting, not said
    if (d.reserve(1 << 21) != 0) std::_Exit(7);
    fail(nullptr, 0);
    if (d.reserve(1 << 21) == 0 || d.event_query(0x10) != 1) std::_Exit(6);
    std::_Exit(0);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(0),
              "^" + line("warning", kReserveFailed) + line("warning", "cuEventQuery failed: CUresult 999") + "$");
}

TEST(CudaDriverLog, FailuresPastTheFirst32AreLoggedAtDebugLevel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    FailFn fail = load_fake_driver();
    set_log_level("debug");
    CudaDriver d;
    fail("cuMemAddressReserve", 2);
    for (int i = 0; i < 33; ++i)
      if (d.reserve(1 << 21) != 0) std::_Exit(3);
    std::_Exit(0);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(0),
              "^(" + line("warning", kReserveFailed) + "){32}" + line("debug", kReserveFailed) + "$");
}

}  // namespace
}  // namespace offload
