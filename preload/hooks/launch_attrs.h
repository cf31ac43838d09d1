// Which cuLaunchKernelEx launches may be launched again, and with which attributes (the launch
// hook hands those to the shim with their arguments: core/launch_args.h).
#pragma once

#include <cuda.h>

namespace offload::hooks {

// Attributes a launch is made again with, at most this many (more: not made again).
inline constexpr unsigned kMaxRelaunchAttrs = 16;

struct RelaunchAttrs {
  unsigned n = 0;     // attributes written to the caller's array
  int refused = -1;   // the attribute that forbids launching it again, or -1 (kMaxRelaunchAttrs
                      // past the limit counts as attribute 0x7fff, no pointer: 0x7ffe)
};

// The attributes to launch C's kernel again with, into out[kMaxRelaunchAttrs]. Kept: shape,
// placement and hints (clusters, priority, memory synchronisation domains, the cache window, the
// shared memory carve-out). Dropped: programmatic serialization (it lets a launch start before
// the work ahead of it on its stream has ended; launched again without it, the kernel's wait for
// that work returns at once, as all of it has ended) and the events a launch signals (a second
// launch must not signal the user's event again). Refused: a cooperative launch, a graph-only
// attribute, one this build does not know.
inline RelaunchAttrs relaunch_attrs(const CUlaunchConfig* c, CUlaunchAttribute* out) {
  RelaunchAttrs r;
  if (c->numAttrs && !c->attrs) return {0, 0x7ffe};  // the driver refuses it: nothing to read
  for (unsigned i = 0; i < c->numAttrs; ++i) switch (c->attrs[i].id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:
      case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
        continue;
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
        if (r.n == kMaxRelaunchAttrs) return {0, 0x7fff};
        out[r.n++] = c->attrs[i];
        continue;
      default:
        return {0, int(c->attrs[i].id)};
    }
  return r;
}

}  // namespace offload::hooks
