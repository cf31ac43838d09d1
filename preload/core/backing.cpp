#include "core/backing.h"

namespace offload {

uint64_t physical_bytes(const Backing& b) {
  uint64_t n = 0;
  for (const Piece& p : b)
    if (!p.given) n += p.bytes;
  return n;
}

bool map_backing(Driver& d, DevPtr va, const Backing& b) {
  uint64_t off = 0;
  for (size_t k = 0; k < b.size(); ++k) {
    if (b[k].given || !d.map(va + off, b[k].bytes, b[k].handle)) {
      for (size_t j = 0, o = 0; j < k; o += b[j].bytes, ++j) d.unmap(va + o, b[j].bytes);
      return false;
    }
    off += b[k].bytes;
  }
  return true;
}

bool unmap_backing(Driver& d, DevPtr va, const Backing& b) {
  bool ok = true;
  uint64_t off = 0;
  for (const Piece& p : b) {
    ok = d.unmap(va + off, p.bytes) && ok;
    off += p.bytes;
  }
  return ok;
}

void release_backing(Driver& d, const Backing& b) {
  for (const Piece& p : b)
    if (!p.given) d.release_physical(p.handle);
}

}  // namespace offload
