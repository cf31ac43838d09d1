// offloadctl doctor's verdicts: facts in (doctor.h), a check each out. No I/O here.
#include "offloadctl/doctor.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/cupti_lookup.h"
#include "common/json_writer.h"

namespace offload::doctor {
namespace {

// CUresult values the driver check tells apart (cuda.h).
constexpr int kCudaErrorStubLibrary = 34, kCudaErrorInsufficientDriver = 35, kCudaErrorNoDevice = 100;

std::string gib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f GiB", static_cast<double>(b) / static_cast<double>(1ull << 30));
  return s;
}

std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

Check make(const char* name, Status st, std::string detail, std::string fix = {}) {
  return Check{name, st, std::move(detail), std::move(fix)};
}

// PyTorch's allocator setting: "key:value" options separated by commas or spaces.
std::string conf_value(const std::string& conf, const std::string& key) {
  std::string token;
  std::istringstream in(conf);
  for (char c; in.get(c);) {
    const bool sep = c == ',' || std::isspace(static_cast<unsigned char>(c));
    if (!sep) token += c;
    if (sep || in.peek() == EOF) {
      const size_t colon = token.find(':');
      if (colon != std::string::npos && token.substr(0, colon) == key) return token.substr(colon + 1);
      token.clear();
    }
  }
  return {};
}

bool async_backend(const std::optional<std::string>& conf) {
  return conf && conf_value(*conf, "backend") == "cudaMallocAsync";
}

}  // namespace

const char* status_name(Status s) {
  switch (s) {
    case Status::Ok:
      return "ok";
    case Status::Warn:
      return "warn";
    case Status::Fail:
      return "fail";
  }
  return "?";
}

int compare_versions(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    const unsigned long x = i < a.size() ? std::strtoul(a.c_str() + i, nullptr, 10) : 0;
    const unsigned long y = j < b.size() ? std::strtoul(b.c_str() + j, nullptr, 10) : 0;
    if (x != y) return x < y ? -1 : 1;
    i = a.find('.', i), j = b.find('.', j);
    i = i == std::string::npos ? a.size() : i + 1;
    j = j == std::string::npos ? b.size() : j + 1;
  }
  return a.empty() == b.empty() ? 0 : a.empty() ? -1 : 1;
}

Check judge_driver(const DriverFacts& f) {
  const char* kName = "driver";
  if (!f.load_error.empty())
    return make(kName, Status::Fail, "no CUDA driver: libcuda.so.1 does not load (" + f.load_error + ")",
                "install the NVIDIA driver; in a container, start it with the GPUs exposed (--gpus all)");
  if (f.init_result == kCudaErrorStubLibrary)
    return make(kName, Status::Fail, "libcuda.so.1 is the toolkit's stub (cuInit: CUDA_ERROR_STUB_LIBRARY): no driver",
                "take the toolkit's lib64/stubs out of LD_LIBRARY_PATH, and install the NVIDIA driver");
  if (f.init_result == kCudaErrorNoDevice)
    return make(kName, Status::Fail, "no GPU: cuInit answers CUDA_ERROR_NO_DEVICE",
                "run on a machine with an NVIDIA GPU; check CUDA_VISIBLE_DEVICES and, in a container, --gpus");
  if (f.init_result == kCudaErrorInsufficientDriver)
    return make(kName, Status::Fail, "the driver is too old for this libcuda (cuInit: CUDA_ERROR_INSUFFICIENT_DRIVER)",
                "update the NVIDIA driver");
  if (f.init_result != 0) {
    const std::string what = f.init_result < 0 ? std::string("libcuda.so.1 has no cuInit")
                                               : "cuInit failed with " +
                                                     (f.init_error.empty() ? "error" : f.init_error) + " (" +
                                                     std::to_string(f.init_result) + ")";
    return make(kName, Status::Fail, what, "check the driver with nvidia-smi");
  }
  const std::string version = f.version ? "driver for CUDA " + cuda_version_text(f.version) : "driver of unknown version";
  if (!f.has_param_info)
    return make(kName, Status::Warn,
                version + ", cuInit ok; it lacks cuFuncGetParamInfo, so the shim cannot read which data a kernel uses",
                "update the NVIDIA driver to one for CUDA 12.4 or later");
  return make(kName, Status::Ok, version + ", cuInit ok");
}

Check judge_cupti(const CuptiFacts& f, const DriverFacts& driver) {
  const char* kName = "cupti";
  if (f.telemetry_off) return make(kName, Status::Ok, "not used: OFFLOAD_TELEMETRY=off (steps timed with CUDA events)");
  const std::string wanted = "libcupti.so." + std::to_string(f.major);
  const std::string runtime = f.cudart.empty() ? "without a CUDA runtime to go by (" + wanted + " is the default)"
                                               : "for " + f.cudart + " (" + f.cudart_source + ")";
  const std::string loss = "without it, steps have no GPU times and the built-in plan is used";
  if (f.loaded.empty()) {
    const std::string fix = "install CUPTI for CUDA " + std::to_string(f.major) +
                            " (the toolkit's extras/CUPTI, or the nvidia-cuda-cupti wheel of PyTorch's CUDA), "
                            "or set OFFLOAD_CUPTI_LIB to it";
    if (!f.present.empty())
      return make(kName, Status::Warn,
                  f.present + ", looked for " + runtime + ", does not load (" + f.present_error + "); " + loss, fix);
    const size_t shown = std::min<size_t>(f.candidates.size(), 4);
    std::string looked = joined({f.candidates.begin(), f.candidates.begin() + static_cast<long>(shown)}, ", ");
    if (f.candidates.size() > shown) looked += " and " + std::to_string(f.candidates.size() - shown) + " more";
    return make(kName, Status::Warn, "no libcupti found " + runtime + "; looked at " + looked + "; " + loss, fix);
  }
  std::string detail = (f.loaded_file.empty() ? f.loaded : f.loaded_file) + " " + runtime;
  if (f.api_version) detail += ", CUPTI API version " + std::to_string(f.api_version);
  const int cupti_major = so_major(f.loaded_file.empty() ? f.loaded : f.loaded_file);
  if (cupti_major && driver.version && cupti_major > driver.version / 1000)
    return make(kName, Status::Warn,
                detail + "; the driver is for CUDA " + cuda_version_text(driver.version) + ", older than this CUPTI",
                "update the NVIDIA driver, or use the CUPTI of CUDA " + std::to_string(driver.version / 1000) +
                    " (OFFLOAD_CUPTI_LIB)");
  const int runtime_major = so_major(f.cudart);
  if (cupti_major && runtime_major && cupti_major != runtime_major)
    return make(kName, Status::Warn,
                detail + "; a CUPTI of CUDA " + std::to_string(cupti_major) + " in a CUDA " +
                    std::to_string(runtime_major) + " process would be a second CUPTI beside torch.profiler's",
                "install CUPTI for CUDA " + std::to_string(runtime_major) +
                    " (the nvidia-cuda-cupti wheel of PyTorch's CUDA), or set OFFLOAD_CUPTI_LIB to it");
  if (!f.hint.empty() && f.loaded != f.hint)
    return make(kName, Status::Warn, "OFFLOAD_CUPTI_LIB=" + f.hint + " does not load; the search found " + detail,
                "correct or unset OFFLOAD_CUPTI_LIB");
  return make(kName, Status::Ok, detail);
}

Check judge_allocator(const AllocatorFacts& f) {
  const char* kName = "allocator";
  const std::string set = "export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, or run under offload-run (it sets it)";
  // PyTorch 2.9 and later read PYTORCH_ALLOC_CONF when it is set and PYTORCH_CUDA_ALLOC_CONF
  // otherwise; earlier versions only PYTORCH_CUDA_ALLOC_CONF.
  const std::optional<std::string>& read = f.conf ? f.conf : f.cuda_conf;
  const char* read_name = f.conf ? "PYTORCH_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
  for (const auto& [conf, name] : {std::pair{f.conf, "PYTORCH_ALLOC_CONF"}, {f.cuda_conf, "PYTORCH_CUDA_ALLOC_CONF"}}) {
    if (!conf) continue;
    const std::string backend = conf_value(*conf, "backend");
    if (!backend.empty() && backend != "cudaMallocAsync")
      return make(kName, Status::Fail, std::string(name) + "='" + *conf + "' picks the " + backend +
                                           " allocator: liboffload sees tensors only through cudaMallocAsync",
                  std::string("set backend:cudaMallocAsync in ") + name);
    const std::string expandable = conf_value(*conf, "expandable_segments");
    if (backend.empty() && (expandable == "True" || expandable == "true"))
      return make(kName, Status::Fail, std::string(name) + "='" + *conf +
                                           "': expandable segments belong to PyTorch's native allocator",
                  std::string("use backend:cudaMallocAsync in ") + name + " instead");
  }
  if (f.conf && !async_backend(f.conf) && async_backend(f.cuda_conf))
    return make(kName, Status::Fail,
                "PYTORCH_ALLOC_CONF is set without backend:cudaMallocAsync: PyTorch 2.9 and later read it and "
                "ignore PYTORCH_CUDA_ALLOC_CONF's",
                "add backend:cudaMallocAsync to PYTORCH_ALLOC_CONF");
  if (async_backend(f.conf) && !async_backend(f.cuda_conf))
    return make(kName, Status::Warn,
                "backend:cudaMallocAsync in PYTORCH_ALLOC_CONF only: PyTorch before 2.9 reads PYTORCH_CUDA_ALLOC_CONF",
                "with PyTorch before 2.9, set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync too");
  if (!async_backend(read)) {
    const std::string what = read ? std::string(read_name) + "='" + *read + "' names no backend" : "no allocator setting";
    return make(kName, Status::Warn,
                what + ": PyTorch's native allocator hides tensors from liboffload (unless the script serves PyTorch "
                       "through liboffload's CUDAPluggableAllocator)",
                set);
  }
  return make(kName, Status::Ok, std::string("backend:cudaMallocAsync (") + read_name + ")");
}

Check judge_pool(const PoolFacts& f) {
  const char* kName = "shm";
  const std::string size = gib(f.pool_bytes) + (f.pool_set ? " (OFFLOAD_HOST_POOL)" : " (the default; OFFLOAD_HOST_POOL)");
  if (f.daemon == "off")
    return make(kName, Status::Ok, "not used: OFFLOAD_DAEMON=off keeps a private pool of " + size + " in the process");
  if (!f.shm_error.empty())
    return make(kName, Status::Fail, "cannot read " + f.shm_dir + ": " + f.shm_error,
                "mount a tmpfs at " + f.shm_dir + " (docker: --shm-size), or set OFFLOAD_DAEMON=off");
  if (f.segment_bytes) {
    const std::string have = "offloadd's pool /" + f.segment + " exists (" + gib(*f.segment_bytes) + ")";
    if (f.pool_set && *f.segment_bytes < f.pool_bytes)
      return make(kName, Status::Warn, have + ", smaller than OFFLOAD_HOST_POOL asks (" + gib(f.pool_bytes) + ")",
                  "offloadctl stop while no process uses it; the next process starts a daemon with OFFLOAD_HOST_POOL");
    return make(kName, Status::Ok, have);
  }
  const std::string room = f.shm_dir + " has " + gib(f.shm_free) + " free of " + gib(f.shm_total);
  // As offloadd refuses a pool (daemon/offloadd/resources.cpp): tmpfs hands out pages as they are
  // touched, so a pool past the room dies of SIGBUS or the OOM killer later.
  if (f.pool_bytes > f.shm_free)
    return make(kName, Status::Fail, "a host pool of " + size + " does not fit: " + room,
                "set a smaller OFFLOAD_HOST_POOL, or make " + f.shm_dir +
                    " larger (docker run --shm-size; mount -o remount,size=... " + f.shm_dir + ")");
  if (f.mem_available && f.pool_bytes > *f.mem_available)
    return make(kName, Status::Fail,
                "a host pool of " + size + " is more than the memory available (" + gib(*f.mem_available) + ")",
                "set a smaller OFFLOAD_HOST_POOL");
  return make(kName, Status::Ok, "a host pool of " + size + " fits: " + room);
}

Check judge_glibc(const GlibcFacts& f) {
  const char* kName = "glibc";
  if (f.needed.empty())
    return make(kName, Status::Warn, "glibc " + f.running + "; what " + f.needed_by + " needs is unknown (" + f.error + ")");
  const std::string detail = "glibc " + f.running + "; " + f.needed_by + " needs " + f.needed + " or later";
  if (compare_versions(f.running, f.needed) < 0)
    return make(kName, Status::Fail, detail, "run on a newer distribution, or build liboffload on this one");
  return make(kName, Status::Ok, detail);
}

Check judge_shim(const ShimFacts& f) {
  const char* kName = "liboffload";
  if (!f.offload_lib.empty() && f.found != f.offload_lib)
    return make(kName, Status::Fail, "OFFLOAD_LIB=" + f.offload_lib + " is not a file", "correct or unset OFFLOAD_LIB");
  if (f.found.empty())
    return make(kName, Status::Fail, "liboffload.so not found; looked at " + joined(f.looked, ", "),
                "install liboffload beside offloadctl, or set OFFLOAD_LIB to the library");
  return make(kName, Status::Ok, f.found);
}

Check judge_preload(const ShimFacts& f) {
  const char* kName = "preload";
  if (f.preloaded < 0)
    return make(kName, Status::Warn, "LD_PRELOAD does not name liboffload.so: processes started from here run without it",
                "run the training command under offload-run, or with LD_PRELOAD=" +
                    (f.found.empty() ? std::string("/path/to/liboffload.so") : f.found));
  const std::string& e = f.preload[static_cast<size_t>(f.preloaded)];
  if (f.preloaded_exists == false)
    return make(kName, Status::Fail, "LD_PRELOAD names " + e + ", which is not a file",
                "correct LD_PRELOAD" + (f.found.empty() ? std::string() : " (liboffload.so is at " + f.found + ")"));
  // The first preloaded library's definitions win: a hook after another interposer may never run.
  if (f.preloaded > 0)
    return make(kName, Status::Warn,
                "LD_PRELOAD has " + e + " after " +
                    joined({f.preload.begin(), f.preload.begin() + f.preloaded}, ", ") +
                    ", whose definitions of the same names come first",
                "put liboffload.so first in LD_PRELOAD (offload-run does)");
  return make(kName, Status::Ok,
              "LD_PRELOAD has " + e + (f.preloaded_exists ? "" : " (a bare name: the loader's search path finds it)"));
}

Check judge_settings(const SettingsFacts& f) {
  const char* kName = "settings";
  if (!f.errors.empty())
    return make(kName, Status::Fail, "bad OFFLOAD_* settings, so liboffload would only forward calls: " + joined(f.errors, "; "),
                "correct them (README, Configuration)");
  if (!f.unknown.empty())
    return make(kName, Status::Warn, "OFFLOAD_* variables liboffload does not read: " + joined(f.unknown, "; "),
                "correct or unset them");
  if (f.disabled)
    return make(kName, Status::Warn, "OFFLOAD_DISABLE=1: liboffload forwards every call and tracks nothing",
                "unset OFFLOAD_DISABLE");
  return make(kName, Status::Ok,
              f.set ? std::to_string(f.set) + " OFFLOAD_* variables set, all valid" : "no OFFLOAD_* variables set");
}

std::vector<Check> judge(const Facts& f) {
  return {judge_driver(f.driver), judge_cupti(f.cupti, f.driver), judge_allocator(f.allocator), judge_pool(f.pool),
          judge_glibc(f.glibc),   judge_shim(f.shim),             judge_preload(f.shim),        judge_settings(f.settings)};
}

bool any_failed(const std::vector<Check>& checks) {
  return std::any_of(checks.begin(), checks.end(), [](const Check& c) { return c.status == Status::Fail; });
}

std::string render_text(const std::vector<Check>& checks) {
  std::string out;
  size_t warn = 0, fail = 0;
  for (const Check& c : checks) {
    char head[32];
    std::snprintf(head, sizeof head, "%-4s  %-10s ", status_name(c.status), c.name.c_str());
    out += head + c.detail + (c.fix.empty() ? "" : " (fix: " + c.fix + ")") + "\n";
    warn += c.status == Status::Warn;
    fail += c.status == Status::Fail;
  }
  out += "doctor: " + std::to_string(checks.size()) + " checks, " + std::to_string(fail) + " failed, " +
         std::to_string(warn) + (warn == 1 ? " warning\n" : " warnings\n");
  return out;
}

std::string render_json(const std::vector<Check>& checks) {
  JsonWriter w;
  w.object().field("ok", !any_failed(checks)).array("checks");
  for (const Check& c : checks)
    w.object().field("name", c.name).field("status", status_name(c.status)).field("detail", c.detail).field("fix", c.fix).end();
  w.end().end();
  return w.str();
}

}  // namespace offload::doctor
