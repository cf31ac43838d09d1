// offloadd checks a new pool against memory before it serves, and binds its socket and
// metrics port before it makes the pool: what cannot work is refused at once, with a
// message, and leaves no segment behind.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/statvfs.h>

#include "it_support.h"
#include "offloadd/resources.h"

namespace offload::it {
namespace {

bool segment_exists(const std::string& name) {
  struct stat st;
  return ::stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

TEST(PoolMemoryIntegration, APoolLargerThanSharedMemoryIsRefusedAtOnce) {
  Daemon d;
  struct statvfs v{};
  ASSERT_EQ(statvfs("/dev/shm", &v), 0);
  const uint64_t too_big = uint64_t{v.f_bavail} * v.f_frsize + (1ull << 30);
  // --no-prefault: without the check the pool would be made sparse and served.
  int64_t t0 = now_ms();
  RunResult r = run_program({OFFLOADD_BIN, "--socket", d.socket(), "--segment", d.segment(), "--pool-size",
                             std::to_string(too_big), "--no-prefault"},
                            d.env(), d.dir(), 10000);
  EXPECT_EQ(r.exit_code(), 1) << describe_status(r.status) << "\n" << r.err;
  EXPECT_LT(now_ms() - t0, 5000);
  EXPECT_NE(r.err.find("does not fit in /dev/shm"), std::string::npos) << r.err;
  EXPECT_FALSE(segment_exists(d.segment())) << "a refused pool left its segment";
  EXPECT_EQ(::access(d.socket().c_str(), F_OK), -1) << "a refused daemon left its socket";
}

TEST(PoolMemoryIntegration, APoolLargerThanMemoryIsRefused) {
  constexpr uint64_t GiB = 1ull << 30;
  MemoryRoom room;
  room.shm_free = 20 * GiB;
  room.mem_available = 5 * GiB;
  EXPECT_NE(pool_room_problem(6 * GiB, room).find("more than the memory available"), std::string::npos);
  EXPECT_EQ(pool_room_problem(4 * GiB, room), "");
  room.mem_available.reset();  // unknown: /dev/shm alone decides
  EXPECT_EQ(pool_room_problem(6 * GiB, room), "");
  EXPECT_NE(pool_room_problem(21 * GiB, room).find("does not fit in /dev/shm"), std::string::npos);
}

TEST(PoolMemoryIntegration, AMetricsPortInUseIsReportedBeforeThePoolIsMade) {
  Daemon d;
  // A port that is taken.
  int taken = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&in), sizeof in), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  socklen_t len = sizeof in;
  ::getsockname(taken, reinterpret_cast<sockaddr*>(&in), &len);
  const std::string port = std::to_string(ntohs(in.sin_port));
  // An unusable segment under the pool's name: whoever looks at the segment first says so.
  int fd = shm_open(("/" + d.segment()).c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  ::close(fd);

  RunResult r = run_program({OFFLOADD_BIN, "--socket", d.socket(), "--segment", d.segment(), "--pool-size",
                             "64MiB", "--no-prefault", "--metrics-port", port},
                            d.env(), d.dir(), 10000);
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_NE(r.err.find("cannot serve metrics on 127.0.0.1:" + port), std::string::npos)
      << "the port must be checked before the segment:\n"
      << r.err;
  ::close(taken);
}

}  // namespace
}  // namespace offload::it
