#include "core/log.h"

#include <spdlog/sinks/stdout_sinks.h>

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

}  // namespace offload
