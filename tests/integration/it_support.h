// Support for the integration tests: real processes (offloadd, offloadctl, the scriptable
// client offload_it_client), started with posix_spawn and always killed and reaped, a
// private temporary directory, raw socket access, and a daemon per test with its own
// socket and shared-memory segment (so that `ctest -j` runs never collide).
//
// The test process never forks without exec'ing right away (posix_spawn): it is safe under
// ThreadSanitizer. Everything here reports failure through return values; the tests turn
// them into gtest assertions.
#pragma once

#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/ipc.h"
#include "offload/protocol.h"

extern char** environ;

namespace offload::it {

inline constexpr uint64_t MiB = 1ull << 20;

inline int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1'000'000;
}

inline std::vector<std::string> split(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> v;
  for (std::string w; in >> w;) v.push_back(w);
  return v;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Polls `cond` every few milliseconds until it holds or `timeout_ms` passes.
template <class F>
bool poll_until(F&& cond, int timeout_ms) {
  int64_t end = now_ms() + timeout_ms;
  for (;;) {
    if (cond()) return true;
    if (now_ms() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// mkdtemp under /tmp; removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/offload-it-XXXXXX";
    if (mkdtemp(tmpl)) path_ = tmpl;
  }
  ~TempDir() {
    if (path_.empty()) return;
    nftw(path_.c_str(), [](const char* p, const struct stat*, int, FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  bool ok() const { return !path_.empty(); }

 private:
  std::string path_;
};

// A child process. stdin/stdout may be pipes to this process (line-oriented commands);
// stderr may go to a file. The destructor kills (SIGKILL) and reaps it if still running.
class Proc {
 public:
  struct Options {
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;  // added to (or replacing in) this process's
    bool pipe_stdin = false;
    bool pipe_stdout = false;
    std::string stdout_file;  // when not a pipe; empty: /dev/null
    std::string stderr_file;  // empty: /dev/null
  };

  Proc() = default;
  Proc(Proc&& o) noexcept { *this = std::move(o); }
  Proc& operator=(Proc&& o) noexcept {
    if (this != &o) {
      kill_and_reap();
      pid_ = o.pid_;
      in_ = o.in_;
      out_ = o.out_;
      buf_ = std::move(o.buf_);
      status_ = o.status_;
      o.pid_ = -1;
      o.in_ = o.out_ = -1;
    }
    return *this;
  }
  ~Proc() { kill_and_reap(); }

  // Starts it; false with *why.
  bool start(const Options& o, std::string* why) {
    kill_and_reap();
    buf_.clear();
    ::signal(SIGPIPE, SIG_IGN);  // a client that died must not take the test with it
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (!o.env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
    }
    for (auto& [k, v] : o.env) envs.push_back(k + "=" + v);
    std::vector<char*> argv, envp;
    for (auto& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : envs) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    int in[2] = {-1, -1}, out[2] = {-1, -1};
    if ((o.pipe_stdin && pipe2(in, O_CLOEXEC) != 0) || (o.pipe_stdout && pipe2(out, O_CLOEXEC) != 0)) {
      *why = std::string("pipe: ") + strerror(errno);
      return false;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (o.pipe_stdin) posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    else posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (o.pipe_stdout) posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    else
      posix_spawn_file_actions_addopen(&fa, 1, o.stdout_file.empty() ? "/dev/null" : o.stdout_file.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, o.stderr_file.empty() ? "/dev/null" : o.stderr_file.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0600);
    // The tests ignore SIGPIPE; their children must not inherit that.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (o.pipe_stdin) ::close(in[0]);
    if (o.pipe_stdout) ::close(out[1]);
    if (rc != 0) {
      if (o.pipe_stdin) ::close(in[1]);
      if (o.pipe_stdout) ::close(out[0]);
      *why = "cannot start " + o.argv[0] + ": " + strerror(rc);
      return false;
    }
    pid_ = pid;
    in_ = o.pipe_stdin ? in[1] : -1;
    out_ = o.pipe_stdout ? out[0] : -1;
    status_.reset();
    return true;
  }

  pid_t pid() const { return pid_; }
  bool running() {
    if (pid_ < 0 || status_) return false;
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) status_ = st;
    return r == 0;
  }

  // Waits up to timeout_ms for it to exit; its wait status, or nullopt if still running.
  std::optional<int> wait(int timeout_ms) {
    if (pid_ < 0) return std::nullopt;
    poll_until([&] { return !running(); }, timeout_ms);
    return status_;
  }

  // Sends a signal and reaps it; the wait status.
  std::optional<int> kill_and_wait(int sig, int timeout_ms = 10000) {
    if (running()) ::kill(pid_, sig);
    return wait(timeout_ms);
  }

  void kill_and_reap() {
    if (pid_ >= 0 && !status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      status_ = st;
    }
    if (in_ >= 0) ::close(in_);
    if (out_ >= 0) ::close(out_);
    in_ = out_ = -1;
  }

  // Line protocol with offload_it_client: sends `line`, returns its one-line answer (or
  // "<no answer: ...>" after timeout_ms or if it died).
  std::string cmd(const std::string& line, int timeout_ms = 20000) {
    std::string l = line + "\n";
    if (in_ < 0 || ::write(in_, l.data(), l.size()) != static_cast<ssize_t>(l.size()))
      return "<no answer: cannot write to the client>";
    return read_line(timeout_ms);
  }

  std::string read_line(int timeout_ms) {
    int64_t end = now_ms() + timeout_ms;
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      int left = static_cast<int>(end - now_ms());
      if (left <= 0) return "<no answer: timeout>";
      pollfd p{out_, POLLIN, 0};
      int r = ::poll(&p, 1, left);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return "<no answer: timeout>";
      char b[4096];
      ssize_t n = ::read(out_, b, sizeof b);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return "<no answer: the client exited>";
      buf_.append(b, static_cast<size_t>(n));
    }
  }

  // Sends a line without waiting for the answer (read it later with try_line/read_line).
  bool send_line(const std::string& line) {
    std::string l = line + "\n";
    return in_ >= 0 && ::write(in_, l.data(), l.size()) == static_cast<ssize_t>(l.size());
  }

  // A complete answer line if one is there already.
  std::optional<std::string> try_line() {
    if (buf_.find('\n') == std::string::npos) {
      pollfd p{out_, POLLIN, 0};
      if (out_ < 0 || ::poll(&p, 1, 0) <= 0) return std::nullopt;
    }
    std::string l = read_line(1000);
    if (l.rfind("<no answer", 0) == 0 && l != "<no answer: the client exited>") return std::nullopt;
    return l;
  }

  // Closes its stdin (a client then exits on its own).
  void close_stdin() {
    if (in_ >= 0) ::close(in_);
    in_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buf_;
  std::optional<int> status_;
};

inline std::string describe_status(std::optional<int> st) {
  if (!st) return "still running";
  if (WIFEXITED(*st)) return "exit " + std::to_string(WEXITSTATUS(*st));
  if (WIFSIGNALED(*st)) return std::string("signal ") + strsignal(WTERMSIG(*st));
  return "status " + std::to_string(*st);
}

inline bool exited_with(std::optional<int> st, int code) { return st && WIFEXITED(*st) && WEXITSTATUS(*st) == code; }

// Runs a program to completion, capturing stdout and stderr.
struct RunResult {
  std::optional<int> status;
  std::string out, err;
  int exit_code() const { return status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1; }
};

inline RunResult run_program(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                             const std::string& scratch_dir, int timeout_ms = 20000) {
  static std::atomic<int> n{0};
  std::string base = scratch_dir + "/run" + std::to_string(n++);
  RunResult r;
  Proc p;
  std::string why;
  Proc::Options o;
  o.argv = argv;
  o.env = env;
  o.stdout_file = base + ".out";
  o.stderr_file = base + ".err";
  if (!p.start(o, &why)) {
    r.err = why;
    return r;
  }
  r.status = p.wait(timeout_ms);
  if (!r.status) p.kill_and_reap();
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  ::unlink((base + ".out").c_str());
  ::unlink((base + ".err").c_str());
  return r;
}

// --- raw protocol access ---------------------------------------------------------------

inline int raw_connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_bytes(int fd, const void* p, size_t n) { return offload::send_all(fd, p, n); }
inline bool send_bytes(int fd, const std::vector<unsigned char>& v) { return send_bytes(fd, v.data(), v.size()); }

template <class T>
std::vector<unsigned char> frame_bytes(proto::MsgType type, uint64_t seq, const T& payload) {
  return proto::encode(type, seq, payload);
}

// A header with any fields, followed by `payload_len` bytes of `fill`.
inline std::vector<unsigned char> raw_frame(uint32_t magic, uint16_t major, uint16_t minor, uint16_t type,
                                            uint32_t length, size_t payload_len, unsigned char fill = 0) {
  proto::FrameHeader h{magic, major, minor, type, 0, length, 7};
  std::vector<unsigned char> v(sizeof h + payload_len, fill);
  std::memcpy(v.data(), &h, sizeof h);
  return v;
}

struct Frame {
  proto::FrameHeader h;
  std::vector<unsigned char> payload;
};

// What came back on a raw connection: the frames, and whether the daemon closed it.
struct Answer {
  std::vector<Frame> frames;
  bool closed = false;
  bool malformed = false;

  bool has_error(proto::Status st) const {
    for (auto& f : frames) {
      if (f.h.type != static_cast<uint16_t>(proto::MsgType::Error)) continue;
      proto::Error e{};
      if (proto::read_payload(f.payload.data(), f.payload.size(), &e) && e.status == static_cast<uint32_t>(st))
        return true;
    }
    return false;
  }
  std::string error_message() const {
    for (auto& f : frames) {
      proto::Error e{};
      if (f.h.type == static_cast<uint16_t>(proto::MsgType::Error) &&
          proto::read_payload(f.payload.data(), f.payload.size(), &e))
        return e.message;
    }
    return {};
  }
  std::string describe() const {
    std::string s = std::to_string(frames.size()) + " frames [";
    for (auto& f : frames) s += " type " + std::to_string(f.h.type);
    s += " ]";
    if (!error_message().empty()) s += " error '" + error_message() + "'";
    return s + (closed ? ", closed" : ", still open") + (malformed ? ", malformed" : "");
  }
};

// Reads until `want_frames` frames came, the peer closed, or `timeout_ms` passed.
inline Answer read_answer(int fd, size_t want_frames, int timeout_ms) {
  Answer a;
  proto::FrameReader reader;
  int64_t end = now_ms() + timeout_ms;
  for (;;) {
    Frame f;
    while (reader.next(&f.h, &f.payload)) a.frames.push_back(f);
    if (reader.failed()) {
      a.malformed = true;
      return a;
    }
    if (a.frames.size() >= want_frames) return a;
    int left = static_cast<int>(end - now_ms());
    if (left <= 0) return a;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return a;
    unsigned char buf[65536];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      a.closed = true;
      return a;
    }
    reader.feed(buf, static_cast<size_t>(n));
  }
}

// --- a daemon of the test's own --------------------------------------------------------

struct StatusView {
  proto::StatusHead head{};
  std::vector<proto::ClientStatus> clients;
  const proto::ClientStatus* by_pid(pid_t pid) const {
    for (auto& c : clients)
      if (c.pid == static_cast<uint32_t>(pid)) return &c;
    return nullptr;
  }
};

class Daemon {
 public:
  // A private directory (0700) holding XDG_RUNTIME_DIR, the socket and the logs; a
  // segment name no other test (or test run) uses.
  Daemon() {
    static std::atomic<int> n{0};
    segment_ = "offload-it-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    if (dir_.ok()) {
      socket_ = dir_.path() + "/offloadd.sock";
      xdg_ = dir_.path() + "/xdg";
      mkdir(xdg_.c_str(), 0700);
    }
  }
  ~Daemon() {
    proc_.kill_and_reap();
    shm_unlink(("/" + segment_).c_str());
  }

  // Starts offloadd and waits until it answers a status query.
  bool start(const std::vector<std::string>& extra, std::string* why, int timeout_ms = 20000) {
    if (!dir_.ok()) {
      *why = "no temporary directory";
      return false;
    }
    Proc::Options o;
    o.argv = {OFFLOADD_BIN, "--socket", socket_, "--log-level", "info"};
    if (pass_segment_) o.argv.insert(o.argv.end(), {"--segment", segment_});
    bool has_size = false;
    for (auto& e : extra) has_size |= e == "--pool-size";
    if (!has_size) o.argv.insert(o.argv.end(), {"--pool-size", "256MiB", "--no-prefault"});
    o.argv.insert(o.argv.end(), extra.begin(), extra.end());
    o.env = env();
    o.stderr_file = log_path();
    if (!proc_.start(o, why)) return false;
    std::string last;
    bool up = poll_until(
        [&] {
          if (!proc_.running()) return true;
          StatusView s;
          return status(&s, &last);
        },
        timeout_ms);
    if (!proc_.running()) {
      *why = "offloadd exited (" + describe_status(proc_.wait(0)) + "); its log:\n" + log();
      return false;
    }
    if (!up) {
      *why = "offloadd did not answer within " + std::to_string(timeout_ms) + " ms (" + last + "); its log:\n" + log();
      return false;
    }
    return true;
  }

  bool status(StatusView* s, std::string* why) const {
    DaemonClient c;
    if (!c.connect(socket_, why)) return false;
    return c.status(&s->head, &s->clients, why);
  }

  // SIGTERM, and its exit status (0 expected: a sanitizer report makes it non-zero).
  std::optional<int> stop() { return proc_.kill_and_wait(SIGTERM); }

  // Start without --segment: offloadd names its pool itself, from the socket (what the
  // destructor removes is that name).
  void use_default_segment() {
    pass_segment_ = false;
    segment_ = default_segment_name(socket_);
  }

  // Runs with `other`'s XDG_RUNTIME_DIR (its own socket still): two daemons of one user
  // whose default paths are the same.
  void share_runtime_dir(const Daemon& other) { xdg_ = other.xdg_; }

  Proc& proc() { return proc_; }
  pid_t pid() const { return proc_.pid(); }
  const std::string& socket() const { return socket_; }
  const std::string& segment() const { return segment_; }
  const std::string& dir() const { return dir_.path(); }
  std::string log_path() const { return dir_.path() + "/offloadd.log"; }
  std::string log() const { return read_file(log_path()); }
  std::map<std::string, std::string> env() const { return {{"XDG_RUNTIME_DIR", xdg_}, {"OFFLOAD_SOCKET", ""}}; }

  // An offload_it_client speaking to this daemon.
  bool client(Proc* p, std::string* why, const std::string& command = "it-client", int gpu = 0,
              const std::vector<std::string>& extra = {}) const {
    Proc::Options o;
    o.argv = {POOL_CLIENT_BIN, "--socket", socket_, "--command", command, "--gpu", std::to_string(gpu)};
    o.argv.insert(o.argv.end(), extra.begin(), extra.end());
    o.pipe_stdin = o.pipe_stdout = true;
    o.env = env();
    o.stderr_file = dir_.path() + "/client.log";
    return p->start(o, why);
  }

  RunResult offloadctl(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {OFFLOADCTL_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_program(argv, env(), dir_.path());
  }

 private:
  TempDir dir_;
  std::string socket_, segment_, xdg_;
  bool pass_segment_ = true;
  Proc proc_;
};

}  // namespace offload::it
