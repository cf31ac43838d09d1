#include "common/log.h"

#include <spdlog/sinks/stdout_sinks.h>

// spdlog in its compiled mode (SPDLOG_COMPILED_LIB), built here: liboffload.so links nothing but
// the C/C++ runtime, and the distribution ships spdlog's library only shared. Its
// implementation is what spdlog's own src/spdlog.cpp compiles, and the sinks' it needs. Every other
// translation unit includes the declarations alone, which costs each about 5 s less to compile
// than the header-only mode (runtime.cpp: 10.7 against 6.0 s). fmt stays header-only.
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

template class spdlog::sinks::stdout_sink_base<spdlog::details::console_mutex>;
template class spdlog::sinks::stderr_sink<spdlog::details::console_mutex>;
// The registry's default logger (never used here, but made) writes to a colour stdout sink.
template class spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;

namespace offload {

spdlog::logger& log() {
  // Never destroyed: the shim's worker may still log while the process runs its exit
  // handlers.
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("offload", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("[offload %l] %v");
    return l;
  }();
  return *logger;
}

void set_log_level(const std::string& level) { log().set_level(spdlog::level::from_str(level)); }

void set_log_origin(int rank) {
  // %P is the process id at each line: a forked child says its own.
  log().set_pattern(rank >= 0 ? "[offload %l] rank " + std::to_string(rank) + " pid %P: %v" : "[offload %l] pid %P: %v");
}

}  // namespace offload
