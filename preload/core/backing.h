// Backing: the physical memory behind one mapped range, as handles mapped one after another
// from the range's start.
//
// A streamed weight is born on one handle of its own size (the PersistentPool's block). Once
// it streams, a reload takes memory where it finds it: a kept handle, a new one, or the
// handles of weights on their way out, whatever their sizes. A piece maps its handle whole:
// the driver maps no part of one (CUDA_ERROR_NOT_SUPPORTED on the H200; the simulated driver
// refuses it too). Offsets and sizes are multiples of the granularity.
#pragma once

#include <cstdint>
#include <vector>

#include "core/driver.h"
#include "planner/weight_unit.h"  // weight_unit, in_units

namespace offload {

struct Piece {
  uint64_t handle = 0;
  uint64_t bytes = 0;   // the handle's size, all of it mapped here
  bool given = false;   // the handle is another range's now (still mapped here until unmapped)
};
using Backing = std::vector<Piece>;

// The handles' bytes (given ones excluded).
uint64_t physical_bytes(const Backing& b);
// Maps the pieces one after another from `va`; on a failure unmaps what it mapped and returns
// false.
bool map_backing(Driver& d, DevPtr va, const Backing& b);
// Unmaps each piece (given ones too: their mappings here are ours); false if one failed.
bool unmap_backing(Driver& d, DevPtr va, const Backing& b);
// Releases the handles not given away.
void release_backing(Driver& d, const Backing& b);

}  // namespace offload
