#include "host_pool.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "offload/text.h"

extern char** environ;

namespace offload {
namespace {

// Closes every descriptor from `first` up. Async-signal-safe.
void close_from(int first) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, first, ~0u, 0) == 0) return;
#endif
  rlimit r{};
  long top = getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY ? static_cast<long>(r.rlim_cur) : 65536;
  for (long fd = first; fd < top; ++fd) close(static_cast<int>(fd));
}

// In the forked child, before exec: the daemon outlives the job, so it takes nothing of the
// thread that starts it (a worker thread blocks every signal: SIGTERM would do nothing), of
// its descriptors (a job runner waiting for EOF on a pipe would wait for the daemon) or of
// its working directory (an unmount would fail). Async-signal-safe.
void reset_for_exec(int stdin_fd, int log_fd) {
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (stdin_fd >= 0) dup2(stdin_fd, 0);
  if (log_fd >= 0) {
    dup2(log_fd, 1);
    dup2(log_fd, 2);
  }
  close_from(3);
  if (chdir("/") != 0) {
    // Stays where it was: still a daemon that works.
  }
}

}  // namespace

AttachInfo attach_info_from_env(int gpu, uint64_t budget, std::string gpu_id,
                                const std::function<const char*(const char*)>& get) {
  AttachInfo a;
  a.gpu = gpu;
  a.device_budget = budget;
  a.gpu_id = std::move(gpu_id);
  a.rank = env_int(get("RANK"), 0, INT32_MAX).value_or(-1);
  a.local_rank = env_int(get("LOCAL_RANK"), 0, INT32_MAX).value_or(-1);
  a.local_world = env_int(get("LOCAL_WORLD_SIZE"), 1, proto::kMaxLocalWorld).value_or(0);
  return a;
}

AttachInfo attach_info_from_env(int gpu, uint64_t budget, std::string gpu_id) {
  return attach_info_from_env(gpu, budget, std::move(gpu_id), [](const char* k) { return getenv(k); });
}

bool HostPool::grid(uint64_t bytes, uint64_t chunk) {
  if (!chunk) return false;
  if (!pin_chunk_) pin_chunk_ = chunk;
  if (chunk != pin_chunk_) return false;  // another grid would overlap registrations
  const uint64_t chunks = (bytes + chunk - 1) / chunk;
  if (chunk_pinned_.size() != chunks) chunk_pinned_.assign(chunks, false);
  return true;
}

bool HostPool::pin_chunk(unsigned char* data, uint64_t bytes, uint64_t c, const PinFn& pin) {
  if (chunk_pinned_[c]) return true;
  const uint64_t n = std::min(pin_chunk_, bytes - c * pin_chunk_);
  if (!pin(data + c * pin_chunk_, n)) return false;
  chunk_pinned_[c] = true;
  pinned_bytes_ += n;
  return true;
}

bool HostPool::pin_extent(const Extent& e, const PinFn& pin, uint64_t chunk) {
  // The area first: DaemonLink's lock is taken before pin_mu_ (describe holds both), never after.
  const auto [data, bytes] = data_area();
  std::lock_guard lock(pin_mu_);
  if (!data || e.bytes == 0 || e.offset >= bytes || !grid(bytes, chunk)) return false;
  const uint64_t end = std::min(bytes, e.offset + e.bytes);
  bool all = true;
  for (uint64_t c = e.offset / chunk; c * chunk < end; ++c) all = pin_chunk(data, bytes, c, pin) && all;
  return all;
}

uint64_t HostPool::pinned_bytes() const {
  std::lock_guard lock(pin_mu_);
  return pinned_bytes_;
}

std::string HostPool::pinned_note() const {
  const uint64_t b = pinned_bytes();
  return b ? ", " + std::to_string(b >> 20) + " MiB pinned" : std::string();
}

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
         pinned_note();
}

std::pair<unsigned char*, uint64_t> PrivatePool::data_area() {
  if (!table_) return {nullptr, 0};
  return {table_->data(), table_->data_bytes()};
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
    reset_for_exec(null, fd);
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

int DaemonLink::first_register_wait_ms() const {
  // 1 s per GiB of the pool we would start beside the usual 5: making host memory took
  // 0.3-0.5 s/GiB on the H200's host (docs/results.md, "The first step waits for host memory"),
  // and a client that gave up at 5 s pinned a private pool of that size beside the daemon's.
  const uint64_t gib = settings_.host_pool_bytes >> 30;
  return static_cast<int>(std::min<uint64_t>(5000 + 1000 * gib, 180'000));
}

bool DaemonLink::connect_and_register(std::string* why) {
  if (!client_.connect(paths_.socket, why)) return false;
  proto::Register r{};
  r.pid = static_cast<uint32_t>(getpid());
  r.gpu = -1;
  r.device_budget = 0;
  r.host_limit = 0;
  r.prior_client = client_id_;
  copy_utf8(r.command, sizeof r.command, command_);
  auto rep = client_.register_client(r, why, client_id_ ? 5000 : first_register_wait_ms());
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
  if (settings_.host_pool_set && rep->pool_bytes < settings_.host_pool_bytes && !pool_short_) {
    // The running daemon was started with a smaller pool (by a process without
    // OFFLOAD_HOST_POOL, or with another value): ours sizes nothing.
    pool_short_ = true;
    log().warn("offloadd's pool is {} bytes, less than OFFLOAD_HOST_POOL={} asks for: it was started "
               "earlier with that size. To have the larger pool, stop it (`offloadctl stop`) while no "
               "process uses it; the next process starts one of OFFLOAD_HOST_POOL",
               rep->pool_bytes, settings_.host_pool_bytes);
  }
  if (attach_info_) {
    // A restarted daemon knows nothing of our GPU: tell it again. Failing that is no reason
    // to give up the connection (the pool works without it).
    std::string attach_why;
    if (!send_attach(&attach_why) && client_.connected() && !said_no_attach_) {
      said_no_attach_ = true;
      log().info("offloadd: {}", attach_why);
    }
    if (!client_.connected()) {
      *why = attach_why;
      return false;
    }
  }
  return true;
}

std::optional<NodeShare> DaemonLink::send_attach(std::string* why) {
  const AttachInfo& i = *attach_info_;
  proto::Attach a{};
  a.gpu = i.gpu;
  a.rank = i.rank;
  a.local_rank = i.local_rank;
  a.local_world = i.local_world;
  a.device_budget = i.device_budget;
  std::snprintf(a.gpu_id, sizeof a.gpu_id, "%s", i.gpu_id.c_str());
  share_.reset();  // an answer from before (another daemon, other info) no longer holds
  auto rep = client_.attach(a, why);
  if (!rep) return std::nullopt;
  auto st = static_cast<proto::Status>(rep->status);
  if (st != proto::Status::Ok) {
    *why = std::string("offloadd refused the attach: ") + proto::status_name(st);
    return std::nullopt;
  }
  NodeShare s;
  s.gpus = rep->gpus;
  s.fair_share = rep->fair_share;
  s.h2d = static_cast<double>(rep->link.h2d_bps) / 1e9;
  s.d2h = static_cast<double>(rep->link.d2h_bps) / 1e9;
  s.both = static_cast<double>(rep->link.both_bps) / 1e9;
  share_ = s;
  return s;
}

std::optional<NodeShare> DaemonLink::attach(const AttachInfo& info, std::string* why) {
  std::lock_guard lock(mu_);
  attach_info_ = info;
  if (!client_.connected()) {
    *why = "not connected to offloadd (the attach is sent when it connects)";
    return std::nullopt;
  }
  return send_attach(why);
}

std::optional<NodeShare> DaemonLink::last_share() const {
  std::lock_guard lock(mu_);
  return share_;
}

bool DaemonLink::poll(int64_t now_ms) {
  std::lock_guard lock(mu_);
  const bool c = poll_locked(now_ms);
  up_.store(client_.connected(), std::memory_order_release);
  return c;
}

bool DaemonLink::poll_locked(int64_t now_ms) {
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
  // The daemon's word is checked: an extent outside the mapping would send our copies into
  // whatever memory lies past it.
  if (rep->bytes < bytes || !mapping_.holds(rep->offset, rep->bytes)) {
    *why = "offloadd leased [" + std::to_string(rep->offset) + ", +" + std::to_string(rep->bytes) + ") for " +
           std::to_string(bytes) + " bytes, outside its pool of " + std::to_string(mapping_.data_bytes()) +
           " bytes: refused";
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
  up_.store(false, std::memory_order_relaxed);
  int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);  // the child's copy only; the parent's connection stays
  mapping_.unmap_in_child();
}

ChunkSource::Lent LinkChunks::lend(uint64_t bytes, bool) {
  if (!link_.up()) return {};  // never waits for a reconnect holding the link's lock
  std::string why;
  std::optional<Extent> e = link_.lease(bytes, &why);
  if (!e) {
    if (!refused_said_.exchange(true))
      log().info("offloadd lends no more host memory ({}): evicted bytes go to this process's own, made as needed", why);
    return {};
  }
  if (!lent_said_.exchange(true)) log().info("evicted bytes go to offloadd's host pool first ({})", link_.describe());
  return {e->host, false};
}

std::pair<unsigned char*, uint64_t> DaemonLink::data_area() {
  std::lock_guard lock(mu_);
  if (!mapping_.base()) return {nullptr, 0};
  return {mapping_.data(), mapping_.data_bytes()};
}

std::string DaemonLink::describe() const {
  std::lock_guard lock(mu_);
  if (client_.connected())
    return "offloadd at " + paths_.socket + ", client " + std::to_string(client_id_) + pinned_note();
  return "offloadd not connected" + (failure_.empty() ? std::string() : ": " + failure_);
}

}  // namespace offload
