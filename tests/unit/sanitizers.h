// Which sanitizer a test binary is built under (GCC says it with __SANITIZE_*__, Clang with
// __has_feature): OFFLOAD_TEST_TSAN or OFFLOAD_TEST_ASAN. Tests whose time goes into what the
// sanitizers instrument run fewer seeds, steps or bytes under them.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define OFFLOAD_TEST_TSAN 1
#elif defined(__SANITIZE_ADDRESS__)
#define OFFLOAD_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OFFLOAD_TEST_TSAN 1
#elif __has_feature(address_sanitizer)
#define OFFLOAD_TEST_ASAN 1
#endif
#endif
