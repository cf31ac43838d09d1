// offloadctl doctor's probes: what the machine and the environment hold, as facts (doctor.h).
// Libraries are opened RTLD_LOCAL and only asked for versions; nothing here starts a daemon,
// makes a directory or loads liboffload.so itself (its constructor would run in offloadctl).
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/cupti_lookup.h"
#include "common/env.h"
#include "common/ipc.h"
#include "offloadctl/doctor.h"

namespace offload::doctor {
namespace {

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

// The file a handle from dlopen was loaded from ("" if the loader does not say).
std::string loaded_file(void* handle) {
  link_map* lm = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name) return lm->l_name;
  return {};
}

bool is_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Settings settings_of(const Getenv& get) {
  std::vector<std::string> ignored;  // judged by the settings check
  return read_settings(get, &ignored);
}

std::string self_path(const ProbeOptions& o) {
  if (!o.self_exe.empty()) return o.self_exe;
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// A NUL-ended string at `off` inside [lo, hi) of the mapped file; nullptr if it runs past.
const char* string_at(const char* base, uint64_t lo, uint64_t hi, uint64_t off) {
  if (off >= hi - lo) return nullptr;
  const char* s = base + lo + off;
  return std::memchr(s, 0, hi - lo - off) ? s : nullptr;
}

// The highest GLIBC_ version in the mapped ELF image [p, p + n); "" with *why.
std::string glibc_in_image(const char* p, uint64_t n, std::string* why) {
  Elf64_Ehdr eh;
  if (n < sizeof eh || std::memcmp(p, ELFMAG, SELFMAG) != 0 || p[EI_CLASS] != ELFCLASS64) {
    *why = "not a 64-bit ELF file";
    return {};
  }
  std::memcpy(&eh, p, sizeof eh);
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > n || eh.e_shnum > (n - eh.e_shoff) / sizeof(Elf64_Shdr)) {
    *why = "its section headers lie outside the file";
    return {};
  }
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, p + eh.e_shoff + i * sizeof sh, sizeof sh);
    return sh;
  };
  std::string best;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr need = section(i);
    if (need.sh_type != SHT_GNU_verneed || need.sh_link >= eh.e_shnum) continue;
    const Elf64_Shdr strtab = section(need.sh_link);
    if (strtab.sh_offset > n || strtab.sh_size > n - strtab.sh_offset || need.sh_offset > n ||
        need.sh_size > n - need.sh_offset)
      continue;
    const uint64_t str_lo = strtab.sh_offset, str_hi = strtab.sh_offset + strtab.sh_size;
    const uint64_t end = need.sh_offset + need.sh_size;
    uint64_t off = need.sh_offset;
    for (size_t k = 0; k < need.sh_info && off + sizeof(Elf64_Verneed) <= end; ++k) {
      Elf64_Verneed vn;
      std::memcpy(&vn, p + off, sizeof vn);
      uint64_t aux = off + vn.vn_aux;
      for (size_t j = 0; j < vn.vn_cnt && aux + sizeof(Elf64_Vernaux) <= end; ++j) {
        Elf64_Vernaux va;
        std::memcpy(&va, p + aux, sizeof va);
        const char* name = string_at(p, str_lo, str_hi, va.vna_name);
        if (name && std::strncmp(name, "GLIBC_", 6) == 0 && name[6] >= '0' && name[6] <= '9' &&
            compare_versions(name + 6, best) > 0)
          best = name + 6;
        if (!va.vna_next) break;
        aux += va.vna_next;
      }
      if (!vn.vn_next) break;
      off += vn.vn_next;
    }
  }
  if (best.empty()) *why = "it references no glibc version";
  return best;
}

}  // namespace

std::string glibc_needed(const std::string& path, std::string* why) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open " + path + ": " + strerror(errno);
    return {};
  }
  struct stat st;
  void* m = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0)
    m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    *why = "cannot read " + path;
    return {};
  }
  std::string v = glibc_in_image(static_cast<const char*>(m), static_cast<uint64_t>(st.st_size), why);
  munmap(m, static_cast<size_t>(st.st_size));
  return v;
}

DriverFacts probe_driver() {
  DriverFacts f;
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    f.load_error = dl_error();
    return f;
  }
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit"));
  auto version = reinterpret_cast<int (*)(int*)>(dlsym(h, "cuDriverGetVersion"));
  auto error_name = reinterpret_cast<int (*)(int, const char**)>(dlsym(h, "cuGetErrorName"));
  if (version && version(&f.version) != 0) f.version = 0;
  if (init) {
    f.init_result = init(0);
    const char* name = nullptr;
    if (f.init_result != 0 && error_name && error_name(f.init_result, &name) == 0 && name) f.init_error = name;
  }
  f.has_param_info = dlsym(h, "cuFuncGetParamInfo") != nullptr;
  return f;
}

CuptiFacts probe_cupti(const ProbeOptions& o) {
  CuptiFacts f;
  const Settings st = settings_of(o.get);
  f.telemetry_off = !st.telemetry;
  f.hint = st.cupti_lib;
  if (!o.cudart.empty()) {
    f.cudart = o.cudart, f.cudart_source = "--cudart";
  } else {
    // Without --cudart: the runtime the loader's search finds, which may not be PyTorch's own.
    for (int m : kCuptiMajors) {
      const std::string name = "libcudart.so." + std::to_string(m);
      if (void* h = dlopen(name.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
        f.cudart = loaded_file(h);
        if (f.cudart.empty()) f.cudart = name;
        f.cudart_source = "found by the loader's search; --cudart names the one PyTorch loads";
        break;
      }
    }
  }
  const char* home = o.get("CUDA_HOME");
  const CuptiSearch search{f.hint, f.cudart, home ? home : ""};
  f.major = preferred_cupti_major(search);
  f.candidates = cupti_candidates(search);
  if (f.telemetry_off) return f;
  for (const std::string& c : f.candidates) {
    if (void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      f.loaded = c;
      f.loaded_file = loaded_file(h);
      if (auto get_version = reinterpret_cast<int (*)(uint32_t*)>(dlsym(h, "cuptiGetVersion")))
        if (get_version(&f.api_version) != 0) f.api_version = 0;
      break;
    }
  }
  f.present = first_present(f.candidates);
  if (f.loaded.empty() && !f.present.empty()) {
    if (void* h = dlopen(f.present.c_str(), RTLD_NOW | RTLD_LOCAL)) dlclose(h);  // raced into place
    else f.present_error = dl_error();
  }
  return f;
}

AllocatorFacts probe_allocator(const Getenv& get) {
  AllocatorFacts f;
  if (const char* v = get("PYTORCH_CUDA_ALLOC_CONF")) f.cuda_conf = v;
  if (const char* v = get("PYTORCH_ALLOC_CONF")) f.conf = v;
  return f;
}

PoolFacts probe_pool(const ProbeOptions& o) {
  PoolFacts f;
  const Settings st = settings_of(o.get);
  f.daemon = st.daemon;
  f.pool_bytes = st.host_pool_bytes;
  f.pool_set = st.host_pool_set;
  f.shm_dir = o.shm_dir;
  struct statvfs v{};
  if (statvfs(o.shm_dir.c_str(), &v) == 0) {
    f.shm_free = uint64_t{v.f_bavail} * v.f_frsize;
    f.shm_total = uint64_t{v.f_blocks} * v.f_frsize;
  } else {
    f.shm_error = strerror(errno);
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    uint64_t kib = 0;
    if (line.rfind("MemAvailable:", 0) == 0 && (std::istringstream(line.substr(13)) >> kib)) f.mem_available = kib * 1024;
  }
  f.segment = paths_from_env(o.get).segment;
  struct stat seg;
  if (f.shm_error.empty() && stat((o.shm_dir + "/" + f.segment).c_str(), &seg) == 0)
    f.segment_bytes = static_cast<uint64_t>(seg.st_size);
  return f;
}

ShimFacts probe_shim(const ProbeOptions& o) {
  ShimFacts f;
  if (const char* v = o.get("OFFLOAD_LIB"); v && *v) f.offload_lib = v;
  if (!f.offload_lib.empty()) {
    f.looked = {f.offload_lib};  // as offload-run: the library named, or none
  } else {
    const std::filesystem::path dir = std::filesystem::path(self_path(o)).parent_path();
    for (const std::filesystem::path& c :
         {dir / "liboffload.so", dir / ".." / o.libdir / "liboffload.so", dir / ".." / "lib" / "liboffload.so"}) {
      const std::string s = c.lexically_normal().string();
      if (std::find(f.looked.begin(), f.looked.end(), s) == f.looked.end()) f.looked.push_back(s);
    }
  }
  for (const std::string& c : f.looked)
    if (is_file(c)) {
      f.found = c;
      break;
    }
  std::string entry;
  const char* preload = o.get("LD_PRELOAD");
  for (char c : std::string(preload ? preload : "") + " ") {
    if (c != ' ' && c != ':') {
      entry += c;
      continue;
    }
    if (entry.empty()) continue;
    if (f.preloaded < 0 && entry.substr(entry.rfind('/') + 1) == "liboffload.so") {
      f.preloaded = static_cast<int>(f.preload.size());
      if (entry.find('/') != std::string::npos) f.preloaded_exists = is_file(entry);
    }
    f.preload.push_back(entry);
    entry.clear();
  }
  return f;
}

GlibcFacts probe_glibc(const std::string& shim_found, const std::string& self_exe) {
  GlibcFacts f;
  f.running = gnu_get_libc_version();
  f.needed_by = shim_found.empty() ? self_exe : shim_found;
  f.needed = glibc_needed(f.needed_by, &f.error);
  return f;
}

SettingsFacts probe_settings(const ProbeOptions& o) {
  SettingsFacts f;
  const Settings st = read_settings(o.get, &f.errors);
  f.disabled = !st.enabled;
  f.unknown = unknown_settings(o.env);
  for (const char* const* e = o.env; e && *e; ++e) f.set += std::strncmp(*e, "OFFLOAD_", 8) == 0;
  return f;
}

Facts probe(const ProbeOptions& o) {
  Facts f;
  f.driver = probe_driver();
  f.cupti = probe_cupti(o);
  f.allocator = probe_allocator(o.get);
  f.pool = probe_pool(o);
  f.shim = probe_shim(o);
  f.glibc = probe_glibc(f.shim.found, self_path(o));
  f.settings = probe_settings(o);
  return f;
}

int run(const ProbeOptions& o, bool json) {
  const std::vector<Check> checks = judge(probe(o));
  const std::string out = json ? render_json(checks) + "\n" : render_text(checks);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return any_failed(checks) ? 1 : 0;
}

}  // namespace offload::doctor
