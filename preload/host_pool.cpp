#include "host_pool.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/log.h"

extern char** environ;

namespace offload {

PrivatePool::PrivatePool(uint64_t bytes) {
  total_ = pool_total_bytes(bytes, 4096);
  void* p = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return;
  base_ = p;
  table_ = LeaseTable::format(p, total_, 4096, static_cast<uint32_t>(getpid()));
}

PrivatePool::~PrivatePool() {
  if (base_) munmap(base_, total_);
}

std::optional<Extent> PrivatePool::lease(uint64_t bytes, std::string* why) {
  std::lock_guard lock(mu_);
  if (!table_) {
    *why = "no private pool (mapping failed)";
    return std::nullopt;
  }
  auto off = table_->lease(bytes, 1, static_cast<uint32_t>(getpid()));
  if (!off) {
    *why = "private pool full";
    return std::nullopt;
  }
  return Extent{table_->data() + *off, *off, (bytes + kLeaseAlign - 1) / kLeaseAlign * kLeaseAlign};
}

void PrivatePool::release(const Extent& e) {
  std::lock_guard lock(mu_);
  if (table_) table_->release(e.offset, 1);
}

std::string PrivatePool::describe() const {
  return "private pool of " + std::to_string(table_ ? table_->data_bytes() : 0) + " bytes in this process" +
         (pinned_ ? ", pinned" : "");
}

bool PrivatePool::pin(const std::function<bool(void*, uint64_t)>& pin) {
  std::lock_guard lock(mu_);
  if (!pinned_ && table_) pinned_ = pin_in_chunks(table_->data(), table_->data_bytes(), pin);
  return pinned_;
}

std::string find_daemon_binary(const std::string& configured) {
  if (!configured.empty()) return configured;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&find_daemon_binary), &info) && info.dli_fname) {
    std::string lib = info.dli_fname;
    std::string dir = lib.substr(0, lib.rfind('/') == std::string::npos ? 0 : lib.rfind('/'));
    for (const std::string& c : {dir + "/offloadd", dir + "/../bin/offloadd"})
      if (access(c.c_str(), X_OK) == 0) return c;
  }
  const char* path = getenv("PATH");
  std::string p = path ? path : "";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    std::string d = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!d.empty() && access((d + "/offloadd").c_str(), X_OK) == 0) return d + "/offloadd";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return {};
}

DaemonLink::DaemonLink(Settings s, std::string command) : settings_(std::move(s)), command_(std::move(command)) {
  std::string why;
  if (settings_.daemon == "off") {
    usable_ = false;
    failure_ = "OFFLOAD_DAEMON=off";
  } else if (!default_paths(&paths_, &why)) {
    usable_ = false;
    failure_ = why;
  }
}

bool DaemonLink::start_daemon(std::string* why) {
  std::string bin = find_daemon_binary(settings_.daemon_bin);
  if (bin.empty()) {
    *why = "no offloadd binary found (next to liboffload.so, or in PATH; OFFLOAD_DAEMON_BIN names one)";
    return false;
  }
  std::string size = std::to_string(settings_.host_pool_bytes);
  std::string log_path = paths_.dir + "/offloadd.log";
  std::vector<std::string> args = {bin, "--pool-size", size, "--socket", paths_.socket};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;  // our environment without LD_PRELOAD: the daemon needs no shim
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) envp.push_back(*e);
  envp.push_back(nullptr);
  // Double fork: the daemon belongs to no training process, and leaves no zombie behind.
  pid_t child = fork();
  if (child < 0) {
    *why = std::string("fork: ") + strerror(errno);
    return false;
  }
  if (child == 0) {
    setsid();
    if (fork() != 0) _exit(0);
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, 0);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  // Wait for it to listen.
  for (int i = 0; i < 60; ++i) {
    std::string ignored;
    Connection probe;
    if (probe.connect(paths_.socket, &ignored)) return true;
    timespec d{0, 50'000'000};
    nanosleep(&d, nullptr);
  }
  *why = "started " + bin + " but it did not listen on " + paths_.socket + " within 3 s (see " + log_path + ")";
  return false;
}

bool DaemonLink::connect_and_register(std::string* why) {
  if (!client_.connect(paths_.socket, why)) return false;
  proto::Register r{};
  r.pid = static_cast<uint32_t>(getpid());
  r.gpu = -1;
  r.device_budget = 0;
  r.host_limit = 0;
  r.prior_client = client_id_;
  std::snprintf(r.command, sizeof r.command, "%s", command_.c_str());
  auto rep = client_.register_client(r, why);
  if (!rep) {
    client_.connection().close();
    return false;
  }
  if (!mapping_.base() && !mapping_.open(rep->segment, why)) {
    client_.connection().close();
    return false;
  }
  bool reattached = client_id_ && rep->client_id == client_id_;
  if (client_id_ && !reattached)
    log().warn("offloadd did not re-attach client {} (new id {}): leases made before are gone", client_id_,
               rep->client_id);
  client_id_ = rep->client_id;
  fd_.store(client_.connection().fd(), std::memory_order_release);
  log().info("offloadd: client {} of a {}-byte pool (fair share {} bytes){}", client_id_, rep->pool_bytes,
             rep->fair_share, reattached ? ", re-attached" : "");
  return true;
}

bool DaemonLink::poll(int64_t now_ms) {
  std::lock_guard lock(mu_);
  if (!usable_ || client_.connected()) return client_.connected();
  if (now_ms < next_try_ms_) return false;
  std::string why;
  if (connect_and_register(&why)) return true;
  // Nobody listens: start one, once, if allowed; a daemon that was there and went away is
  // reconnected to every second (it may be restarting).
  if (!client_id_ && !tried_start_ && settings_.daemon == "auto") {
    tried_start_ = true;
    std::string start_why;
    if (start_daemon(&start_why) && connect_and_register(&why)) return true;
    failure_ = start_why.empty() ? why : start_why;
    if (!client_id_) {
      usable_ = false;
      return false;
    }
  } else if (!client_id_) {
    failure_ = why;
    usable_ = false;
    return false;
  }
  next_try_ms_ = now_ms + 1000;
  return false;
}

void DaemonLink::push(const proto::Telemetry& t) {
  std::lock_guard lock(mu_);
  if (client_.connected()) client_.telemetry(t);
}

std::optional<Extent> DaemonLink::lease(uint64_t bytes, std::string* why) {
  std::lock_guard lock(mu_);
  auto rep = client_.lease(bytes, why);
  if (!rep) return std::nullopt;
  auto st = static_cast<proto::Status>(rep->status);
  if (st != proto::Status::Ok) {
    *why = std::string("offloadd refused ") + std::to_string(bytes) + " bytes: " + proto::status_name(st);
    return std::nullopt;
  }
  return Extent{mapping_.data() + rep->offset, rep->offset, rep->bytes};
}

void DaemonLink::release(const Extent& e) {
  std::lock_guard lock(mu_);
  std::string why;
  client_.release(e.offset, e.bytes, &why);
}

void DaemonLink::drop_in_child() {
  int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);  // the child's copy only; the parent's connection stays
  mapping_.unmap_in_child();
}

bool DaemonLink::pin(const std::function<bool(void*, uint64_t)>& pin) {
  std::lock_guard lock(mu_);
  if (!pinned_ && mapping_.base()) pinned_ = mapping_.pin_in_chunks(pin);
  return pinned_;
}

std::string DaemonLink::describe() const {
  std::lock_guard lock(mu_);
  if (client_.connected())
    return "offloadd at " + paths_.socket + ", client " + std::to_string(client_id_) + (pinned_ ? ", pinned" : "");
  return "offloadd not connected" + (failure_.empty() ? std::string() : ": " + failure_);
}

}  // namespace offload
