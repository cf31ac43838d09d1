// Logging for the shim and tools: spdlog (compiled in log.cpp) to stderr, prefixed "[offload LEVEL]".
// Never called from a hook's fast path; hooks count, the worker reports.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace offload {

spdlog::logger& log();
void set_log_level(const std::string& level);
// The shim's lines: "[offload LEVEL] rank R pid P: ..." (rank when the process is one of a job),
// so that the lines of many ranks and forked workers on one terminal can be told apart.
void set_log_origin(int rank);

}  // namespace offload
