// Helper for hook_table_test's RTLD_NEXT test: the next definition, in a library loaded
// after next_first_lib (its dependency).
extern "C" __attribute__((visibility("default"))) int offload_test_next_symbol() { return 2; }
