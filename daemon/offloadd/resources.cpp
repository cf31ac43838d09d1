#include "offloadd/resources.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace offload {
namespace {

std::string gib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", static_cast<double>(b) / static_cast<double>(1ull << 30));
  return s;
}

}  // namespace

MemoryRoom memory_room(const std::string& shm_dir) {
  MemoryRoom r;
  struct statvfs v{};
  if (statvfs(shm_dir.c_str(), &v) == 0) r.shm_free = uint64_t{v.f_bavail} * v.f_frsize;
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    uint64_t kib = 0;
    if (in >> kib) r.mem_available = kib * 1024;
  }
  return r;
}

std::string pool_room_problem(uint64_t total, const MemoryRoom& room, const std::string& shm_dir) {
  // tmpfs gives out pages as they are touched: a pool past its free space, or past memory,
  // dies of SIGBUS or of the OOM killer later, in the daemon or in a client.
  if (total > room.shm_free)
    return "a pool of " + gib(total) + " does not fit in " + shm_dir + " (" + gib(room.shm_free) +
           " free): give a smaller --pool-size, or make " + shm_dir + " larger";
  if (room.mem_available && total > *room.mem_available)
    return "a pool of " + gib(total) + " is more than the memory available (" + gib(*room.mem_available) +
           ", MemAvailable): give a smaller --pool-size";
  return {};
}

uint32_t process_start(uint32_t pid) {
  if (!pid) return 0;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields count from the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return static_cast<uint32_t>(std::strtoull(field.c_str(), nullptr, 10));
  return 0;
}

Liveness liveness(uint32_t pid, uint32_t start) {
  if (!pid) return Liveness::Unknown;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return Liveness::Gone;
  if (!start) return Liveness::Alive;
  const uint32_t now = process_start(pid);
  return now && now != start ? Liveness::Gone : Liveness::Alive;
}

uint64_t raise_open_files_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    rlimit want = r;
    want.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) r = want;
  }
  return r.rlim_cur;
}

SpareFd::SpareFd() { take(); }

SpareFd::~SpareFd() { release(); }

void SpareFd::release() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool SpareFd::take() {
  if (fd_ < 0) fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd_ >= 0;
}

void OutBuffer::append(const void* p, size_t n) {
  if (off_ && off_ == buf_.size()) {
    buf_.clear();
    off_ = 0;
  }
  const auto* c = static_cast<const unsigned char*>(p);
  buf_.insert(buf_.end(), c, c + n);
}

bool OutBuffer::flush(int fd) {
  while (off_ < buf_.size()) {
    ssize_t w = ::send(fd, buf_.data() + off_, buf_.size() - off_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (w <= 0) return false;
    off_ += static_cast<size_t>(w);
  }
  // Keep the unsent tail at the front once most of the buffer is sent.
  if (off_ == buf_.size()) {
    buf_.clear();
    off_ = 0;
  } else if (off_ > buf_.size() / 2) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(off_));
    off_ = 0;
  }
  return true;
}

}  // namespace offload
