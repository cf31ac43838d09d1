#include "residency/host_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "common/clock.h"
#include "planner/plan.h"  // round_up

namespace offload {
namespace {

constexpr uint64_t kSlotAlign = 4096;

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
  o_.chunk_bytes = std::min(round_up(o_.chunk_bytes, kSlotAlign), o_.pin_piece);  // one registration
  if (o_.limit == 0) o_.limit = default_limit(mem_available());
}

HostStore::~HostStore() {
  // The pinned registrations go with the mappings: the driver drops a registration whose
  // pages are unmapped when the process ends, and a store outlives every copy into it.
  for (const Chunk& c : chunks_)
    if (!c.lent) munmap(c.base, c.bytes);
}

void* HostStore::take(uint64_t bytes, bool grow) {
  bytes = round_up(std::max<uint64_t>(bytes, 1), kSlotAlign);
  std::lock_guard<std::mutex> lk(mu_);
  if (void* p = take_locked(bytes)) return p;
  if (!grow) return nullptr;
  // Out of room: a chunk more.
  const uint64_t size = chunk_for(bytes);
  const Made m = map_chunk(size, false, st_.counted + growing_ + size <= o_.limit);
  note_made(m);
  if (!m.base) {
    ++st_.refused;
    return nullptr;
  }
  const uint32_t c = add_chunk(m, size);
  if (bytes > o_.pin_piece) {  // its own chunk, whole
    note_taken(bytes);
    return m.base;
  }
  add_free(m.base, size, c);
  return take_locked(bytes);
}

uint64_t HostStore::chunk_for(uint64_t bytes) const {
  // Rounded up to whole chunks: slots a little apart in size (a checkpointed Llama's 1,008, 1,010
  // and 1,024 MiB ones on an H100) then take one chunk in turn, where chunks of their exact sizes
  // grew the store by one each, a GiB a step with its most bytes in use flat (docs/results.md).
  if (bytes <= o_.chunk_bytes) return o_.chunk_bytes;
  const uint64_t whole = round_up(bytes, o_.chunk_bytes);
  return bytes > o_.pin_piece ? whole : std::min(whole, o_.pin_piece);  // at most one registration
}

void* HostStore::take_locked(uint64_t bytes) {
  // A slot over pin_piece had a chunk of its own, registered in pieces from its start: it is
  // never split, since a piece of it elsewhere would put a copy across two registrations.
  // It takes the smallest free one that holds it, whole, if at most twice its size: pinning a
  // chunk more for each size asked costs the evicting thread more than the bytes left unused.
  if (bytes > o_.pin_piece) {
    largest_big_asked_ = std::max(largest_big_asked_, bytes);
    auto it = free_big_.lower_bound(bytes);
    if (it == free_big_.end() || it->first > 2 * bytes) return nullptr;
    void* p = it->second;
    free_big_.erase(it);
    note_taken(bytes);
    return p;
  }
  largest_asked_ = std::max(largest_asked_, bytes);
  // Best fit: the smallest free block that holds it, its front taken, the rest left free.
  auto fit = free_by_size_.lower_bound(bytes);
  if (fit == free_by_size_.end()) return nullptr;
  auto it = free_.find(fit->second);
  unsigned char* p = it->first;
  const Free f = it->second;
  drop_free(it);
  if (f.bytes > bytes) add_free(p + bytes, f.bytes - bytes, f.chunk);
  note_taken(bytes);
  return p;
}

void HostStore::add_free(unsigned char* p, uint64_t bytes, uint32_t chunk) {
  const BySize::iterator s = free_by_size_.emplace(bytes, p);
  free_.emplace(p, Free{bytes, chunk, s});
}

void HostStore::drop_free(std::map<unsigned char*, Free>::iterator it) {
  free_by_size_.erase(it->second.by_size);
  free_.erase(it);
}

uint32_t HostStore::chunk_of(const unsigned char* p) const {
  auto it = chunk_at_.upper_bound(p);
  return std::prev(it)->second;  // p lies in a chunk: the last one starting at or before it
}

void HostStore::note_taken(uint64_t bytes) {
  st_.in_use += bytes;
  st_.peak_in_use = std::max(st_.peak_in_use, st_.in_use);
}

HostStore::Made HostStore::map_chunk(uint64_t size, bool fault_first, bool may_count) const {
  Made m;
  if (source_)
    if (const ChunkSource::Lent got = source_->lend(size, may_count); got.p) {
      m.base = static_cast<unsigned char*>(got.p);
      m.lent = true;
      m.counted = got.counted;
      pin(&m, size);
      return m;
    }
  if (!may_count) return m;
  // Pinning faults the pages in itself: on the H200's host that made memory ready in about 340
  // ms/GiB, against 350-510 faulted in first (MAP_POPULATE) and then pinned, and transparent
  // huge pages were slower still (scripts/gpu/pin_probe.cpp; docs/results.md). Off the evicting
  // thread the faulting goes first all the same, so that the driver is held only to pin.
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (fault_first ? MAP_POPULATE : 0);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return m;
  m.base = static_cast<unsigned char*>(p);
  m.counted = true;
  pin(&m, size);
  return m;
}

// A chunk that could not be pinned is faulted in by its first copy, as pageable memory.
void HostStore::pin(Made* m, uint64_t size) const {
  const int64_t t0 = mono_ns();
  for (uint64_t off = 0; off < size; off += o_.pin_piece)
    if (!d_.pin_host(m->base + off, std::min(o_.pin_piece, size - off))) ++m->pin_failures;
  m->pin_ns = mono_ns() - t0;
}

void HostStore::note_made(const Made& m) {
  st_.pin_ns += m.pin_ns;
  if (m.lent) st_.pin_lent_ns += m.pin_ns;
  st_.pin_failures += m.pin_failures;
}

uint64_t HostStore::ahead_size_locked(uint64_t reserve) const {
  const uint64_t free = st_.mapped - st_.in_use;
  if (free < reserve) return chunk_for(largest_asked_);  // at most pin_piece
  if (free >= 2 * reserve) return 0;
  // Room that cannot serve the largest slots asked for: a slot of several chunks is given a chunk
  // of its own on the evicting thread while smaller blocks lie free (on the H200, 1-5 GiB mapped
  // past the most held, beside the reference's large slots; docs/results.md), and a slot over
  // pin_piece one of its own size.
  const uint64_t largest_free = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  if (largest_free < largest_asked_) return chunk_for(largest_asked_);
  if (largest_big_asked_ && (free_big_.empty() || free_big_.rbegin()->first < largest_big_asked_))
    return chunk_for(largest_big_asked_);
  return 0;
}

uint64_t HostStore::grow_ahead(uint64_t reserve) {
  uint64_t size = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    size = ahead_size_locked(reserve);
    if (growing_ || !size || st_.counted + size > o_.limit) return 0;
    growing_ = size;
  }
  const int64_t t0 = mono_ns();
  const Made m = map_chunk(size, true, true);
  std::lock_guard<std::mutex> lk(mu_);
  growing_ = 0;
  st_.pin_failures += m.pin_failures;
  if (!m.base) return 0;
  const uint32_t c = add_chunk(m, size);
  if (size > o_.pin_piece) free_big_.emplace(size, m.base);  // whole, registered in pieces from its start
  else add_free(m.base, size, c);
  st_.ahead += size;
  st_.ahead_ns += mono_ns() - t0;
  return size;
}

uint32_t HostStore::add_chunk(const Made& m, uint64_t size) {
  const auto index = static_cast<uint32_t>(chunks_.size());
  chunks_.push_back({m.base, size, m.lent});
  chunk_at_.emplace(m.base, index);
  st_.mapped += size;
  if (m.lent) st_.lent += size;
  if (m.counted) st_.counted += size;
  ++st_.chunks;
  return index;
}

void HostStore::give(void* p, uint64_t bytes) {
  if (!p) return;
  bytes = round_up(std::max<uint64_t>(bytes, 1), kSlotAlign);
  std::lock_guard<std::mutex> lk(mu_);
  st_.in_use -= std::min(st_.in_use, bytes);
  if (bytes > o_.pin_piece) {  // the whole chunk it had, which may be larger
    free_big_.emplace(chunks_[chunk_of(static_cast<unsigned char*>(p))].bytes, p);
    return;
  }
  // Merged with the free blocks either side that lie in the same chunk.
  auto* at = static_cast<unsigned char*>(p);
  const uint32_t c = chunk_of(at);
  if (auto next = free_.find(at + bytes); next != free_.end() && next->second.chunk == c) {
    bytes += next->second.bytes;
    drop_free(next);
  }
  if (auto prev = free_.lower_bound(at); prev != free_.begin()) {
    --prev;
    if (prev->second.chunk == c && prev->first + prev->second.bytes == at) {
      at = prev->first;
      bytes += prev->second.bytes;
      drop_free(prev);
    }
  }
  add_free(at, bytes, c);
}

HostStore::Stats HostStore::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = st_;
  s.free_blocks = free_.size();
  return s;
}

std::string host_making_note(uint64_t step, int64_t step_ns, const HostStore::Stats& now, const HostStore::Stats& was) {
  const uint64_t made_now = now.mapped - now.lent - now.ahead, made_was = was.mapped - was.lent - was.ahead;
  const uint64_t made = made_now - std::min(made_now, made_was);  // where take() needed it
  // Only the store's own memory: pinning what a source lent is the faster part, not this cost.
  const int64_t pin_ns = (now.pin_ns - now.pin_lent_ns) - (was.pin_ns - was.pin_lent_ns);
  if (made < (1ull << 30) || pin_ns < 500'000'000 || pin_ns * 4 < step_ns) return "";
  const double gib = double(1ull << 30);
  const uint64_t pool_gib = (now.mapped + now.mapped / 4 + (1ull << 30) - 1) >> 30;
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "step %llu spent %.1f s of its %.1f s making %.2f GiB of pinned host memory for evicted bytes. An "
                "offloadd started before the job makes it ahead: `offloadd --pool-size %lluGiB &`, then this job "
                "(README, Using it)",
                static_cast<unsigned long long>(step), pin_ns / 1e9, step_ns / 1e9, made / gib,
                static_cast<unsigned long long>(pool_gib));
  return buf;
}

}  // namespace offload
