// offloadd's Prometheus endpoint: served from the daemon's one poll loop like every other
// socket, non-blocking, each connection with a deadline, so that idle or slow connections
// (from any local user: the port is on 127.0.0.1) never hold up the clients.
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>

#include "common/clock.h"
#include "common/log.h"
#include "offloadd/service.h"
#include "offload/text.h"
#include "offload_version.h"

namespace offload {
namespace {

// At most this many metrics connections at once; more are closed unanswered (a scraper
// needs one).
constexpr size_t kMaxMetricsConns = 32;
// A request is read up to its blank line, or this many bytes.
constexpr size_t kMaxRequestBytes = 8192;


}  // namespace

void Service::accept_metrics() {
  for (;;) {
    int fd = accept4(metrics_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if ((errno == EMFILE || errno == ENFILE) && refuse_for_descriptors(metrics_fd_, false)) continue;
      return;
    }
    if (metrics_conns_.size() >= kMaxMetricsConns) {
      close(fd);
      continue;
    }
    metrics_conns_[fd].deadline_ms = mono_ms() + opt_.metrics_deadline_ms;
  }
}

void Service::on_metrics(int fd, short revents) {
  auto it = metrics_conns_.find(fd);
  if (it == metrics_conns_.end()) return;
  MetricsConn& m = it->second;
  auto finish = [&] {
    close(fd);
    metrics_conns_.erase(it);
  };
  if (!m.answered) {
    // One request, one answer; the request itself is not needed (any path serves metrics),
    // only its end: answered at its blank line, its size cap, or the peer's half-close.
    char buf[2048];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) return finish();
    m.request.append(buf, static_cast<size_t>(n));
    bool complete = n == 0 || m.request.size() >= kMaxRequestBytes ||
                    m.request.find("\r\n\r\n") != std::string::npos || m.request.find("\n\n") != std::string::npos;
    if (!complete) return;
    std::string body = metrics_text();
    std::string resp = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    m.out.append(resp.data(), resp.size());
    m.answered = true;
    m.request.clear();
  } else if (!(revents & POLLOUT)) {
    return finish();  // hung up before reading its answer
  }
  if (!m.out.flush(fd) || m.out.empty()) finish();
}

void Service::expire_metrics(int64_t now) {
  for (auto it = metrics_conns_.begin(); it != metrics_conns_.end();) {
    if (now < it->second.deadline_ms) {
      ++it;
      continue;
    }
    close(it->first);
    it = metrics_conns_.erase(it);
  }
}

std::string Service::metrics_text() const {
  std::ostringstream m;
  uint64_t used = table_->used_bytes();
  m << "# HELP offload_build_info The running offloadd's version and source commit.\n"
       "# TYPE offload_build_info gauge\n"
    << "offload_build_info{version=\"" << label_escape(OFFLOAD_VERSION) << "\",commit=\"" << label_escape(OFFLOAD_COMMIT)
    << "\"} 1\n";
  m << "# HELP offload_pool_bytes Size of the node's shared pinned host pool.\n# TYPE offload_pool_bytes gauge\n"
    << "offload_pool_bytes " << table_->data_bytes() << "\n"
    << "# HELP offload_pool_used_bytes Bytes of the pool leased to clients.\n# TYPE offload_pool_used_bytes gauge\n"
    << "offload_pool_used_bytes " << used << "\n"
    << "# HELP offload_clients Registered clients.\n# TYPE offload_clients gauge\n"
    << "offload_clients " << clients_.size() << "\n"
    << "# HELP offload_node_gpus GPUs of the node that share the host link (distinct GPUs of the attached "
       "clients, at least the largest local world size they reported).\n# TYPE offload_node_gpus gauge\n"
    << "offload_node_gpus " << node_gpus() << "\n";
  struct Metric {
    const char* name;
    const char* help;
    const char* type;
  };
  const Metric ms[] = {
      {"offload_client_leased_bytes", "Pool bytes leased by the client.", "gauge"},
      {"offload_client_resident_bytes", "Device bytes the client holds for offloadable data (under the hard cap: its ranges' memory).", "gauge"},
      {"offload_client_evicted_bytes", "Bytes copied out to host memory in the last step.", "gauge"},
      {"offload_client_step_seconds", "Last step time.", "gauge"},
      {"offload_client_exposed_stall_seconds", "Host time spent waiting for copies or frees in the last step.", "gauge"},
      {"offload_client_misses_total", "Demand reloads (launches that found data not resident).", "counter"},
  };
  for (const Metric& x : ms) {
    m << "# HELP " << x.name << ' ' << x.help << "\n# TYPE " << x.name << ' ' << x.type << "\n";
    for (auto& [id, c] : clients_) {
      m << x.name << "{client=\"" << id << "\",pid=\"" << c.pid << "\",gpu=\"" << c.gpu << "\",gpu_id=\""
        << label_escape(c.gpu_id) << "\",rank=\"" << (c.rank >= 0 ? std::to_string(c.rank) : std::string())
        << "\",command=\"" << label_escape(c.command) << "\"} ";
      std::string n = x.name;
      if (n == "offload_client_leased_bytes") m << table_->leased_by(id);
      else if (n == "offload_client_resident_bytes") m << c.last.resident_bytes;
      else if (n == "offload_client_evicted_bytes") m << c.last.evicted_bytes;
      else if (n == "offload_client_step_seconds") m << static_cast<double>(c.last.step_ns) / 1e9;
      else if (n == "offload_client_exposed_stall_seconds") m << static_cast<double>(c.last.exposed_stall_ns) / 1e9;
      else m << c.last.misses;
      m << "\n";
    }
  }
  return m.str();
}

}  // namespace offload
