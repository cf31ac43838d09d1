// The offloadd a shim starts (DaemonLink, OFFLOAD_DAEMON=auto) takes nothing of the thread
// and the job that start it: it stops on SIGTERM although the starting thread blocks every
// signal, it holds none of the job's descriptors (a runner waiting for EOF on a pipe would
// wait for the daemon), and it runs in "/".
#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdlib>

#include "host_pool.h"
#include "it_support.h"

namespace offload::it {
namespace {

// A field of /proc/PID/status, as a number read in hex; nullopt if absent.
std::optional<unsigned long long> status_mask(pid_t pid, const std::string& key) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1), nullptr, 16);
  return std::nullopt;
}

bool pid_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

TEST(DaemonStartIntegration, AStartedDaemonTakesNoSignalMaskDescriptorOrDirectory) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string xdg = dir.path() + "/xdg", socket = dir.path() + "/offloadd.sock";
  ASSERT_EQ(mkdir(xdg.c_str(), 0700), 0);
  setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
  setenv("OFFLOAD_SOCKET", socket.c_str(), 1);
  Settings s;
  s.daemon = "auto";
  s.daemon_bin = OFFLOADD_BIN;
  s.host_pool_bytes = 64ull << 20;

  // What a job and a shim's worker thread hand down: a pipe without close-on-exec, an
  // ignored SIGHUP, every signal blocked.
  int job_pipe[2];
  ASSERT_EQ(pipe(job_pipe), 0);
  struct sigaction ign{}, old_hup{};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGHUP, &ign, &old_hup);
  sigset_t all, old_mask;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  auto link = std::make_unique<DaemonLink>(s, "daemon-start-test");
  bool up = false;
  for (int i = 0; i < 100 && !up; ++i) {
    up = link->poll(int64_t{i} * 1000);
    if (!up) usleep(20000);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  ASSERT_TRUE(up) << link->failure();

  DaemonClient c;
  std::string why;
  proto::StatusHead head{};
  std::vector<proto::ClientStatus> clients;
  ASSERT_TRUE(c.connect(socket, &why)) << why;
  ASSERT_TRUE(c.status(&head, &clients, &why)) << why;
  const pid_t pid = static_cast<pid_t>(head.daemon_pid);
  ASSERT_GT(pid, 0);
  c.connection().close();

  EXPECT_EQ(status_mask(pid, "SigBlk").value_or(~0ull), 0ull) << "the daemon inherited a blocked signal mask";
  EXPECT_EQ(status_mask(pid, "SigIgn").value_or(~0ull) & 1ull, 0ull) << "the daemon inherited an ignored SIGHUP";
  char cwd[4096] = {};
  ASSERT_GT(readlink(("/proc/" + std::to_string(pid) + "/cwd").c_str(), cwd, sizeof cwd - 1), 0);
  EXPECT_STREQ(cwd, "/");
  // The job's end of the pipe closes: its reader sees EOF, the daemon holds no copy.
  ::close(job_pipe[1]);
  pollfd p{job_pipe[0], POLLIN, 0};
  char b;
  EXPECT_TRUE(::poll(&p, 1, 2000) == 1 && ::read(job_pipe[0], &b, 1) == 0) << "the daemon holds the job's pipe";
  ::close(job_pipe[0]);

  link.reset();
  ::kill(pid, SIGTERM);
  bool stopped = poll_until([&] { return !pid_alive(pid); }, 5000);
  EXPECT_TRUE(stopped) << "SIGTERM did not stop the daemon";
  if (!stopped) ::kill(pid, SIGKILL);
  poll_until([&] { return !pid_alive(pid); }, 5000);
  shm_unlink(("/" + default_segment_name(socket)).c_str());
  unsetenv("OFFLOAD_SOCKET");
}

}  // namespace
}  // namespace offload::it
