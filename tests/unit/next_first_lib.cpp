// Helper for hook_table_test's RTLD_NEXT test: a library that, like any interposer, looks up
// "the next definition after mine" of a symbol it defines. `lookup` stands for whichever
// dlsym the library's calls bind to (under LD_PRELOAD: liboffload's).
#include <dlfcn.h>

extern "C" __attribute__((visibility("default"))) int offload_test_next_symbol() { return 1; }

extern "C" __attribute__((visibility("default"))) void* offload_test_lookup_next(
    void* (*lookup)(void*, const char*)) {
  void* r = lookup(RTLD_NEXT, "offload_test_next_symbol");
  asm volatile("" ::: "memory");  // no tail call: the lookup's caller must be this library
  return r;
}

extern "C" __attribute__((visibility("default"))) void* offload_test_lookup_next_named(
    void* (*lookup)(void*, const char*), const char* name) {
  void* r = lookup(RTLD_NEXT, name);
  asm volatile("" ::: "memory");  // as above
  return r;
}
