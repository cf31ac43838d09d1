// A stand-in for libcuda/libcudart, loaded with dlopen by hook_table_test: it exports every
// name of the hook table (plus a few that are not in it), so that the dlsym route can be
// exercised on a handle whose symbols are not ours. The table's are never called; each
// has its own body so that no two share an address.
#include "hooks/hook_table.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))
#define FAKE_D(sym, base, ver, ptsz) \
  FAKE_EXPORT const char* sym() { return #sym; }
#define FAKE_R(sym, ptsz) \
  FAKE_EXPORT const char* sym() { return #sym; }
OFFLOAD_DRIVER_HOOKS(FAKE_D)
OFFLOAD_RUNTIME_HOOKS(FAKE_R)

FAKE_EXPORT const char* cuFakeNotHooked() { return "cuFakeNotHooked"; }

// The runtime's last-error query, which the shim calls to clear a failure it recovered from
// (the BlockCache's retry on a full device); it counts its calls.
static int g_last_error_calls = 0;
FAKE_EXPORT int cudaGetLastError() {
  ++g_last_error_calls;
  return 0;
}
FAKE_EXPORT int offload_fake_last_error_calls() { return g_last_error_calls; }

// CUPTI's activity registration, as PyTorch's libcupti (loaded locally with libtorch_cuda)
// exports it to Kineto; it counts its calls.
static int g_cupti_register_calls = 0;
FAKE_EXPORT int cuptiActivityRegisterCallbacks(void*, void*) {
  ++g_cupti_register_calls;
  return 0;  // CUPTI_SUCCESS
}
FAKE_EXPORT int offload_fake_cupti_register_calls() { return g_cupti_register_calls; }
