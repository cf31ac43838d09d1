#include "core/tracker.h"

#include <cstring>

#include <time.h>
#include <x86intrin.h>

#include <algorithm>
#include <unordered_set>

namespace offload {
namespace {

// Records host time spent in a hook's bookkeeping, in TSC cycles: clock_gettime can be a
// system call in a virtual machine (measured: microseconds per call on the GPU machine),
// more than the work it would time.
// A kernel's first launch, which asks the driver for its layout, is not counted: it is a
// one-time cost that the launch itself would otherwise pay (module loading).
struct HookTimer {
  explicit HookTimer(TrackerCounters& c) : c_(c), t0_(__rdtsc()) {}
  ~HookTimer() {
    if (skip) return;
    c_.hook_cycles.fetch_add(__rdtsc() - t0_, std::memory_order_relaxed);
    c_.hooked.fetch_add(1, std::memory_order_relaxed);
  }
  TrackerCounters& c_;
  uint64_t t0_;
  bool skip = false;
};

}  // namespace

bool read_extra(void** extra, ExtraBuffer* out) {
  const void* b = nullptr;
  const size_t* l = nullptr;
  bool only = true, ended = false;
  for (int i = 0; i < 32; i += 2) {
    const uintptr_t key = reinterpret_cast<uintptr_t>(extra[i]);
    if (key == 0) {
      ended = true;
      break;
    }
    if (key == 1) b = extra[i + 1];                                   // BUFFER_POINTER
    else if (key == 2) l = static_cast<const size_t*>(extra[i + 1]);  // BUFFER_SIZE
    else only = false;
  }
  if (!b || !l) return false;
  *out = ExtraBuffer{b, *l, only && ended};
  return true;
}

Tracker::Tracker(Driver& driver, EventLog& log) : driver_(driver), funcs_(driver), log_(log) {}

void Tracker::put_marker(uint64_t launch_no, uint64_t handle) {
  if (!handle) return;
  marker_launch_.store(launch_no, std::memory_order_relaxed);
  // One slot: the worker takes a marker long before the next step's is recorded; if it has
  // not, the older one is let go.
  if (uint64_t old = marker_handle_.exchange(handle, std::memory_order_acq_rel)) driver_.release_marker(old);
}

uint64_t Tracker::count_launch(Stream s) {
  uint64_t n = launches_.fetch_add(1, std::memory_order_relaxed);
  if (n == marker_at_.load(std::memory_order_relaxed)) put_marker(n, driver_.record_marker(s));
  return n;
}

bool Tracker::take_marker(Marker* m) {
  uint64_t h = marker_handle_.exchange(0, std::memory_order_acq_rel);
  if (!h) return false;
  m->handle = h;
  m->launch_no = marker_launch_.load(std::memory_order_relaxed);
  return true;
}

uint64_t Tracker::publish(Event e, const AllocId* acc, uint32_t n) {
  EventLog::Claim c = log_.claim(n);
  if (c.seq) {
    e.live_bytes = table_.live_bytes();
    log_.publish(c, e, acc, n);
  }
  return c.seq;
}

void Tracker::on_alloc(DevPtr p, uint64_t bytes, Stream s, uint64_t tag) {
  AllocId id = next_id_.fetch_add(1, std::memory_order_relaxed);
  if (tag & kRangeTag) id = range_alloc_id(tag & ~kRangeTag, id);
  else if (tag) id = arena_alloc_id(tag, id);
  AllocEntry stale[AllocTable::kMaxReplaced];
  size_t n_stale = table_.insert(p, bytes, id, stale);
  counters_.allocs.fetch_add(1, std::memory_order_relaxed);
  if (light_) return;
  for (size_t i = 0; i < n_stale; ++i) {
    // The range came back without frees we saw: close the old allocations first.
    Event f{};
    f.kind = EventKind::Free;
    f.a = stale[i].id;
    f.b = stale[i].size;
    f.ptr = stale[i].base;
    f.stream = s;
    publish(f, nullptr, 0);
  }
  Event e{};
  e.kind = EventKind::Alloc;
  e.a = id;
  e.b = bytes;
  e.ptr = p;
  e.stream = s;
  publish(e, nullptr, 0);
}

void Tracker::on_free(DevPtr p, Stream s) {
  auto old = table_.erase(p);
  if (!old) {
    counters_.unknown_frees.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  counters_.frees.fetch_add(1, std::memory_order_relaxed);
  if (light_) return;
  Event e{};
  e.kind = EventKind::Free;
  e.a = old->id;
  e.b = old->size;
  e.ptr = p;
  e.stream = s;
  publish(e, nullptr, 0);
}

namespace {
thread_local const LaunchArgs* tl_launch_args = nullptr;
}  // namespace

const LaunchArgs* current_launch_args() { return tl_launch_args; }
LaunchArgsScope::LaunchArgsScope(const LaunchArgs* a) : prev_(tl_launch_args) { tl_launch_args = a; }
LaunchArgsScope::~LaunchArgsScope() { tl_launch_args = prev_; }
thread_local const TransferDst* tl_transfer = nullptr;
const TransferDst* current_transfer() { return tl_transfer; }
TransferScope::TransferScope(const TransferDst* t) : prev_(tl_transfer) { tl_transfer = t; }
TransferScope::~TransferScope() { tl_transfer = prev_; }

uint64_t Tracker::on_kernel(Func f, Stream s, void** params, void** extra, const LaunchGeom* geom) {
  HookTimer timer(counters_);
  uint64_t no = count_launch(s);
  counters_.kernels.fetch_add(1, std::memory_order_relaxed);
  Event e{};
  e.kind = EventKind::Kernel;
  e.stream = s;
  AllocId acc[kMaxAccesses];
  size_t n = 0;
  const FuncInfo* fi = funcs_.get(f, &timer.skip);
  if (fi) e.func = fi->id;
  if (params && fi && fi->nparams >= 0) {
    for (int i = 0; i < fi->nparams && n < kMaxAccesses; ++i) {
      uint32_t size = fi->params[i].size;
      if (size >= 8 && params[i]) n = table_.scan(params[i], size / 8, acc, n, kMaxAccesses);
    }
  } else if (params) {
    e.flags |= kLayoutUnknown;
    counters_.opaque_kernels.fetch_add(1, std::memory_order_relaxed);
  }
  ExtraBuffer x;
  const bool packed = extra && read_extra(extra, &x);
  if (packed) n = table_.scan(x.buf, x.len / 8, acc, n, kMaxAccesses);
  if (n == kMaxAccesses) e.flags |= kAccessesTruncated;
  if (geom && fi && pass_args_.load(std::memory_order_relaxed)) {
    LaunchArgs args{f, fi, params, extra, *geom};
    if (packed && x.only) args.packed = x.buf, args.packed_len = uint32_t(x.len);
    LaunchArgsScope scope(&args);
    gate(no, e.kind, e.func, s, acc, n, e.flags);
  } else {
    gate(no, e.kind, e.func, s, acc, n, e.flags);
  }
  if (Clock clock = lead_clock_.load(std::memory_order_relaxed)) e.host_ns = clock();
  return publish(e, acc, static_cast<uint32_t>(n));
}

// Copies and memsets: the destination (and a copy's source) as the words to scan.
uint64_t Tracker::on_transfer(EventKind kind, DevPtr dst, DevPtr src, uint64_t bytes, Stream s,
                              const void* host_src, std::atomic<uint64_t>* counter) {
  HookTimer timer(counters_);
  uint64_t no = count_launch(s);
  if (!counter) counter = kind == EventKind::Copy ? &counters_.copies : &counters_.memsets;
  counter->fetch_add(1, std::memory_order_relaxed);
  Event e{};
  e.kind = kind;
  e.stream = s;
  e.a = bytes;
  e.ptr = dst;
  AllocId acc[2];
  DevPtr words[2] = {dst, src};
  size_t n = table_.scan(words, kind == EventKind::Copy ? 2 : 1, acc, 0, 2);
  {
    const TransferDst t{dst, bytes};
    TransferScope scope(&t);
    gate(no, kind, 0, s, acc, n, 0);
  }
  if (host_src && bytes >= 8 && bytes <= kMaxTableBytes && n == 1 && acc[0] < kRangeIdBit) {
    // A pointer table? Only pointers into arenas and ranges matter (anything else is always
    // resident).
    // Noted after the gate: writing the table does not touch what it points to.
    AllocId targets[kMaxTableBytes / 8];
    size_t t = table_.scan(host_src, bytes / 8, targets, 0, kMaxTableBytes / 8);
    size_t first_arena = 0;
    while (first_arena < t && targets[first_arena] < kRangeIdBit) ++first_arena;
    if (first_arena < t)
      if (LaunchGate* g = gate_.load(std::memory_order_acquire))
        g->note_pointer_table(acc[0], targets + first_arena, t - first_arena);
  }
  return publish(e, acc, static_cast<uint32_t>(n));
}

uint64_t Tracker::on_copy(DevPtr dst, DevPtr src, uint64_t bytes, Stream s, const void* host_src) {
  return on_transfer(EventKind::Copy, dst, src, bytes, s, host_src);
}

uint64_t Tracker::on_collective(DevPtr send, DevPtr recv, uint64_t bytes, Stream s) {
  return on_transfer(EventKind::Copy, recv, send, bytes, s, nullptr, &counters_.collectives);
}

uint64_t Tracker::on_copies(const void* dsts, const void* srcs, size_t count, uint64_t bytes, Stream s) {
  HookTimer timer(counters_);
  uint64_t no = count_launch(s);
  counters_.copies.fetch_add(1, std::memory_order_relaxed);
  Event e{};
  e.kind = EventKind::Copy;
  e.stream = s;
  e.a = bytes;
  AllocId acc[kMaxAccesses];
  size_t n = dsts ? table_.scan(dsts, count, acc, 0, kMaxAccesses) : 0;
  if (srcs && n < kMaxAccesses) n = table_.scan(srcs, count, acc, n, kMaxAccesses);
  if (n == kMaxAccesses) e.flags |= kAccessesTruncated;
  if (dsts && count) std::memcpy(&e.ptr, dsts, sizeof e.ptr);
  gate(no, e.kind, 0, s, acc, n, e.flags);
  return publish(e, acc, static_cast<uint32_t>(n));
}

uint64_t Tracker::on_memset(DevPtr dst, uint64_t bytes, Stream s) {
  return on_transfer(EventKind::Memset, dst, 0, bytes, s, nullptr);
}

uint64_t Tracker::on_graph(Stream s) {
  uint64_t no = count_launch(s);
  gate(no, EventKind::Graph, 0, s, nullptr, 0, 0);
  counters_.graphs.fetch_add(1, std::memory_order_relaxed);
  Event e{};
  e.kind = EventKind::Graph;
  e.stream = s;
  return publish(e, nullptr, 0);
}

void Tracker::mark_step() {
  if (marks_record_.load(std::memory_order_relaxed))
    put_marker(launches_.load(std::memory_order_relaxed), driver_.record_marker(0));
  Event e{};
  e.kind = EventKind::Mark;
  publish(e, nullptr, 0);
}

// ---------------------------------------------------------------------------------------

StepAssembler::StepAssembler(const FuncRegistry& funcs, Options o)
    : funcs_(funcs), opt_(o), detector_(o.detector) {}

void StepAssembler::consume(const Event& e, const AllocId* acc) {
  pending_.push_back(Pending{e, pending_acc_.size()});
  pending_acc_.insert(pending_acc_.end(), acc, acc + e.access_count);
  if (is_launch(e.kind)) {
    pending_launch_no_.push_back(launch_no_++);
    uint64_t what = e.kind == EventKind::Kernel ? e.func : e.a;
    // Once steps are marked by the application the detector is not consulted: do not feed it.
    if (!marked_) detector_.push(StepDetector::token(static_cast<uint32_t>(e.kind), what, e.live_bytes), e.live_bytes);
    if (e.kind == EventKind::Kernel) known_names_.insert(name_hash_of(e.func));
  } else {
    pending_launch_no_.push_back(~uint64_t{0});
  }
  if (e.kind == EventKind::Mark) {
    marked_ = true;
    cut_at(pending_.size(), now_ns_);
  } else if (pending_.size() > opt_.max_pending_events) {
    // No boundary for too long: fold the older half into the live set and forget it.
    size_t half = pending_.size() / 2;
    for (size_t i = 0; i < half; ++i) {
      const Event& x = pending_[i].e;
      if (x.kind == EventKind::Alloc) live_[x.a] = Live{x.b, x.stream, x.ptr};
      else if (x.kind == EventKind::Free) live_.erase(x.a);
    }
    size_t acc_off = pending_[half].acc_begin;
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(half));
    pending_launch_no_.erase(pending_launch_no_.begin(), pending_launch_no_.begin() + static_cast<ptrdiff_t>(half));
    pending_acc_.erase(pending_acc_.begin(), pending_acc_.begin() + static_cast<ptrdiff_t>(acc_off));
    for (auto& p : pending_) p.acc_begin -= acc_off;
  }
}

void StepAssembler::cut_at(size_t n, int64_t now_ns) {
  Cut c;
  c.cut_ns = now_ns;
  StepTrace& t = c.trace;
  t.step = next_step_;
  std::vector<std::pair<DevPtr, AllocId>> born_before;
  born_before.reserve(live_.size());
  for (auto& [id, l] : live_) born_before.emplace_back(l.base, id);
  std::sort(born_before.begin(), born_before.end());
  std::unordered_map<AllocId, uint32_t> ord;
  ord.reserve(born_before.size() * 2 + 64);
  for (auto& [base, id] : born_before) {
    const Live& l = live_[id];
    ord[id] = static_cast<uint32_t>(t.allocs.size());
    t.allocs.push_back(TraceAlloc{static_cast<uint32_t>(t.allocs.size()), l.bytes, l.stream, -1, -1, base, id});
  }
  for (size_t i = 0; i < n; ++i) {
    const Event& e = pending_[i].e;
    const int64_t pos = static_cast<int64_t>(t.launches.size());
    switch (e.kind) {
      case EventKind::Alloc:
        ord[e.a] = static_cast<uint32_t>(t.allocs.size());
        t.allocs.push_back(TraceAlloc{static_cast<uint32_t>(t.allocs.size()), e.b, e.stream, pos, -1, e.ptr, e.a});
        live_[e.a] = Live{e.b, e.stream, e.ptr};
        break;
      case EventKind::Free:
        if (auto it = ord.find(e.a); it != ord.end()) t.allocs[it->second].free_pos = pos;
        live_.erase(e.a);
        break;
      case EventKind::Mark:
        break;
      default: {
        TraceLaunch l;
        l.pos = static_cast<uint32_t>(pos);
        l.kind = e.kind;
        l.stream = e.stream;
        l.host_ns = e.host_ns;
        if (e.kind == EventKind::Kernel) {
          l.kernel = e.func;
          if (!t.kernels.count(e.func)) t.kernels[e.func] = funcs_.name(e.func);
          if (e.seq >= gpu_from_seq_) ++timed_kernels_;
        }
        const AllocId* acc = pending_acc_.data() + pending_[i].acc_begin;
        for (uint32_t k = 0; k < e.access_count; ++k)
          if (auto it = ord.find(acc[k]); it != ord.end()) l.allocs.push_back(it->second);
        if (t.launches.empty()) t.first_launch = pending_launch_no_[i];
        t.launches.push_back(std::move(l));
        c.seqs.push_back(e.seq);
      }
    }
  }
  size_t acc_off = n < pending_.size() ? pending_[n].acc_begin : pending_acc_.size();
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(n));
  pending_launch_no_.erase(pending_launch_no_.begin(), pending_launch_no_.begin() + static_cast<ptrdiff_t>(n));
  pending_acc_.erase(pending_acc_.begin(), pending_acc_.begin() + static_cast<ptrdiff_t>(acc_off));
  for (auto& p : pending_) p.acc_begin -= acc_off;
  c.timed = !c.seqs.empty() && c.seqs.front() >= gpu_from_seq_;
  c.kernels_through = timed_kernels_;
  if (!t.launches.empty()) {
    ++next_step_;
    cuts_.push_back(std::move(c));
  }
}

void StepAssembler::add_gpu_records(std::vector<GpuRecord>& recs) {
  for (const GpuRecord& r : recs) {
    if (r.kind == EventKind::Copy && r.start_ns != 0 && r.end_ns >= r.start_ns) {
      if (copies_.size() >= kMaxCopies)  // no timed step has taken them: keep the newest half
        copies_.erase(copies_.begin(), copies_.begin() + static_cast<ptrdiff_t>(kMaxCopies / 2));
      copies_.push_back(r);
    }
    if (r.kind == EventKind::Kernel && r.corr > aligned_corr_) {
      records_.push_back(r);
      // Only records of kernels we have launched count towards "all our records are in":
      // records of launches we never saw (graph nodes) must not end the wait early.
      if (known_names_.count(r.name_hash)) ++records_in_;
    }
  }
  recs.clear();
}

namespace {
// A record handed over before its kernel finished carries no times.
bool timed(const GpuRecord& r) { return r.start_ns != 0 && r.end_ns >= r.start_ns; }
}  // namespace

void StepAssembler::telemetry_lost() {
  gpu_from_seq_ = ~uint64_t{0};
  for (Cut& c : cuts_) c.timed = false;
  records_.clear();
  copies_.clear();
}

uint64_t StepAssembler::name_hash_of(uint32_t func) {
  auto it = name_hashes_.find(func);
  if (it != name_hashes_.end()) return it->second;
  return name_hashes_[func] = name_hash(funcs_.name(func).c_str());
}

void StepAssembler::finish(Cut& c) {
  StepTrace& t = c.trace;
  if (records_.empty()) return;
  // Align our kernel launches with the records in API-call order. A record that does not
  // match the next launch by name is a launch we did not see; a launch with no matching
  // record within a window (its record not delivered) is left without a time.
  constexpr size_t kLookahead = 64;
  std::sort(records_.begin(), records_.end(), [](const GpuRecord& a, const GpuRecord& b) { return a.corr < b.corr; });
  size_t i = 0, matched = 0, unseen = 0, consumed = 0;
  int64_t t0 = INT64_MAX;
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  std::vector<std::pair<size_t, size_t>> hits;  // launch position, record index
  for (size_t pos = 0; pos < t.launches.size(); ++pos) {
    const TraceLaunch& l = t.launches[pos];
    if (l.kind != EventKind::Kernel || c.seqs[pos] < gpu_from_seq_) continue;
    uint64_t h = name_hash_of(l.kernel);
    size_t j = i;
    while (j < records_.size() && j - i < kLookahead && records_[j].name_hash != h) ++j;
    if (j == records_.size() || records_[j].name_hash != h) continue;
    unseen += j - i;
    for (size_t k = i; k <= j; ++k) {
      if (!timed(records_[k])) continue;
      iv.emplace_back(records_[k].start_ns, records_[k].end_ns);
      t0 = std::min<int64_t>(t0, static_cast<int64_t>(records_[k].start_ns));
    }
    hits.emplace_back(pos, j);
    ++matched;
    i = j + 1;
    consumed = i;
  }
  for (auto [pos, j] : hits) {
    if (!timed(records_[j])) continue;
    t.launches[pos].gpu_start_ns = static_cast<int64_t>(records_[j].start_ns) - t0;
    t.launches[pos].gpu_ns = static_cast<int64_t>(records_[j].end_ns - records_[j].start_ns);
    if (uint64_t h = t.launches[pos].host_ns)
      t.launches[pos].lead_ns = static_cast<int64_t>(records_[j].start_ns) - static_cast<int64_t>(h);
  }
  if (consumed) aligned_corr_ = records_[consumed - 1].corr;
  records_.erase(records_.begin(), records_.begin() + static_cast<ptrdiff_t>(consumed));
  if (!c.timed || matched == 0) return;
  t.cupti_kernels = static_cast<int64_t>(matched + unseen);
  if (iv.empty()) return;
  std::sort(iv.begin(), iv.end());
  int64_t busy = 0;
  uint64_t cur_s = 0, cur_e = 0;
  bool open = false;
  for (auto [s, e] : iv) {
    if (open && s <= cur_e) {
      cur_e = std::max(cur_e, e);
      continue;
    }
    if (open) busy += static_cast<int64_t>(cur_e - cur_s);
    cur_s = s;
    cur_e = e;
    open = true;
  }
  if (open) busy += static_cast<int64_t>(cur_e - cur_s);
  t.gpu_busy_ns = busy;
  t.gpu_origin_ns = t0;
  take_transfers(t, static_cast<uint64_t>(t0), cur_e);  // cur_e: the last kernel end
}

void StepAssembler::take_transfers(StepTrace& t, uint64_t t0, uint64_t end) {
  // The step's transfers: copies that start before its last kernel ends and after the last
  // timed step's did (before this step's first kernel when there was none).
  const uint64_t from = transfers_from_ ? transfers_from_ : t0;
  size_t kept = 0;
  for (const GpuRecord& r : copies_) {
    if (r.start_ns >= end) {
      copies_[kept++] = r;
      continue;
    }
    if (r.start_ns < from) continue;  // too late for its own step
    t.transfers.push_back(TraceTransfer{static_cast<int64_t>(r.start_ns) - static_cast<int64_t>(t0),
                                        static_cast<int64_t>(r.end_ns - r.start_ns), r.bytes, r.copy_kind});
  }
  copies_.resize(kept);
  std::sort(t.transfers.begin(), t.transfers.end(),
            [](const TraceTransfer& a, const TraceTransfer& b) { return a.gpu_start_ns < b.gpu_start_ns; });
  transfers_from_ = end;
}

std::vector<StepTrace> StepAssembler::take_ready(int64_t now_ns, bool final, bool no_wait) {
  now_ns_ = now_ns;
  if (!marked_) {
    for (uint64_t b : detector_.poll()) {
      auto it = std::find(pending_launch_no_.begin(), pending_launch_no_.end(), b);
      if (it == pending_launch_no_.end()) continue;
      size_t idx = static_cast<size_t>(it - pending_launch_no_.begin());
      // Allocations and frees just before the boundary's launch open the new step.
      while (idx > 0 && !is_launch(pending_[idx - 1].e.kind)) --idx;
      if (idx > 0) cut_at(idx, now_ns);
    }
  }
  if (final && !pending_.empty()) cut_at(pending_.size(), now_ns);
  std::vector<StepTrace> out;
  while (!cuts_.empty()) {
    Cut& c = cuts_.front();
    // Records arrive as kernels finish, not in order: wait until as many records came in as
    // launches were made through this step, plus a moment for stragglers.
    bool times_in = records_in_ >= c.kernels_through && now_ns - c.cut_ns >= opt_.telemetry_settle_ns;
    if (!final && !no_wait && !times_in && now_ns - c.cut_ns < opt_.telemetry_wait_ns) break;
    finish(c);
    out.push_back(std::move(c.trace));
    cuts_.pop_front();
  }
  return out;
}

}  // namespace offload

namespace offload {

double ns_per_tsc_cycle() {
  static const double ratio = [] {
    auto now = [] {
      timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
    };
    int64_t t0 = now();
    uint64_t c0 = __rdtsc();
    timespec d{0, 20'000'000};
    nanosleep(&d, nullptr);
    int64_t t1 = now();
    uint64_t c1 = __rdtsc();
    return c1 > c0 ? static_cast<double>(t1 - t0) / static_cast<double>(c1 - c0) : 0.0;
  }();
  return ratio;
}

double TrackerCounters::hook_ns_mean() const {
  uint64_t n = hooked.load(std::memory_order_relaxed);
  return n ? static_cast<double>(hook_cycles.load(std::memory_order_relaxed)) * ns_per_tsc_cycle() / static_cast<double>(n)
           : 0.0;
}

}  // namespace offload
