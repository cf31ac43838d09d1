// The host pool's memory layout and its lease table, shared by offloadd (over a POSIX
// shared-memory segment) and by the shim's in-process fallback (over private memory).
//
//   [ PoolHeader | LeaseSlot x max_leases | padding to kDataAlign | data ... ]
//
// Offsets only, never pointers, so every process may map it anywhere. The header carries
// a magic and a layout version; a reader rejects anything else. The lease table is the
// truth about which bytes belong to whom: a restarted daemon re-adopts it as it finds it.
//
// Threading: one writer (the daemon's loop, or the fallback's mutex holder).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace offload {

inline constexpr char kPoolMagic[8] = {'O', 'F', 'F', 'L', 'P', 'O', 'O', 'L'};
inline constexpr uint32_t kPoolLayoutVersion = 1;
inline constexpr uint64_t kDataAlign = 2u << 20;   // 2 MiB: extents pin and map cleanly
inline constexpr uint64_t kLeaseAlign = 64u << 10; // lease granularity

struct PoolHeader {
  char magic[8];
  uint32_t layout_version;
  uint32_t max_leases;
  uint64_t table_offset;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t generation;  // bumped by every daemon that adopts the segment
  uint32_t owner_pid;   // the daemon that last adopted it
  uint32_t reserved;
};
static_assert(sizeof(PoolHeader) == 56);

struct LeaseSlot {
  uint32_t used;       // 0 free, 1 leased
  uint32_t client_id;
  uint32_t pid;        // in the daemon's pid namespace; 0 when the client is not visible there
  // The low 32 bits of the process's start time (clock ticks after boot, /proc/PID/stat): with
  // the pid, it names the process, so that a reused pid does not keep a dead client's leases.
  // 0: unknown (a table written before it was kept).
  uint32_t pid_start;
  uint64_t offset;     // in the data area
  uint64_t bytes;
};
static_assert(sizeof(LeaseSlot) == 32);

// The pool is pinned in chunks of this size from its data area's start, one registration each.
// Pinning holds the process's memory map for its whole range (a training thread that maps
// memory meanwhile waits: a 22 s step while 48 GiB were pinned in 2 GiB chunks), so a chunk
// takes under 0.1 s on the H200's host. A copy must not span two chunks (two registrations):
// the executor splits its copies there.
inline constexpr uint64_t kPinChunk = 256ull << 20;
static_assert(kPinChunk % kDataAlign == 0);

// Bytes a pool of `data_bytes` needs in all (header, table, alignment, data).
uint64_t pool_total_bytes(uint64_t data_bytes, uint32_t max_leases);

// The table's geometry (max_leases, the table's and the data area's offsets, the data bytes)
// is checked once, by format() or open(), and copied: the shared header is never read for it
// again, as any process of the user may write to the segment. Every slot is bounds-checked
// on each access; a used slot whose extent is not inside the data area counts as taken (it
// is never reused, nor handed out) and is left out of every answer.
class LeaseTable {
 public:
  // Formats a fresh pool in [base, base + total).
  static std::optional<LeaseTable> format(void* base, uint64_t total, uint32_t max_leases, uint32_t owner_pid);
  // Opens a pool formatted earlier; nullopt with *why on a bad magic, version or size.
  static std::optional<LeaseTable> open(void* base, uint64_t total, std::string* why);

  // First fit, rounded up to kLeaseAlign. nullopt if no extent is large enough.
  std::optional<uint64_t> lease(uint64_t bytes, uint32_t client_id, uint32_t pid, uint32_t pid_start = 0);
  // Frees the lease that starts at `offset` and belongs to `client_id`; false if none does.
  bool release(uint64_t offset, uint32_t client_id);
  // Frees every lease of `client_id` (a slot out of bounds included); returns the bytes freed.
  uint64_t release_all(uint32_t client_id);

  uint64_t data_bytes() const { return data_bytes_; }
  uint32_t max_leases() const { return max_leases_; }
  uint64_t used_bytes() const;
  uint64_t leased_by(uint32_t client_id) const;
  uint64_t largest_free() const;
  std::vector<LeaseSlot> leases() const;  // used slots inside the data area
  // Used slots whose extent lies outside the data area (a corrupted table).
  uint32_t bad_slots() const;
  // The shared header: for its generation and owner_pid only (the geometry is copied).
  PoolHeader& header() { return *header_; }
  unsigned char* data() { return base_ + data_offset_; }

 private:
  // `g`: a private copy of the header, already checked.
  LeaseTable(unsigned char* base, PoolHeader* h, const PoolHeader& g)
      : base_(base),
        header_(h),
        max_leases_(g.max_leases),
        table_offset_(g.table_offset),
        data_offset_(g.data_offset),
        data_bytes_(g.data_bytes) {}
  // A copy of slot i (i < max_leases_): the shared slot may change under us.
  LeaseSlot slot(uint32_t i) const;
  LeaseSlot* slot_at(uint32_t i) { return reinterpret_cast<LeaseSlot*>(base_ + table_offset_) + i; }
  bool in_bounds(const LeaseSlot& s) const {
    return s.bytes && s.offset <= data_bytes_ && s.bytes <= data_bytes_ - s.offset;
  }
  std::vector<std::pair<uint64_t, uint64_t>> used_extents() const;  // (offset, bytes), sorted

  unsigned char* base_;
  PoolHeader* header_;
  uint32_t max_leases_;
  uint64_t table_offset_, data_offset_, data_bytes_;
};

}  // namespace offload
