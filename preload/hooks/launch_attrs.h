// Which cuLaunchKernelEx launches may be launched again as they were, by their attributes (the
// launch hook hands those to the shim with their arguments: core/launch_args.h).
#pragma once

#include <cuda.h>

namespace offload::hooks {

// A launch whose attributes allow it to be launched again as it was (core/launch_args.h): shape
// and placement (clusters, priority, memory synchronisation domains). Not one that names an event
// (signalled again by a second launch), lets it start before the work before it on its stream
// has ended (programmatic serialization: our own copies may be that work), or is cooperative.
inline bool relaunchable(const CUlaunchConfig* c) {
  if (c->numAttrs && !c->attrs) return false;  // the driver refuses it: nothing to read here
  for (unsigned i = 0; i < c->numAttrs; ++i) switch (c->attrs[i].id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
        continue;
      default:
        return false;
    }
  return true;
}

}  // namespace offload::hooks
