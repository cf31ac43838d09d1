#include "cupti_telemetry.h"

#include <cupti.h>
#include <cupti_activity_deprecated.h>
#undef cuGetProcAddress
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cupti_lookup.h"
#include "common/log.h"
#include "hooks/hook_table.h"

namespace offload {
namespace {

CuptiTelemetry* g_instance = nullptr;  // CUPTI's buffer callbacks carry no user pointer
// Set by the first registration of another CUPTI client, even before our telemetry exists
// (a profiler started before the first kernel): then ours never starts.
std::atomic<bool> g_other_client{false};
constexpr size_t kBufferBytes = 256u << 10;  // ~1000 kernel records
constexpr int kSilentCollectsForTakeover = 100;  // ~2 s of polls with launches, no records
// The activity kinds we enable, and switch off and on again (yield, pause, resume).
constexpr int kOurKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                             CUPTI_ACTIVITY_KIND_MEMSET};

// The records are read through CUDA 13's structs. CUPTI 12 hands out CUpti_ActivityKernel9,
// CUpti_ActivityMemcpy5 (CUpti_ActivityMemcpy6 from 12.8) and CUpti_ActivityMemset4, as 13 does
// for memsets: the fields read sit at the same offsets in each, so one reading serves both.
template <class A, class B>
constexpr bool same_times = offsetof(A, kind) == offsetof(B, kind) && offsetof(A, start) == offsetof(B, start) &&
                            offsetof(A, end) == offsetof(B, end) &&
                            offsetof(A, correlationId) == offsetof(B, correlationId);
static_assert(same_times<CUpti_ActivityKernel10, CUpti_ActivityKernel9> &&
              offsetof(CUpti_ActivityKernel10, name) == offsetof(CUpti_ActivityKernel9, name));
static_assert(same_times<CUpti_ActivityMemcpy6, CUpti_ActivityMemcpy5> &&
              offsetof(CUpti_ActivityMemcpy6, bytes) == offsetof(CUpti_ActivityMemcpy5, bytes) &&
              offsetof(CUpti_ActivityMemcpy6, copyKind) == offsetof(CUpti_ActivityMemcpy5, copyKind));

// Path of a loaded library whose name contains `needle` ("" if none), as the loader names it.
std::string loaded_path(const char* needle) {
  struct Ctx {
    const char* needle;
    std::string path;
  } ctx{needle, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* p) -> int {
        auto* c = static_cast<Ctx*>(p);
        if (info->dlpi_name && std::strstr(info->dlpi_name, c->needle)) {
          c->path = info->dlpi_name;
          return 1;
        }
        return 0;
      },
      &ctx);
  return ctx.path;
}

// cuptiGetTimestamp, once start() found it: the clock of the activity records.
std::atomic<int (*)(uint64_t*)> g_get_timestamp{nullptr};
uint64_t cupti_now() {
  uint64_t t = 0;
  if (auto f = g_get_timestamp.load(std::memory_order_relaxed)) f(&t);
  return t;
}

}  // namespace

uint64_t (*CuptiTelemetry::clock() const)() { return g_get_timestamp.load() ? &cupti_now : nullptr; }

CuptiTelemetry::CuptiTelemetry(std::string lib_hint, const std::atomic<uint64_t>& launches)
    : lib_hint_(std::move(lib_hint)), launches_(launches) {
  g_instance = this;
}

CuptiTelemetry::~CuptiTelemetry() {
  if (g_instance == this) g_instance = nullptr;
}

bool CuptiTelemetry::start() {
  const char* home = getenv("CUDA_HOME");
  const CuptiSearch search{lib_hint_, loaded_path("libcudart.so"), home ? home : ""};
  std::string path;
  for (const std::string& c : cupti_candidates(search))
    if ((lib_ = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL))) {
      path = c;
      break;
    }
  std::lock_guard lock(mu_);
  if (!lib_) {
    const int major = preferred_cupti_major(search);
    state_ = "off: no libcupti.so." + std::to_string(major) + " (nor of another supported CUDA) found " +
             "(set OFFLOAD_CUPTI_LIB; `offloadctl doctor` lists where it looks)";
    return false;
  }
  log().debug("GPU-time telemetry: CUPTI from {}", path);
  auto sym = [&](const char* n) { return hooks::real_dlsym(lib_, n); };
  auto enable = reinterpret_cast<int (*)(int)>(sym("cuptiActivityEnable"));
  auto reg = reinterpret_cast<int (*)(void*, void*)>(sym("cuptiActivityRegisterCallbacks"));
  flush_all_ = reinterpret_cast<int (*)(uint32_t)>(sym("cuptiActivityFlushAll"));
  get_next_ = reinterpret_cast<int (*)(uint8_t*, size_t, void**)>(sym("cuptiActivityGetNextRecord"));
  disable_ = reinterpret_cast<int (*)(int)>(sym("cuptiActivityDisable"));
  enable_ = enable;
  if (!enable || !reg || !flush_all_ || !get_next_) {
    state_ = "off: libcupti lacks the activity API we need";
    return false;
  }
  if (yielded_.load() || g_other_client.load()) {
    yielded_.store(true);
    state_ = "off: another CUPTI client (e.g. torch.profiler) registered first";
    return false;
  }
  if (reg(reinterpret_cast<void*>(&request_cb), reinterpret_cast<void*>(&complete_cb)) != CUPTI_SUCCESS) {
    state_ = "off: cuptiActivityRegisterCallbacks failed (another CUPTI client?)";
    return false;
  }
  for (int kind : kOurKinds) {
    if (int r = enable(kind); r != CUPTI_SUCCESS) {
      state_ = "off: cuptiActivityEnable(" + std::to_string(kind) + ") failed with " + std::to_string(r);
      return false;
    }
  }
  g_get_timestamp.store(reinterpret_cast<int (*)(uint64_t*)>(sym("cuptiGetTimestamp")));
  state_ = "cupti";
  active_.store(true, std::memory_order_release);
  return true;
}

void CuptiTelemetry::request_cb(uint8_t** buf, size_t* size, size_t* max_records) {
  *buf = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = *buf ? kBufferBytes : 0;
  *max_records = 0;
}

void CuptiTelemetry::complete_cb(void*, uint32_t, uint8_t* buf, size_t, size_t valid) {
  if (CuptiTelemetry* self = g_instance) self->on_buffer(buf, valid);
  free(buf);
}

void CuptiTelemetry::on_buffer(uint8_t* buf, size_t valid) {
  std::lock_guard lock(mu_);
  ++buffers_;
  CUpti_Activity* rec = nullptr;
  while (get_next_(buf, valid, reinterpret_cast<void**>(&rec)) == CUPTI_SUCCESS) {
    GpuRecord g;
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        g = GpuRecord{EventKind::Kernel, name_hash(k->name), k->correlationId, k->start, k->end};
        ++n_kernel_;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        g = GpuRecord{EventKind::Copy, 0, m->correlationId, m->start, m->end, m->bytes, m->copyKind};
        ++n_copy_;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        g = GpuRecord{EventKind::Memset, 0, m->correlationId, m->start, m->end};
        ++n_memset_;
        break;
      }
      default:
        continue;
    }
    raw_.push_back(g);
  }
}

void CuptiTelemetry::note_other_client() {
  g_other_client.store(true);
  if (CuptiTelemetry* self = g_instance) self->yield_to_other_client();
}

void CuptiTelemetry::yield_to_other_client() {
  if (yielded_.exchange(true)) return;
  if (!active()) return;  // start() will see the flag and not begin
  // Synchronously, before the other client enables its own kinds: ours off, so that it
  // owns CUPTI as if we were not there (measured before this existed: torch.profiler saw
  // no CUDA events at all while we held the activity buffers).
  {
    std::lock_guard sw(switch_mu_);  // a resume() under way finishes first, then sees the flag
    for (int kind : kOurKinds)
      if (disable_) disable_(kind);
  }
  taken_over_ = true;
  std::lock_guard lock(mu_);
  state_ = "yielded: another CUPTI client (e.g. torch.profiler) registered for activity records";
  log().warn("GPU-time telemetry: {}", state_);
}

bool CuptiTelemetry::pause() {
  std::lock_guard sw(switch_mu_);
  if (!active() || yielded_.load() || paused_.load() || !disable_) return false;
  for (int kind : kOurKinds)
    disable_(kind);
  paused_.store(true);
  std::lock_guard lock(mu_);
  state_ = "paused: the plan runs (OFFLOAD_TELEMETRY=sampled)";
  return true;
}

bool CuptiTelemetry::resume() {
  std::lock_guard sw(switch_mu_);
  if (!active() || yielded_.load() || !paused_.load() || !enable_) return false;
  for (int kind : kOurKinds)
    if (int r = enable_(kind); r != CUPTI_SUCCESS) {
      log().warn("GPU-time telemetry: cuptiActivityEnable({}) failed with {} on resuming: staying paused", kind, r);
      for (int k : kOurKinds)
        disable_(k);
      return false;
    }
  std::lock_guard lock(mu_);
  silent_collects_ = 0;
  last_buffers_ = buffers_;
  last_launches_ = launches_.load(std::memory_order_relaxed);
  state_ = "cupti";
  paused_.store(false);
  return true;
}

void CuptiTelemetry::collect(std::vector<GpuRecord>* out, bool force) {
  // Once yielded, flushing would only deliver the other client's buffers early.
  if (!active() || yielded_.load()) return;
  // Unforced, CUPTI hands over full buffers only; buffers are small so that this happens
  // a few times per step. A forced flush would also hand over records of kernels still
  // running, without their times (measured: most of a step's records had start == end == 0).
  flush_all_(force ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
  std::lock_guard lock(mu_);
  out->insert(out->end(), raw_.begin(), raw_.end());
  raw_.clear();
  // Takeover: launches keep coming but no buffer has completed for a long while (not while
  // we paused our records ourselves).
  uint64_t launches = launches_.load(std::memory_order_relaxed);
  if (paused_.load()) {
    silent_collects_ = 0;
  } else if (buffers_ == last_buffers_ && launches != last_launches_) {
    if (++silent_collects_ >= kSilentCollectsForTakeover && !taken_over_) {
      taken_over_ = true;
      state_ = "taken over: another CUPTI client (e.g. torch.profiler) owns the activity buffers; "
               "GPU times unavailable";
      log().warn("GPU-time telemetry: {}", state_);
    }
  } else if (buffers_ != last_buffers_) {
    silent_collects_ = 0;
    if (taken_over_ && !yielded_.load()) {
      taken_over_ = false;
      state_ = "cupti";
      log().info("GPU-time telemetry: CUPTI records flow again");
    }
  }
  last_buffers_ = buffers_;
  last_launches_ = launches;
}

std::string CuptiTelemetry::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

}  // namespace offload

namespace offload {
std::string CuptiTelemetry::counters_json() const {
  std::lock_guard lock(mu_);
  return "{\"buffers\":" + std::to_string(buffers_) + ",\"kernels\":" + std::to_string(n_kernel_) +
         ",\"memcpys\":" + std::to_string(n_copy_) + ",\"memsets\":" + std::to_string(n_memset_) + "}";
}
}  // namespace offload

namespace offload {
bool CuptiTelemetry::is_our_callback(const void* request_fn) {
  return request_fn == reinterpret_cast<const void*>(&request_cb);
}
int64_t CuptiTelemetry::stream_id(uint64_t stream) const {
  if (!lib_) return -1;
  using Fn = int (*)(CUcontext, CUstream, uint8_t, uint32_t*);
  static const auto get = reinterpret_cast<Fn>(hooks::real_dlsym(lib_, "cuptiGetStreamIdEx"));
  uint32_t id = 0;
  if (!get || get(nullptr, reinterpret_cast<CUstream>(stream), 0, &id) != CUPTI_SUCCESS) return -1;
  return id;
}

}  // namespace offload
