#include "common/cupti_lookup.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>

namespace offload {
namespace {

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "/a/b" for "/a/b/c"; "" when `path` has no directory part.
std::string parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

}  // namespace

int so_major(const std::string& path) {
  const std::string name = base_name(path);
  const size_t at = name.find(".so.");
  if (at == std::string::npos) return 0;
  int major = 0;
  size_t i = at + 4;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && major < 10000; ++i)
    major = major * 10 + (name[i] - '0');
  // Digits, then the end or a further ".minor".
  if (i == at + 4 || (i < name.size() && name[i] != '.')) return 0;
  return major;
}

int preferred_cupti_major(const CuptiSearch& s) {
  const int m = so_major(s.cudart_path);
  return std::find(std::begin(kCuptiMajors), std::end(kCuptiMajors), m) != std::end(kCuptiMajors) ? m
                                                                                                   : kCuptiMajors[0];
}

std::vector<std::string> cupti_candidates(const CuptiSearch& s) {
  std::vector<std::string> out;
  auto add = [&](const std::string& c) {
    if (!c.empty() && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  };
  add(s.hint);
  std::vector<int> majors = {preferred_cupti_major(s)};
  for (int m : kCuptiMajors)
    if (m != majors[0]) majors.push_back(m);
  const std::string cudart_dir = parent(s.cudart_path);
  for (int m : majors) {
    const std::string lib = "libcupti.so." + std::to_string(m);
    add(lib);
    if (!cudart_dir.empty()) {
      add(cudart_dir + "/" + lib);
      // cu12 wheels: site-packages/nvidia/cuda_runtime/lib beside nvidia/cuda_cupti/lib.
      if (cudart_dir.ends_with("/cuda_runtime/lib")) add(parent(parent(cudart_dir)) + "/cuda_cupti/lib/" + lib);
    }
    for (std::string root : {s.cuda_home, std::string("/usr/local/cuda")}) {
      while (root.size() > 1 && root.back() == '/') root.pop_back();
      if (root.empty()) continue;
      add(root + "/extras/CUPTI/lib64/" + lib);
      add(root + "/lib64/" + lib);
    }
  }
  return out;
}

std::string first_present(const std::vector<std::string>& candidates) {
  for (const std::string& c : candidates) {
    if (c.find('/') == std::string::npos) continue;
    struct stat st;
    if (stat(c.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return c;
  }
  return {};
}

}  // namespace offload
