// What offloadd needs from the machine, checked before it promises anything: memory for the
// pool, file descriptors for its peers, and an output buffer per peer so that one slow
// reader never holds up the only loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace offload {

// The memory a new pool of `total` bytes would take, against what there is.
struct MemoryRoom {
  uint64_t shm_free = 0;       // statvfs of the shared-memory file system: bytes free
  std::optional<uint64_t> mem_available;  // /proc/meminfo MemAvailable; nullopt if unknown
};
MemoryRoom memory_room(const std::string& shm_dir = "/dev/shm");
// Empty if `total` bytes fit; else a message for a person naming the limit.
std::string pool_room_problem(uint64_t total, const MemoryRoom& room, const std::string& shm_dir = "/dev/shm");

// A process as the daemon names it across its own restarts: the pid, and the low 32 bits of
// its start time (field 22 of /proc/PID/stat, clock ticks after boot; 0 if unreadable).
uint32_t process_start(uint32_t pid);
enum class Liveness { Alive, Gone, Unknown };
// Whether (pid, start) is still that process: Gone when no process has the pid, or when the
// pid now belongs to a process started at another time (reused). Unknown for pid 0 (a peer in
// another pid namespace, which SO_PEERCRED cannot name). A start of 0 is not compared.
Liveness liveness(uint32_t pid, uint32_t start);

// Raises the soft RLIMIT_NOFILE to the hard limit; the soft limit in force afterwards.
uint64_t raise_open_files_limit();

// One descriptor held in reserve (/dev/null): when accept fails for want of descriptors, it
// is closed to accept the waiting peer and close it with an answer, then taken again, so
// that the listening socket does not stay readable and spin the loop.
class SpareFd {
 public:
  SpareFd();
  ~SpareFd();
  SpareFd(const SpareFd&) = delete;
  SpareFd& operator=(const SpareFd&) = delete;
  bool held() const { return fd_ >= 0; }
  void release();
  bool take();

 private:
  int fd_ = -1;
};

// Bytes waiting to go out on one non-blocking socket.
class OutBuffer {
 public:
  void append(const void* p, size_t n);
  // Sends what the socket takes now without blocking; false if the peer is gone.
  bool flush(int fd);
  size_t size() const { return buf_.size() - off_; }
  bool empty() const { return size() == 0; }

 private:
  std::vector<unsigned char> buf_;
  size_t off_ = 0;  // bytes of buf_ already sent
};

}  // namespace offload
