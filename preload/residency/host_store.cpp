#include "residency/host_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/clock.h"

namespace offload {
namespace {

constexpr uint64_t kSlotAlign = 4096;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

uint64_t HostStore::mem_available() {
  FILE* f = std::fopen("/proc/meminfo", "re");
  if (!f) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lu kB", &kib) == 1) break;
  std::fclose(f);
  return kib << 10;
}

HostStore::HostStore(Driver& d, Options o) : d_(d), o_(o) {
  if (o_.chunk_bytes == 0) o_.chunk_bytes = 256ull << 20;
  if (o_.pin_piece == 0) o_.pin_piece = 1ull << 30;
  o_.chunk_bytes = round_up(o_.chunk_bytes, kSlotAlign);
  if (o_.limit == 0) o_.limit = mem_available() / 4 * 3;
}

HostStore::~HostStore() {
  // The pinned registrations go with the mappings: the driver drops a registration whose
  // pages are unmapped when the process ends, and a store outlives every copy into it.
  for (const Chunk& c : chunks_) munmap(c.base, c.bytes);
}

void* HostStore::take(uint64_t bytes) {
  bytes = round_up(std::max<uint64_t>(bytes, 1), kSlotAlign);
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = free_.find(bytes); it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    st_.in_use += bytes;
    st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
    return p;
  }
  for (Chunk& c : chunks_)
    if (c.bytes - c.used >= bytes) {
      void* p = c.base + c.used;
      c.used += bytes;
      st_.in_use += bytes;
      st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
      return p;
    }
  const uint64_t size = std::max(bytes, o_.chunk_bytes);
  if (st_.mapped + size > o_.limit) {
    ++st_.refused;
    return nullptr;
  }
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) {
    ++st_.refused;
    return nullptr;
  }
  auto* base = static_cast<unsigned char*>(m);
  const int64_t t0 = mono_ns();
  for (uint64_t off = 0; off < size; off += o_.pin_piece)
    if (!d_.pin_host(base + off, std::min(o_.pin_piece, size - off))) ++st_.pin_failures;
  st_.pin_ns += mono_ns() - t0;
  chunks_.push_back({base, size, bytes});
  st_.mapped += size;
  ++st_.chunks;
  st_.in_use += bytes;
  st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
  return base;
}

void HostStore::give(void* p, uint64_t bytes) {
  if (!p) return;
  bytes = round_up(std::max<uint64_t>(bytes, 1), kSlotAlign);
  std::lock_guard<std::mutex> lk(mu_);
  free_.emplace(bytes, p);
  st_.in_use -= std::min(st_.in_use, bytes);
}

HostStore::Stats HostStore::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return st_;
}

}  // namespace offload
