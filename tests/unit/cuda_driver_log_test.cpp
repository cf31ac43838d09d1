// CudaDriver on a fake libcuda (fake_libcuda.cpp): a failed driver call is logged with the entry
// point's name and its CUresult, at warn level for the first 32 of a process and at debug after;
// a query's CUDA_ERROR_NOT_READY is an answer and is not logged.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "capture_mode.h"
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

// One of the fake driver's knobs by name (the fake is loaded): exits with 2 when it lacks it.
template <class Fn>
Fn fake_knob(const char* name) {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  auto fn = lib ? reinterpret_cast<Fn>(hooks::real_dlsym(lib, name)) : nullptr;
  if (!fn) std::_Exit(2);
  return fn;
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

// A launch made again goes to the driver's cuLaunchKernel with the geometry and arguments given;
// a refusal is said and answered false.
TEST(CudaDriverLog, ALaunchMadeAgainReachesTheDriverAsGiven) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    FailFn fail = load_fake_driver();
    auto last = fake_knob<void (*)(unsigned long long*)>("offload_fake_last_launch");
    CudaDriver d;
    LaunchGeom g;
    g.grid[0] = 4, g.grid[1] = 5, g.block[0] = 256, g.smem = 1024;
    uint64_t arg = 0x1234;
    void* params[] = {&arg};
    if (!d.launch_kernel(0x40, g, 0x10, params)) std::_Exit(3);
    unsigned long long seen[9];
    last(seen);
    const unsigned long long want[] = {4, 5, 1, 256, 1, 1, 1024, 0, 0x1234};
    for (int i = 0; i < 9; ++i)
      if (seen[i] != want[i]) std::_Exit(10 + i);
    // With attributes: cuLaunchKernelEx, the attributes as given.
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    g.attrs = &attr;
    g.nattrs = 1;
    g.attr_bytes = sizeof attr;
    if (!d.launch_kernel(0x40, g, 0x10, params)) std::_Exit(5);
    auto last_ex = fake_knob<void (*)(unsigned long long*)>("offload_fake_last_launch_ex");
    unsigned long long ex[3];
    last_ex(ex);
    if (ex[0] != 4 || ex[1] != 1 || ex[2] != CU_LAUNCH_ATTRIBUTE_PRIORITY) std::_Exit(6);
    g.attr_bytes = 1;  // not whole attributes: refused before the driver sees it
    if (d.launch_kernel(0x40, g, 0x10, params)) std::_Exit(7);
    g.nattrs = 0;
    fail("cuLaunchKernel", 1);
    if (d.launch_kernel(0x40, g, 0x10, params)) std::_Exit(4);
    std::_Exit(0);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(0),
              "^" + line("warning", "cuLaunchKernel failed: CUresult 1") + "$");
}

// The copy gate (OFFLOAD_CAP_GATE): a copy out on the gated stream is queued in chunks, each
// behind a wait on the gate, and other streams' copies are not; a grant is made with the gate
// closed and opens it again; a refused wait turns the gate off for good and the copy goes on
// ungated.
TEST(CudaDriverLog, CopiesOutWaitAtAGateThatEachGrantCloses) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    FailFn fail = load_fake_driver();
    auto log = fake_knob<size_t (*)(char*, size_t)>("offload_fake_log");
    auto calls = [&] {
      static char buf[1 << 16];
      log(buf, sizeof buf);
      return std::string(buf);
    };
    CudaDriver d;
    d.learn_context();
    const Stream s = 0x20, other = 0x30;
    const DevPtr va = 0x7f0000000000ull;
    if (!d.gate_copies_out(s, 4 << 20, GateChunks::kAhead) || d.gate_copies_out(other, 4 << 20, GateChunks::kAhead)) std::_Exit(3);
    char host[1];
    if (!d.copy_to_host(host, 0x1000, 10 << 20, s)) std::_Exit(4);
    const std::string chunk = "wait:1 copy:4194304 ";
    if (calls() != chunk + chunk + "wait:1 copy:2097152 ") std::_Exit(5);
    if (!d.copy_to_host(host, 0x1000, 10 << 20, other) || calls() != "copy:10485760 ") std::_Exit(6);
    if (!d.grant(va, 2 << 20) || calls() != "grant:0 ") std::_Exit(7);  // the gate closed
    if (!d.copy_to_host(host, 0x1000, 1 << 20, s) || calls() != "wait:1 copy:1048576 ") std::_Exit(8);
    if (!d.grant(va, 2 << 20) || calls() != "grant:0 ") std::_Exit(11);
    Driver::GateCounts c = d.gate_counts();
    if (c.grants != 2 || c.closed_ns == 0 || c.chunks != 4) std::_Exit(12);
    // 8 GiB at once: chunks of the gate's size first, then as core/gate_chunks.h widens them
    // (its own test counts them; here the clock runs, so only bounds are checked).
    if (!d.copy_to_host(host, 0x1000, 8ull << 30, s)) std::_Exit(16);
    std::vector<uint64_t> sizes;
    const std::string got = calls();
    for (size_t at = got.find("copy:"); at != std::string::npos; at = got.find("copy:", at + 1))
      sizes.push_back(std::stoull(got.substr(at + 5)));
    uint64_t sum = 0;
    for (const uint64_t n : sizes) sum += n;
    if (sum != 8ull << 30 || sizes.front() != 4 << 20) std::_Exit(17);
    if (d.gate_counts().chunks != 4 + sizes.size()) std::_Exit(18);
    for (const uint64_t n : sizes)
      if (n % (4 << 20)) std::_Exit(19);
    fail("cuStreamWaitValue32_v2", 1);
    if (!d.copy_to_host(host, 0x1000, 10 << 20, s) || calls() != "wait:1 copy:10485760 ") std::_Exit(13);
    fail(nullptr, 0);
    if (!d.copy_to_host(host, 0x1000, 10 << 20, s) || calls() != "copy:10485760 ") std::_Exit(14);
    if (!d.grant(va, 2 << 20) || calls() != "grant:1 " || d.gate_counts().grants != 2) std::_Exit(15);
    std::_Exit(0);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(0),
              line("warning", "cuStreamWaitValue32 failed: CUresult 1") +
                  line("warning", "a stream memory operation failed: copies out are no longer gated") + "$");
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

// While another thread captures a graph in global mode, the driver refuses an event query (and
// would invalidate that capture). Once the shim has seen a capture, its calls are made in relaxed
// mode and the thread's own mode is put back after each; the shim's worker is relaxed for good.
TEST(CudaDriverLog, OnceACaptureIsSeenTheShimsCallsAreMadeInRelaxedMode) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    FailFn fail = load_fake_driver();
    auto capture = fake_knob<void (*)(int)>("offload_fake_capture");
    auto mode = fake_knob<int (*)()>("offload_fake_capture_mode");
    fail(nullptr, 0);
    CudaDriver d;
    capture(1);
    if (d.stream_capturing(0x20) != 1) std::_Exit(3);  // the shim sees a capture
    if (d.event_query(0x10) != 1) std::_Exit(4);        // relaxed: not refused
    if (mode() != 0) std::_Exit(5);                     // the thread's global mode is back
    std::thread worker([&] {
      relax_capture_checks_for_good();
      std::_Exit(mode() == 2 && d.event_query(0x10) == 1 && mode() == 2 ? 0 : 6);
    });
    worker.join();
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(0), "^$");
}

// Before the shim has seen one, the driver's refusal is logged, and from then on it is relaxed.
TEST(CudaDriverLog, ACallRefusedForACaptureMakesTheNextOnesRelaxed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    FailFn fail = load_fake_driver();
    auto capture = fake_knob<void (*)(int)>("offload_fake_capture");
    fail(nullptr, 0);
    CudaDriver d;
    capture(1);
    if (d.event_query(0x10) != -1) std::_Exit(3);
    if (d.event_query(0x10) != 1) std::_Exit(4);
    std::_Exit(0);
  };
  EXPECT_EXIT(run(), ::testing::ExitedWithCode(0), "^" + line("warning", "cuEventQuery failed: CUresult 900") + "$");
}

}  // namespace
}  // namespace offload
