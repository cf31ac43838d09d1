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

// The handle size for streamed weights' new memory, so that one weight's leaving memory fits
// another's reload: the largest common divisor of the sizes, taken size by size, most bytes
// first, skipping a size that would bring it so low that some weight needs more than
// `max_pieces` of it (those weights keep a handle of their own size). lora's weights: 288 MiB
// (88 of them), 216 MiB (44) and the embedding and head of 376 MiB: 72 MiB, the 376 MiB ones
// apart (with them in, 8 MiB, 47 pieces). 0 for no sizes.
uint64_t weight_unit(const std::vector<uint64_t>& sizes, uint64_t max_pieces = 16);
// Whether a weight of `size` reloads in units of `unit`: at least one, at most `max_pieces`.
bool in_units(uint64_t size, uint64_t unit, uint64_t max_pieces = 16);

}  // namespace offload
