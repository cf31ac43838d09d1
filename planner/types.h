// The vocabulary the planner shares with the shim's core: device addresses, stream and
// kernel handles, allocation ids, and the kinds of event a step is made of. Plain values,
// no behaviour, so that planner/ needs nothing from preload/ (core/driver.h, core/event_log.h
// and core/alloc_table.h take these names from here).
#pragma once

#include <cstdint>

namespace offload {

using DevPtr = uint64_t;   // a device address (CUdeviceptr)
using Stream = uint64_t;   // a stream handle value; 0 legacy, 2 per-thread default
using Func = uint64_t;     // a kernel handle (CUfunction or CUkernel)
using AllocId = uint64_t;  // the tracker's id of an allocation

enum class EventKind : uint8_t { Kernel, Copy, Memset, Graph, Alloc, Free, Mark };

inline bool is_launch(EventKind k) { return k <= EventKind::Graph; }

}  // namespace offload
