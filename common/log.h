// Logging for the shim and tools: spdlog (compiled in log.cpp) to stderr, prefixed "[offload]".
// Never called from a hook's fast path; hooks count, the worker reports.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace offload {

spdlog::logger& log();
void set_log_level(const std::string& level);

}  // namespace offload
