// Helper for hook_table_test's RTLD_NEXT test: a library the test loads and unloads, so that
// the next definition of its symbol comes and goes.
extern "C" __attribute__((visibility("default"))) int offload_test_late_symbol() { return 3; }
