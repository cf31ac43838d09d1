// NVTX ranges around the shim's own copies, so that Nsight Systems names them ("liboffload
// evict", "liboffload reload", with the bytes as payload) on the CPU and, projected, on the
// GPU stream that ran them; and the shim's streams by name. Free when no tool is attached:
// NVTX's first call finds no injection library and every later call returns at once.
#pragma once

#include <cstdint>

namespace offload::nvtx {

enum class Move { Evict, Reload };

// Open for the life of the object; nest-safe, per thread (NVTX's push/pop).
class Range {
 public:
  Range(Move m, uint64_t bytes);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool open_ = false;
};

// Names a CUstream (given as its handle value) in the tool's stream list.
void name_stream(uint64_t stream, const char* name);

}  // namespace offload::nvtx
