// offloadctl doctor: whether this machine and this environment can run a training process under
// liboffload, as one verdict per check (ok, warn, fail), each with what to do about it.
//
// Probing (doctor_probe.cpp: the driver, libcupti, /dev/shm, ELF files, the environment) is kept
// apart from judging (doctor.cpp: facts in, verdicts out), so that tests judge made-up machines
// and probe made-up directories and environments. Facts hold what was seen, never a verdict.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace offload::doctor {

enum class Status { Ok, Warn, Fail };
const char* status_name(Status s);  // "ok", "warn", "fail"

struct Check {
  std::string name;
  Status status = Status::Ok;
  std::string detail;  // what was found
  std::string fix;     // what to do about it ("" when nothing)
};

// libcuda.so.1 and what it answers.
struct DriverFacts {
  std::string load_error;       // dlopen's message; "" when it loaded
  int init_result = -1;         // cuInit(0)'s CUresult; -1: not called
  std::string init_error;       // cuGetErrorName of it ("" if unknown)
  int version = 0;              // cuDriverGetVersion: 13000 for CUDA 13.0; 0 if unknown
  bool has_param_info = false;  // cuFuncGetParamInfo (drivers for CUDA 12.4 on): the shim reads
                                // kernels' parameters with it
};

// libcupti, looked for as the shim looks (common/cupti_lookup.h).
struct CuptiFacts {
  bool telemetry_off = false;  // OFFLOAD_TELEMETRY=off: CUPTI is not used
  std::string hint;            // OFFLOAD_CUPTI_LIB
  std::string cudart;          // the runtime looked for ("" none)
  std::string cudart_source;   // how it was chosen: "--cudart", "the loader's search"
  int major = 0;               // the CUPTI major tried first
  std::vector<std::string> candidates;
  std::string loaded;          // the first candidate that opened ("" none)
  std::string loaded_file;     // the file it is (a bare soname resolved by the loader)
  uint32_t api_version = 0;    // cuptiGetVersion of the loaded one (0 unknown)
  std::string present;         // the first candidate that is an existing file
  std::string present_error;   // why `present` did not open, when nothing loaded
};

// PyTorch's allocator settings (nullopt: unset).
struct AllocatorFacts {
  std::optional<std::string> cuda_conf;  // PYTORCH_CUDA_ALLOC_CONF
  std::optional<std::string> conf;       // PYTORCH_ALLOC_CONF: PyTorch 2.9 on reads it in its place
};

// The host pool a started offloadd would make, against the shared-memory file system.
struct PoolFacts {
  std::string daemon = "auto";    // OFFLOAD_DAEMON
  uint64_t pool_bytes = 0;        // OFFLOAD_HOST_POOL, or its default
  bool pool_set = false;
  std::string shm_dir;
  std::string shm_error;          // statvfs's message; "" when it answered
  uint64_t shm_free = 0, shm_total = 0;
  std::optional<uint64_t> mem_available;  // /proc/meminfo MemAvailable
  std::string segment;            // the user's pool segment name
  std::optional<uint64_t> segment_bytes;  // its size when a daemon made it already
};

struct GlibcFacts {
  std::string running;    // gnu_get_libc_version()
  std::string needed;     // the highest glibc version (2.35) `needed_by` references ("" unknown)
  std::string needed_by;  // liboffload.so when found, else offloadctl
  std::string error;      // why `needed` is unknown
};

struct ShimFacts {
  std::string offload_lib;          // OFFLOAD_LIB (the launcher's)
  std::string found;                // liboffload.so found ("" none)
  std::vector<std::string> looked;  // where it was looked for, in order
  std::vector<std::string> preload;  // LD_PRELOAD's entries, in order
  int preloaded = -1;                // liboffload.so's place among them; -1: absent
  std::optional<bool> preloaded_exists;  // that entry is a file; nullopt for a bare name (the
                                         // loader's search finds it, or not)
};

struct SettingsFacts {
  std::vector<std::string> errors;   // read_settings' messages
  std::vector<std::string> unknown;  // unknown_settings'
  size_t set = 0;                    // OFFLOAD_* variables set
  bool disabled = false;             // OFFLOAD_DISABLE=1
};

struct Facts {
  DriverFacts driver;
  CuptiFacts cupti;
  AllocatorFacts allocator;
  PoolFacts pool;
  GlibcFacts glibc;
  ShimFacts shim;
  SettingsFacts settings;
};

// --- judging: pure ---------------------------------------------------------------------------
Check judge_driver(const DriverFacts& f);
Check judge_cupti(const CuptiFacts& f, const DriverFacts& driver);
Check judge_allocator(const AllocatorFacts& f);
Check judge_pool(const PoolFacts& f);
Check judge_glibc(const GlibcFacts& f);
Check judge_shim(const ShimFacts& f);
Check judge_preload(const ShimFacts& f);
Check judge_settings(const SettingsFacts& f);
std::vector<Check> judge(const Facts& f);  // every check, in the order above

bool any_failed(const std::vector<Check>& checks);
std::string render_text(const std::vector<Check>& checks);  // a line per check, then a summary
std::string render_json(const std::vector<Check>& checks);  // {"ok":..,"checks":[{name,status,detail,fix}]}

// "2.35" against "2.34": <0, 0, >0 as a is older, the same, newer (numeric parts; "" is oldest).
int compare_versions(const std::string& a, const std::string& b);

// --- probing: the machine --------------------------------------------------------------------
using Getenv = std::function<const char*(const char*)>;

struct ProbeOptions {
  Getenv get;                             // getenv
  const char* const* env = nullptr;       // environ: the OFFLOAD_* variables set
  std::string shm_dir = "/dev/shm";
  std::string self_exe;                   // offloadctl's own path ("": /proc/self/exe)
  std::string libdir = "lib";             // the install's library directory, beside bin/
  std::string cudart;                     // --cudart: the runtime the training process loads
};

DriverFacts probe_driver();
CuptiFacts probe_cupti(const ProbeOptions& o);
AllocatorFacts probe_allocator(const Getenv& get);
PoolFacts probe_pool(const ProbeOptions& o);
ShimFacts probe_shim(const ProbeOptions& o);
GlibcFacts probe_glibc(const std::string& shim_found, const std::string& self_exe);
SettingsFacts probe_settings(const ProbeOptions& o);
Facts probe(const ProbeOptions& o);

// The command: probes, judges, prints (text or --json); 0 when no check fails, else 1.
int run(const ProbeOptions& o, bool json);

// The highest glibc version ("2.35" of GLIBC_2.35) the 64-bit ELF file at `path` references
// in its .gnu.version_r; "" with *why when the file cannot be read as one or references none.
std::string glibc_needed(const std::string& path, std::string* why);

}  // namespace offload::doctor
