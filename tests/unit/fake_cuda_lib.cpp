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

// The stream synchronization and pool trim that the shim's cudaMemPoolTrimTo makes after
// freeing the BlockCache's blocks: each records its calls, the trim how many synchronizations
// came before it.
static int g_sync_calls = 0, g_trim_calls = 0, g_syncs_before_trim = -1;
static void* g_synced[8] = {};
static void* g_trim_pool = nullptr;
static unsigned long g_trim_keep = 0;
FAKE_EXPORT int cudaStreamSynchronize(void* s) {
  if (g_sync_calls < 8) g_synced[g_sync_calls] = s;
  ++g_sync_calls;
  return 0;
}
FAKE_EXPORT int cudaMemPoolTrimTo(void* pool, unsigned long keep) {
  ++g_trim_calls;
  g_syncs_before_trim = g_sync_calls;
  g_trim_pool = pool;
  g_trim_keep = keep;
  return 0;
}
FAKE_EXPORT int offload_fake_sync_calls() { return g_sync_calls; }
FAKE_EXPORT void* offload_fake_synced(int i) { return i >= 0 && i < 8 ? g_synced[i] : nullptr; }
FAKE_EXPORT int offload_fake_trim_calls() { return g_trim_calls; }
FAKE_EXPORT int offload_fake_syncs_before_trim() { return g_syncs_before_trim; }
FAKE_EXPORT void* offload_fake_trim_pool() { return g_trim_pool; }
FAKE_EXPORT unsigned long offload_fake_trim_keep() { return g_trim_keep; }
