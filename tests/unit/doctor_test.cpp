// offloadctl doctor: verdicts on made-up machines (facts in, checks out), and the probes on
// made-up directories and environments.
#include "offloadctl/doctor.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/ipc.h"
#include "json_mini.h"
#include "scratch_dir.h"

namespace offload::doctor {
namespace {

constexpr uint64_t GiB = 1ull << 30;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using Vars = std::map<std::string, std::string>;

// An environment: getenv over a map, and the environ-style array of it (which points into it:
// not copyable).
class FakeEnv {
 public:
  explicit FakeEnv(Vars vars) : vars_(std::move(vars)) {
    for (const auto& [k, v] : vars_) lines_.push_back(k + "=" + v);
    for (const std::string& l : lines_) env_.push_back(l.c_str());
    env_.push_back(nullptr);
  }
  FakeEnv(const FakeEnv&) = delete;
  FakeEnv& operator=(const FakeEnv&) = delete;
  Getenv get() const {
    return [this](const char* n) -> const char* {
      auto it = vars_.find(n);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }
  ProbeOptions options() const {
    ProbeOptions o;
    o.get = get();
    o.env = env_.data();
    return o;
  }

 private:
  Vars vars_;
  std::vector<std::string> lines_;
  std::vector<const char*> env_;
};

class DoctorProbeTest : public testing::ScratchDirTest {};

TEST(DoctorDriver, SaysWhyThereIsNoDriverOrGpu) {
  DriverFacts f;
  f.load_error = "libcuda.so.1: cannot open shared object file";
  Check c = judge_driver(f);
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, "libcuda.so.1 does not load")) << c.detail;
  EXPECT_TRUE(has(c.fix, "driver")) << c.fix;

  f = DriverFacts{};
  f.init_result = 34;
  c = judge_driver(f);
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, "stub")) << c.detail;
  EXPECT_TRUE(has(c.fix, "stubs out of LD_LIBRARY_PATH")) << c.fix;

  f.init_result = 100;
  c = judge_driver(f);
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, "no GPU")) << c.detail;

  f.init_result = 999;
  f.init_error = "CUDA_ERROR_UNKNOWN";
  c = judge_driver(f);
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, "CUDA_ERROR_UNKNOWN (999)")) << c.detail;
}

TEST(DoctorDriver, AWorkingDriverIsOkAndAnOldOneWarns) {
  DriverFacts f;
  f.init_result = 0;
  f.version = 13000;
  f.has_param_info = true;
  Check c = judge_driver(f);
  EXPECT_EQ(c.status, Status::Ok);
  EXPECT_TRUE(has(c.detail, "CUDA 13.0")) << c.detail;
  f.version = 12020;
  f.has_param_info = false;
  c = judge_driver(f);
  EXPECT_EQ(c.status, Status::Warn);
  EXPECT_TRUE(has(c.detail, "CUDA 12.2")) << c.detail;
  EXPECT_TRUE(has(c.fix, "12.4")) << c.fix;
}

TEST(DoctorCupti, NamesTheFileTheShimWouldLoad) {
  DriverFacts driver;
  driver.version = 13000;
  CuptiFacts f;
  f.cudart = "/sp/nvidia/cu13/lib/libcudart.so.13";
  f.cudart_source = "--cudart";
  f.major = 13;
  f.candidates = {"libcupti.so.13", "/sp/nvidia/cu13/lib/libcupti.so.13"};
  f.loaded = "libcupti.so.13";
  f.loaded_file = "/sp/nvidia/cu13/lib/libcupti.so.13";
  Check c = judge_cupti(f, driver);
  EXPECT_EQ(c.status, Status::Ok);
  EXPECT_TRUE(has(c.detail, "/sp/nvidia/cu13/lib/libcupti.so.13 for /sp/nvidia/cu13/lib/libcudart.so.13")) << c.detail;

  driver.version = 12080;  // CUPTI 13 needs a driver for CUDA 13
  c = judge_cupti(f, driver);
  EXPECT_EQ(c.status, Status::Warn);
  EXPECT_TRUE(has(c.detail, "older than this CUPTI")) << c.detail;

  f.telemetry_off = true;
  EXPECT_EQ(judge_cupti(f, driver).status, Status::Ok);
}

TEST(DoctorCupti, ACuptiOfAnotherCudaThanTheRuntimeWarns) {
  CuptiFacts f;
  f.cudart = "/sp/nvidia/cuda_runtime/lib/libcudart.so.12";
  f.major = 12;
  f.loaded = "/usr/local/cuda/lib64/libcupti.so.13";
  Check c = judge_cupti(f, DriverFacts{});
  EXPECT_EQ(c.status, Status::Warn);
  EXPECT_TRUE(has(c.detail, "CUPTI of CUDA 13 in a CUDA 12 process")) << c.detail;
  EXPECT_TRUE(has(c.fix, "CUPTI for CUDA 12")) << c.fix;
}

TEST(DoctorCupti, NoCuptiOrOneThatDoesNotLoadWarnsWithWhy) {
  CuptiFacts f;
  f.major = 12;
  f.candidates = {"libcupti.so.12", "/a/libcupti.so.12", "/b/libcupti.so.12", "/c/libcupti.so.12", "/d/libcupti.so.12"};
  Check c = judge_cupti(f, DriverFacts{});
  EXPECT_EQ(c.status, Status::Warn) << "no CUPTI costs GPU times, not the run";
  EXPECT_TRUE(has(c.detail, "looked at libcupti.so.12, /a/libcupti.so.12, /b/libcupti.so.12, /c/libcupti.so.12 and 1 more"))
      << c.detail;
  EXPECT_TRUE(has(c.fix, "CUDA 12")) << c.fix;
  f.present = "/a/libcupti.so.12";
  f.present_error = "file too short";
  c = judge_cupti(f, DriverFacts{});
  EXPECT_EQ(c.status, Status::Warn);
  EXPECT_TRUE(has(c.detail, "/a/libcupti.so.12, looked for without a CUDA runtime to go by (libcupti.so.12 is the "
                            "default), does not load (file too short)"))
      << c.detail;
}

TEST(DoctorAllocator, OnlyTheSettingPyTorchReadsCounts) {
  auto status = [](std::optional<std::string> cuda_conf, std::optional<std::string> conf) {
    return judge_allocator(AllocatorFacts{std::move(cuda_conf), std::move(conf)}).status;
  };
  EXPECT_EQ(status(std::nullopt, std::nullopt), Status::Warn);
  EXPECT_EQ(status("backend:cudaMallocAsync", std::nullopt), Status::Ok);
  EXPECT_EQ(status("max_split_size_mb:64, backend:cudaMallocAsync", std::nullopt), Status::Ok);
  EXPECT_EQ(status("backend:cudaMallocAsync", "backend:cudaMallocAsync"), Status::Ok);
  EXPECT_EQ(status(std::nullopt, "backend:cudaMallocAsync"), Status::Warn) << "PyTorch before 2.9 reads the other";
  EXPECT_EQ(status("backend:cudaMallocAsync", "garbage_collection_threshold:0.8"), Status::Fail)
      << "PyTorch 2.9 on reads PYTORCH_ALLOC_CONF and ignores PYTORCH_CUDA_ALLOC_CONF";
  EXPECT_EQ(status("backend:native", std::nullopt), Status::Fail);
  EXPECT_EQ(status("expandable_segments:True", std::nullopt), Status::Fail);
  EXPECT_EQ(status("max_split_size_mb:64", std::nullopt), Status::Warn);
  const Check c = judge_allocator(AllocatorFacts{"backend:native", std::nullopt});
  EXPECT_TRUE(has(c.detail, "picks the native allocator")) << c.detail;
  EXPECT_TRUE(has(c.fix, "backend:cudaMallocAsync in PYTORCH_CUDA_ALLOC_CONF")) << c.fix;
}

TEST(DoctorPool, ThePoolMustFitInSharedMemoryAndMemory) {
  PoolFacts f;
  f.shm_dir = "/dev/shm";
  f.pool_bytes = 4 * GiB;
  f.shm_free = 8 * GiB, f.shm_total = 8 * GiB;
  f.mem_available = 100 * GiB;
  EXPECT_EQ(judge_pool(f).status, Status::Ok);
  f.pool_bytes = 32 * GiB, f.pool_set = true;
  Check c = judge_pool(f);
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, "32.0 GiB (OFFLOAD_HOST_POOL) does not fit: /dev/shm has 8.0 GiB free")) << c.detail;
  EXPECT_TRUE(has(c.fix, "--shm-size")) << c.fix;
  f.shm_free = 64 * GiB;
  f.mem_available = 16 * GiB;
  EXPECT_TRUE(has(judge_pool(f).detail, "more than the memory available")) << judge_pool(f).detail;
  f.daemon = "off";
  EXPECT_EQ(judge_pool(f).status, Status::Ok) << "a private pool takes no shared memory";
}

TEST(DoctorPool, ARunningDaemonsPoolIsThereAlready) {
  PoolFacts f;
  f.shm_dir = "/dev/shm";
  f.segment = "offload-pool-1000-abcd";
  f.segment_bytes = 8 * GiB;
  f.pool_bytes = 32 * GiB, f.pool_set = true;
  f.shm_free = 1 * GiB;  // the pool's own pages are not free
  Check c = judge_pool(f);
  EXPECT_EQ(c.status, Status::Warn);
  EXPECT_TRUE(has(c.detail, "smaller than OFFLOAD_HOST_POOL asks")) << c.detail;
  EXPECT_TRUE(has(c.fix, "offloadctl stop")) << c.fix;
  f.pool_set = false, f.pool_bytes = 4 * GiB;
  EXPECT_EQ(judge_pool(f).status, Status::Ok);
}

TEST_F(DoctorProbeTest, ThePoolProbeReadsTheSettingsTheSegmentAndTheDirectory) {
  const std::string xdg = root_ + "/xdg";
  FakeEnv env(Vars{{"XDG_RUNTIME_DIR", xdg}, {"OFFLOAD_HOST_POOL", "8GiB"}});
  const std::string segment = paths_from_env(env.get()).segment;
  touch("shm/" + segment, 12345);
  ProbeOptions o = env.options();
  o.shm_dir = root_ + "/shm";
  PoolFacts f = probe_pool(o);
  EXPECT_EQ(f.pool_bytes, 8 * GiB);
  EXPECT_TRUE(f.pool_set);
  EXPECT_TRUE(f.shm_error.empty()) << f.shm_error;
  EXPECT_GT(f.shm_total, 0u);
  ASSERT_TRUE(f.segment_bytes.has_value());
  EXPECT_EQ(*f.segment_bytes, 12345u);
  EXPECT_FALSE(std::filesystem::exists(xdg)) << "doctor makes no directory";

  o.shm_dir = root_ + "/no-shm-here";
  f = probe_pool(o);
  EXPECT_FALSE(f.shm_error.empty());
  EXPECT_FALSE(f.segment_bytes.has_value());
  EXPECT_EQ(judge_pool(f).status, Status::Fail);
}

TEST(DoctorGlibc, VersionsCompareByNumber) {
  EXPECT_LT(compare_versions("2.9", "2.34"), 0);
  EXPECT_GT(compare_versions("2.35", "2.34"), 0);
  EXPECT_EQ(compare_versions("2.34", "2.34"), 0);
  EXPECT_EQ(compare_versions("2.34", "2.34.0"), 0);
  EXPECT_GT(compare_versions("2.2.5", ""), 0);
  GlibcFacts f{"2.31", "2.35", "/opt/lib/liboffload.so", ""};
  Check c = judge_glibc(f);
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, "glibc 2.31; /opt/lib/liboffload.so needs 2.35 or later")) << c.detail;
  f.running = "2.39";
  EXPECT_EQ(judge_glibc(f).status, Status::Ok);
}

TEST_F(DoctorProbeTest, TheGlibcAnElfFileNeedsIsReadFromIt) {
  std::string why;
  const std::string mine = glibc_needed("/proc/self/exe", &why);
  ASSERT_FALSE(mine.empty()) << why;
  EXPECT_EQ(mine.rfind("2.", 0), 0u) << mine;
  EXPECT_LE(compare_versions(mine, gnu_get_libc_version()), 0) << "this test runs, so its glibc is new enough";
  EXPECT_GE(compare_versions(mine, "2.2.5"), 0);
  const std::string text = touch("not-elf.so");
  std::ofstream(text) << "not an ELF file at all, but long enough to hold a header's worth of bytes......";
  EXPECT_EQ(glibc_needed(text, &why), "");
  EXPECT_TRUE(has(why, "not a 64-bit ELF file")) << why;
  EXPECT_EQ(glibc_needed(root_ + "/absent", &why), "");
  EXPECT_TRUE(has(why, "cannot open")) << why;
}

TEST_F(DoctorProbeTest, LiboffloadIsLookedForBesideOffloadctlAndInLD_PRELOAD) {
  const std::string lib = touch("prefix/lib64/liboffload.so");
  FakeEnv env(Vars{{"LD_PRELOAD", "/usr/lib/libjemalloc.so:" + root_ + "/gone/liboffload.so"}});
  ProbeOptions o = env.options();
  o.self_exe = root_ + "/prefix/bin/offloadctl";
  o.libdir = "lib64";
  ShimFacts f = probe_shim(o);
  EXPECT_EQ(f.found, lib);
  EXPECT_EQ(f.looked.front(), root_ + "/prefix/bin/liboffload.so");
  EXPECT_EQ(judge_shim(f).status, Status::Ok);
  ASSERT_EQ(f.preloaded, 1);
  EXPECT_EQ(f.preloaded_exists, false);
  Check c = judge_preload(f);
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.fix, lib)) << c.fix;

  FakeEnv first(Vars{{"LD_PRELOAD", lib + " /usr/lib/libjemalloc.so"}});
  o.get = first.get();
  EXPECT_EQ(judge_preload(probe_shim(o)).status, Status::Ok);
  FakeEnv second(Vars{{"LD_PRELOAD", "/usr/lib/libjemalloc.so " + lib}});
  o.get = second.get();
  EXPECT_EQ(judge_preload(probe_shim(o)).status, Status::Warn) << "another preload's definitions come first";
  FakeEnv none(Vars{});
  o.get = none.get();
  c = judge_preload(probe_shim(o));
  EXPECT_EQ(c.status, Status::Warn);
  EXPECT_TRUE(has(c.fix, "LD_PRELOAD=" + lib)) << c.fix;

  FakeEnv named(Vars{{"OFFLOAD_LIB", root_ + "/elsewhere/liboffload.so"}});
  o.get = named.get();
  f = probe_shim(o);
  EXPECT_EQ(f.looked, std::vector<std::string>{root_ + "/elsewhere/liboffload.so"});
  EXPECT_EQ(judge_shim(f).status, Status::Fail);
  o.self_exe = root_ + "/bare/bin/offloadctl";
  o.get = none.get();
  c = judge_shim(probe_shim(o));
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, root_ + "/bare/lib/liboffload.so")) << c.detail;
}

TEST(DoctorSettings, BadAndUnknownVariablesAreSaid) {
  FakeEnv typo(Vars{{"OFFLOAD_BUDGET", "40GiB"}, {"OFFLOAD_TRACE", "/tmp/t"}});
  SettingsFacts f = probe_settings(typo.options());
  EXPECT_EQ(f.set, 2u);
  Check c = judge_settings(f);
  EXPECT_EQ(c.status, Status::Warn);
  EXPECT_TRUE(has(c.detail, "OFFLOAD_BUDGET (did you mean OFFLOAD_DEVICE_BUDGET?)")) << c.detail;
  FakeEnv bad(Vars{{"OFFLOAD_HOST_POOL", "1k"}});
  c = judge_settings(probe_settings(bad.options()));
  EXPECT_EQ(c.status, Status::Fail);
  EXPECT_TRUE(has(c.detail, "OFFLOAD_HOST_POOL='1k' is not valid")) << c.detail;
  FakeEnv fine(Vars{{"OFFLOAD_DEVICE_BUDGET", "75%"}});
  EXPECT_EQ(judge_settings(probe_settings(fine.options())).status, Status::Ok);
  FakeEnv off(Vars{{"OFFLOAD_DISABLE", "1"}});
  EXPECT_EQ(judge_settings(probe_settings(off.options())).status, Status::Warn);
}

TEST(DoctorReport, OneLinePerCheckAndJsonWithTheVerdict) {
  const std::vector<Check> checks = {{"driver", Status::Fail, "no GPU", "add one"},
                                     {"glibc", Status::Ok, "glibc 2.36", ""},
                                     {"preload", Status::Warn, "not preloaded \"x\"", "preload it"}};
  EXPECT_TRUE(any_failed(checks));
  const std::string text = render_text(checks);
  EXPECT_TRUE(has(text, "fail  driver     no GPU (fix: add one)\n")) << text;
  EXPECT_TRUE(has(text, "ok    glibc      glibc 2.36\n")) << text;
  EXPECT_TRUE(has(text, "doctor: 3 checks, 1 failed, 1 warning\n")) << text;
  testing::Json j;
  std::string err;
  ASSERT_TRUE(testing::parse_json(render_json(checks), &j, &err)) << err;
  EXPECT_FALSE(j["ok"].b);
  ASSERT_EQ(j["checks"].items.size(), 3u);
  EXPECT_EQ(j["checks"].items[2]["status"].text, "warn");
  EXPECT_EQ(j["checks"].items[2]["detail"].text, "not preloaded \"x\"");
  EXPECT_EQ(j["checks"].items[1]["fix"].text, "");
  testing::Json one;
  ASSERT_TRUE(testing::parse_json(render_json({checks[1]}), &one, &err)) << err;
  EXPECT_TRUE(one["ok"].b);
}

}  // namespace
}  // namespace offload::doctor
