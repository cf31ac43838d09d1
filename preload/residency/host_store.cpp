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

HostStore::HostStore(Driver& d, Options o, ChunkSource* source) : d_(d), o_(o), source_(source) {
  if (o_.chunk_bytes == 0) o_.chunk_bytes = 256ull << 20;
  if (o_.pin_piece == 0) o_.pin_piece = 1ull << 30;
  o_.chunk_bytes = round_up(o_.chunk_bytes, kSlotAlign);
  if (o_.limit == 0) o_.limit = mem_available() / 4 * 3;
}

HostStore::~HostStore() {
  // The pinned registrations go with the mappings: the driver drops a registration whose
  // pages are unmapped when the process ends, and a store outlives every copy into it.
  for (const Chunk& c : chunks_)
    if (!c.lent) munmap(c.base, c.bytes);
}

void* HostStore::take(uint64_t bytes) {
  bytes = round_up(std::max<uint64_t>(bytes, 1), kSlotAlign);
  std::lock_guard<std::mutex> lk(mu_);
  if (void* p = take_locked(bytes)) return p;
  // Out of room: a chunk more.
  const uint64_t size = bytes > o_.pin_piece ? bytes : std::max(bytes, std::min(o_.chunk_bytes, o_.pin_piece));
  if (st_.mapped + size > o_.limit) {
    ++st_.refused;
    return nullptr;
  }
  bool lent = false;
  unsigned char* base = map_chunk(size, &lent);
  if (!base) {
    ++st_.refused;
    return nullptr;
  }
  add_chunk(base, size, lent);
  if (bytes > o_.pin_piece) {  // its own chunk, whole
    chunks_.back().used = size;
    note_taken(bytes);
    return base;
  }
  return take_locked(bytes);
}

void* HostStore::take_locked(uint64_t bytes) {
  // A freed slot of the same size (a training step evicts the same sizes again and again).
  // Slots are never split: one over pin_piece had a chunk of its own, registered in pieces from
  // its start, and a piece of it elsewhere would put a copy across two registrations.
  if (auto it = free_.find(bytes); it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    note_taken(bytes);
    return p;
  }
  if (bytes > o_.pin_piece) return nullptr;  // a chunk of its own
  for (Chunk& c : chunks_)
    if (c.bytes <= o_.pin_piece && c.bytes - c.used >= bytes) {
      void* p = c.base + c.used;
      c.used += bytes;
      note_taken(bytes);
      return p;
    }
  return nullptr;
}

void HostStore::note_taken(uint64_t bytes) {
  st_.in_use += bytes;
  st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
}

unsigned char* HostStore::map_chunk(uint64_t size, bool* lent) {
  if (source_)
    if (void* p = source_->take(size)) {
      *lent = true;
      pin(static_cast<unsigned char*>(p), size);
      return static_cast<unsigned char*>(p);
    }
  void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* base = static_cast<unsigned char*>(m);
  // Pinning faults the pages in itself: on the H200's host that made memory ready in about 340
  // ms/GiB, against 350-510 faulted in first (MAP_POPULATE) and then pinned, and transparent
  // huge pages were slower still (scripts/gpu/pin_probe.cpp; docs/results.md).
  pin(base, size);
  return base;
}

// A chunk that could not be pinned is faulted in by its first copy, as pageable memory.
void HostStore::pin(unsigned char* base, uint64_t size) {
  const int64_t t0 = mono_ns();
  for (uint64_t off = 0; off < size; off += o_.pin_piece)
    if (!d_.pin_host(base + off, std::min(o_.pin_piece, size - off))) ++st_.pin_failures;
  st_.pin_ns += mono_ns() - t0;
}

void HostStore::add_chunk(unsigned char* base, uint64_t size, bool lent) {
  chunks_.push_back({base, size, 0, lent});
  st_.mapped += size;
  if (lent) st_.lent += size;
  ++st_.chunks;
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
