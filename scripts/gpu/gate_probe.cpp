// Whether an access grant (cuMemSetAccess) is cheap when the copies to the host are held at a gate
// for it. A grant takes about 0.7 ms while a device-to-host copy runs and about 0.05 ms otherwise
// (load_probe.cpp), and a copy out queued behind a wait does not slow it. Here a loader thread keeps
// copies out queued in chunks, each behind a wait on a gate word in mapped host memory
// (cuStreamWaitValue32) and between two counters the stream writes (passed, done). The main thread
// then maps a 64 MiB piece and grants it three ways: with the gate open; with the gate closed
// around the grant; with the gate closed and the chunks already past it finished (drained) before
// the grant. It prints each one's cost and the copies' rate meanwhile, against copies of 64 MiB with
// no gate, and the host's cost of queueing a chunk with its stream operations; and what making a
// handle costs with the gate open and closed; and how deep a stream may be queued before queueing
// one more chunk blocks the host. On the GPU machine:
//   g++ -std=c++20 -O2 -I/usr/local/cuda/include scripts/gpu/gate_probe.cpp -o /tmp/gate_probe
//     -L/usr/local/cuda/lib64/stubs -lcuda -pthread && /tmp/gate_probe
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = "?";
  cuGetErrorName(r, &s);
  std::fprintf(stderr, "%s: %s\n", what, s);
  std::exit(1);
}
#define CK(x) check((x), #x)

constexpr size_t kGiB = 1ull << 30, kMiB = 1ull << 20, kPiece = 64 * kMiB;

static double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Words {  // in mapped host memory; each on a line of its own
  volatile uint32_t gate;
  char pad0[60];
  volatile uint32_t passed;
  char pad1[60];
  volatile uint32_t done;
};

struct Probe {
  CUcontext ctx = nullptr;
  CUmemAllocationProp prop = {};
  CUmemAccessDesc acc = {};
  CUstream d2h = nullptr;
  CUdeviceptr big = 0, va = 0, words_dev = 0;
  void* host = nullptr;
  Words* w = nullptr;
  CUmemGenericAllocationHandle piece = 0;

  Probe() {
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuStreamCreate(&d2h, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc(&big, kGiB));
    CK(cuMemHostAlloc(&host, kGiB, 0));
    void* page = nullptr;
    CK(cuMemHostAlloc(&page, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    CK(cuMemHostGetDevicePointer(&words_dev, page, 0));
    w = static_cast<Words*>(page);
    w->gate = 1;
    w->passed = 0;
    w->done = 0;
    CK(cuMemAddressReserve(&va, kPiece, 0, 0, 0));
    CK(cuMemCreate(&piece, kPiece, &prop, 0));
  }
  CUdeviceptr dev_of(volatile uint32_t* p) const {
    return words_dev + CUdeviceptr(reinterpret_cast<volatile char*>(p) - reinterpret_cast<volatile char*>(w));
  }

  // Copies out of `chunk` bytes kept about `depth` deep until `stop`; gated: each behind the gate.
  struct Load {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> queued{0};
    double enqueue_us = 0;  // the host's time to queue one chunk with its operations (median)
    double deep_us = 0;     // the same once `depth` chunks were queued ahead (median)
    std::thread t;
  };
  void start(Load& l, size_t chunk, bool gated, uint32_t depth) {
    w->gate = 1;
    w->passed = 0;
    w->done = 0;
    l.t = std::thread([this, &l, chunk, gated, depth] {
      CK(cuCtxSetCurrent(ctx));
      std::vector<double> q;
      for (uint32_t i = 1; !l.stop.load(std::memory_order_relaxed); ++i) {
        while (i - w->done > depth && !l.stop.load(std::memory_order_relaxed)) std::this_thread::yield();
        const size_t off = (size_t(i) * chunk) % kGiB;
        const double t0 = now_us();
        if (gated) {
          CK(cuStreamWaitValue32(d2h, dev_of(&w->gate), 1, CU_STREAM_WAIT_VALUE_EQ));
          CK(cuStreamWriteValue32(d2h, dev_of(&w->passed), i, CU_STREAM_WRITE_VALUE_DEFAULT));
        }
        CK(cuMemcpyDtoHAsync(static_cast<char*>(host) + off, big + off, chunk, d2h));
        CK(cuStreamWriteValue32(d2h, dev_of(&w->done), i, CU_STREAM_WRITE_VALUE_DEFAULT));
        q.push_back(now_us() - t0);
        l.queued.store(i);
      }
      l.enqueue_us = median(q);
      if (q.size() > depth) l.deep_us = median(std::vector<double>(q.begin() + depth, q.end()));
    });
  }
  void stop(Load& l) {
    l.stop = true;
    l.t.join();
    w->gate = 1;
    CK(cuStreamSynchronize(d2h));
  }

  struct Costs {
    double grant, drain, total, gbs;
    int timeouts;
  };
  // A handle made (64 and 96 MiB in turn, so that freed memory of the size asked is not at hand)
  // and released, with the gate open or closed and drained: the median of the makes.
  double measure_create(int n, bool closed) {
    std::vector<double> c;
    for (int i = 0; i < n; ++i) {
      const size_t bytes = (i % 2 ? 96 : 64) * kMiB;
      if (closed) {
        w->gate = 0;
        const double t0 = now_us();
        while (w->done != w->passed && now_us() - t0 < 20000) {
        }
      }
      CUmemGenericAllocationHandle h;
      const double t0 = now_us();
      CK(cuMemCreate(&h, bytes, &prop, 0));
      c.push_back(now_us() - t0);
      if (closed) w->gate = 1;
      CK(cuMemRelease(h));
      const double pause = now_us() + 1000;
      while (now_us() < pause) {
      }
    }
    return median(c);
  }
  // mode 0: the gate left open; 1: closed around the grant; 2: closed, drained, granted.
  Costs measure(int n, int mode, size_t chunk) {
    std::vector<double> g, d, t;
    int timeouts = 0;
    const uint32_t done0 = w->done;
    const double start = now_us();
    for (int i = 0; i < n; ++i) {
      CK(cuMemMap(va, kPiece, 0, piece, 0));
      const double t0 = now_us();
      double t1 = t0;
      if (mode >= 1) w->gate = 0;
      if (mode == 2) {
        while (w->done != w->passed) {
          if (now_us() - t0 > 20000) {
            ++timeouts;
            break;
          }
        }
        t1 = now_us();
      }
      CK(cuMemSetAccess(va, kPiece, &acc, 1));
      const double t2 = now_us();
      if (mode >= 1) w->gate = 1;
      CK(cuMemUnmap(va, kPiece));
      g.push_back(t2 - t1), d.push_back(t1 - t0), t.push_back(t2 - t0);
      const double pause = now_us() + 1000;  // the copies run on in between
      while (now_us() < pause) {
      }
    }
    const double secs = (now_us() - start) / 1e6;
    const double gbs = chunk ? double(w->done - done0) * double(chunk) / secs / 1e9 : 0;
    return {median(g), median(d), median(t), gbs, timeouts};
  }
};

int main() {
  Probe p;
  std::printf("| copies out | queueing a chunk, us | gate open: grant us (GB/s) | closed: grant us (GB/s) | "
              "closed and drained: drain us, grant us, both (GB/s) | drains over 20 ms |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  {
    const auto c = p.measure(40, 0, 0);
    std::printf("| none | - | %.1f | - | - | - |\n", c.grant);
    std::printf("<!-- no copies: a handle made in %.1f us -->\n", p.measure_create(20, false));
  }
  struct Case {
    size_t chunk;
    bool gated;
    uint32_t depth;
  };
  const Case cases[] = {{64 * kMiB, false, 8}, {64 * kMiB, true, 8}, {32 * kMiB, true, 16},
                        {8 * kMiB, true, 64},  {4 * kMiB, true, 64}, {2 * kMiB, true, 128}};
  for (const Case& cs : cases) {
    Probe::Load l;
    p.start(l, cs.chunk, cs.gated, cs.depth);
    const double warm = now_us() + 20000;
    while (now_us() < warm) {
    }
    const auto open = p.measure(40, 0, cs.chunk);
    Probe::Costs closed{}, drained{};
    if (cs.gated) closed = p.measure(40, 1, cs.chunk), drained = p.measure(40, 2, cs.chunk);
    const double make_open = p.measure_create(20, false), make_closed = cs.gated ? p.measure_create(20, true) : 0;
    p.stop(l);
    std::printf("<!-- %zu MiB%s: a handle made in %.1f us with the gate open, %.1f closed and drained -->\n",
                cs.chunk / kMiB, cs.gated ? ", gated" : "", make_open, make_closed);
    char name[64];
    std::snprintf(name, sizeof name, "%zu MiB each%s", cs.chunk / kMiB, cs.gated ? ", gated" : "");
    if (!cs.gated) {
      std::printf("| %s | %.1f | %.1f (%.1f) | - | - | - |\n", name, l.enqueue_us, open.grant, open.gbs);
      continue;
    }
    std::printf("| %s | %.1f | %.1f (%.1f) | %.1f (%.1f) | %.1f, %.1f, %.1f (%.1f) | %d |\n", name, l.enqueue_us,
                open.grant, open.gbs, closed.grant, closed.gbs, drained.drain, drained.grant, drained.total,
                drained.gbs, drained.timeouts);
    std::fflush(stdout);
  }
  // How many operations a stream holds before queueing one more blocks the host: gated 4 MiB
  // chunks (four operations each) kept deeper and deeper ahead of the link, no grants.
  std::printf("\n| chunks ahead (operations) | queueing a chunk, us (median, once that deep) | GB/s |\n|---:|---:|---:|\n");
  for (uint32_t depth : {16u, 64u, 256u, 1024u, 4096u}) {
    Probe::Load l;
    p.start(l, 4 * kMiB, true, depth);
    const double t0 = now_us() + 400000;  // 4096 chunks are 16 GiB, about 0.3 s of the link
    while (now_us() < t0) {
    }
    const uint32_t d0 = p.w->done;
    const double t1 = now_us() + 200000;
    while (now_us() < t1) {
    }
    const double gbs = double(p.w->done - d0) * double(4 * kMiB) / 0.2 / 1e9;
    p.stop(l);
    std::printf("| %u (%u) | %.1f | %.1f |\n", depth, 4 * depth, l.deep_us, gbs);
    std::fflush(stdout);
  }
  // The copies' rate with no grants at all, for the link's own figure.
  for (size_t chunk : {64 * kMiB, 4 * kMiB}) {
    for (bool gated : {false, true}) {
      Probe::Load l;
      p.start(l, chunk, gated, chunk == 64 * kMiB ? 8 : 64);
      const double t0 = now_us() + 20000;
      while (now_us() < t0) {
      }
      const uint32_t d0 = p.w->done;
      const double t1 = now_us() + 200000;
      while (now_us() < t1) {
      }
      const double gbs = double(p.w->done - d0) * double(chunk) / 0.2 / 1e9;
      p.stop(l);
      std::printf("copies out of %zu MiB%s, no grants: %.1f GB/s\n", chunk / kMiB, gated ? ", gated" : "", gbs);
    }
  }
  return 0;
}
