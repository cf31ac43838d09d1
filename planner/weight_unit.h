// Streamed weights' memory in units: the handle size the executor gives new weight memory,
// and which weights fit it. Pure arithmetic on sizes, shared by the executor (which maps in
// these units, core/backing.h) and the planner (which counts a weight's footprint in them).
#pragma once

#include <cstdint>
#include <vector>

namespace offload {

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
