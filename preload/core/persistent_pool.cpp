#include "core/persistent_pool.h"

#include <algorithm>

namespace offload {

PersistentPool::PersistentPool(Driver& d, Options o) : d_(d), o_(o) {}

PersistentPool::~PersistentPool() {
  std::lock_guard lock(mu_);
  for (auto& [size, b] : kept_) {
    if (b.event) d_.event_sync(b.event);
    give_back(b);
  }
  // Live blocks are the application's: it did not free them before we went away.
  kept_.clear();
}

DevPtr PersistentPool::alloc(uint64_t bytes, Stream s) {
  if (!o_.min_bytes || bytes < o_.min_bytes) return 0;
  std::lock_guard lock(mu_);
  if (closed_) {
    if (!kept_.empty()) trim(0);
    return 0;
  }
  if (!gran_) gran_ = d_.vmm_granularity();
  if (!gran_) return 0;
  const uint64_t size = (bytes + gran_ - 1) / gran_ * gran_;
  // A kept block of the size; one without an event only on the stream that freed it.
  auto [first, last] = kept_.equal_range(size);
  auto it = first;
  while (it != last && !it->second.event && it->second.freed_on != s) ++it;
  if (it != last) {
    Block b = it->second;
    kept_.erase(it);
    st_.cached_bytes -= b.bytes;
    // cudaFreeAsync's order: the freeing stream's later work follows the free by itself;
    // another stream waits for what was queued before it.
    if (b.freed_on != s) {
      d_.stream_wait(s, b.event);
      ++st_.cross_stream;
    }
    if (b.event) d_.destroy_event(b.event);
    b.event = 0;
    live_[b.va] = b;
    st_.live_bytes += b.bytes;
    ++st_.allocs;
    ++st_.reused;
    note_peak();
    return b.va;
  }
  DevPtr va = create(size);
  if (!va && trim(0)) va = create(size);
  if (!va) {
    ++st_.refused;
    return 0;
  }
  ++st_.allocs;
  note_peak();
  return va;
}

DevPtr PersistentPool::create(uint64_t size) {
  const uint64_t room = std::max<uint64_t>(o_.room, 1) * size;
  DevPtr va = d_.reserve(room);
  if (!va) return 0;
  uint64_t h = d_.create_physical(size);
  if (!h) {
    d_.unreserve(va, room);
    return 0;
  }
  if (!d_.map(va, size, h)) {
    d_.release_physical(h);
    d_.unreserve(va, room);
    return 0;
  }
  live_[va] = Block{va, size, room, Backing{Piece{h, size}}, 0, 0};
  st_.live_bytes += size;
  ++st_.created;
  return va;
}

bool PersistentPool::free(DevPtr p, Stream s) {
  std::lock_guard lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return false;
  Block b = it->second;
  live_.erase(it);
  st_.live_bytes -= b.bytes;
  if (b.backing.empty()) {
    // Lent and never given back (the executor gives a block back before its free): its
    // range cannot be reused safely, so it is left reserved.
    st_.lent_bytes -= b.bytes;
    return true;
  }
  b.event = d_.create_event();
  if (b.event) d_.record_event(b.event, s);
  b.freed_on = s;
  b.seq = ++frees_;
  kept_.emplace(b.bytes, b);
  st_.cached_bytes += b.bytes;
  if (closed_) trim(0);
  else if (st_.cached_bytes > o_.cache_bytes) trim(o_.cache_bytes);
  return true;
}

void PersistentPool::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  trim(0);
}

void PersistentPool::give_back(Block& b) {
  if (b.event) d_.destroy_event(b.event);
  b.event = 0;
  unmap_backing(d_, b.va, b.backing);
  release_backing(d_, b.backing);
  d_.unreserve(b.va, b.room);
  ++st_.released;
}

uint64_t PersistentPool::trim(uint64_t target) {
  // Oldest frees first: collect in free order across sizes.
  std::multimap<uint64_t, std::multimap<uint64_t, Block>::iterator> by_age;
  for (auto it = kept_.begin(); it != kept_.end(); ++it) by_age.emplace(it->second.seq, it);
  uint64_t freed = 0;
  for (auto& [age, it] : by_age) {
    if (target && st_.cached_bytes <= target) break;
    Block& b = it->second;
    // Still in use on the GPU, or unknown (no event): kept.
    if (!b.event || d_.event_query(b.event) != 1) continue;
    st_.cached_bytes -= b.bytes;
    freed += b.bytes;
    give_back(b);
    kept_.erase(it);
  }
  return freed;
}

void PersistentPool::note_peak() {
  const uint64_t held = st_.live_bytes - st_.lent_bytes + st_.cached_bytes;
  if (held > st_.peak_bytes) st_.peak_bytes = held;
}

void PersistentPool::reset_peak() {
  std::lock_guard lock(mu_);
  st_.peak_bytes = 0;
  note_peak();
}

bool PersistentPool::lend(DevPtr p, Backing* backing, uint64_t* bytes, uint64_t* room) {
  std::lock_guard lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end() || it->second.backing.empty()) return false;
  *backing = std::move(it->second.backing);
  it->second.backing.clear();
  *bytes = it->second.bytes;
  if (room) *room = it->second.room;
  st_.lent_bytes += it->second.bytes;
  return true;
}

bool PersistentPool::unlend(DevPtr p, Backing backing) {
  std::lock_guard lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end() || !it->second.backing.empty() || backing.empty()) return false;
  it->second.backing = std::move(backing);
  st_.lent_bytes -= it->second.bytes;
  note_peak();
  return true;
}

bool PersistentPool::owns(DevPtr p) const {
  std::lock_guard lock(mu_);
  return live_.count(p) != 0;
}

uint64_t PersistentPool::block_bytes(DevPtr p) const {
  std::lock_guard lock(mu_);
  auto it = live_.find(p);
  return it == live_.end() ? 0 : it->second.bytes;
}

PersistentPool::Stats PersistentPool::stats() const {
  std::lock_guard lock(mu_);
  return st_;
}

}  // namespace offload
