#include "core/replay.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <unordered_map>

#include "planner/plan.h"
#include "core/sim_driver.h"
#include "core/tracker.h"

namespace offload {
namespace {

using Key = std::tuple<uint64_t, int64_t, int64_t>;  // bytes, born, freed

std::vector<Key> touched(const StepTrace& t, const TraceLaunch& l) {
  std::vector<Key> k;
  for (uint32_t o : l.allocs) k.emplace_back(t.allocs[o].bytes, t.allocs[o].alloc_pos, t.allocs[o].free_pos);
  std::sort(k.begin(), k.end());
  return k;
}

uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return x;
}

// What word `i` of an allocation holds after a writer that left signature `sig`.
uint64_t sig_word(uint64_t sig, uint64_t i) { return mix(sig + i * 0x9e3779b97f4a7c15ull); }

// The words a body checks and writes: all of a small allocation; of a larger one the first,
// the last and fifteen spread between them (so a copy that stops short, starts late or misses
// a granule in the middle is seen).
template <class F>
void for_sampled(uint64_t nwords, F f) {
  if (nwords <= 32) {
    for (uint64_t i = 0; i < nwords; ++i) f(i);
    return;
  }
  f(0);
  for (uint64_t k = 1; k < 16; ++k) f(k * nwords / 16);
  f(nwords - 1);
}

struct Touch {
  DevPtr base;
  uint64_t words;
  uint64_t expect;  // 0: nothing written since it was born (any content will do)
  uint64_t next;
  uint32_t ordinal;
};

struct ContentCheck {
  uint64_t launches = 0, words = 0, mismatches = 0;
  std::string first;
  // Who wrote each signature (its first word): a wrong word names the launch that wrote it.
  struct Writer {
    int step;
    size_t pos;
    uint32_t ordinal;
  };
  std::unordered_map<uint64_t, Writer> writers;
};

// A kernel body: check what the previous toucher of each allocation left, then sign it.
// `whole`: every word of what it writes (a kernel made again must give the same bytes throughout).
void run_body(const std::vector<Touch>& touches, ContentCheck* chk, int step, size_t pos, bool whole = false) {
  bool checked = false;
  for (const Touch& t : touches) {
    uint64_t* w = reinterpret_cast<uint64_t*>(t.base);
    if (t.expect) {
      checked = true;
      uint64_t bad = 0, bad_i = 0, bad_v = 0;
      for_sampled(t.words, [&](uint64_t i) {
        ++chk->words;
        if (w[i] != sig_word(t.expect, i) && bad++ == 0) {
          bad_i = i;
          bad_v = w[i];
        }
      });
      if (bad) {
        ++chk->mismatches;
        if (chk->first.empty()) {
          char by[96] = "";
          if (auto wr = bad_i == 0 ? chk->writers.find(bad_v) : chk->writers.end(); wr != chk->writers.end())
            snprintf(by, sizeof by, ", written by step %d launch %zu as allocation #%u", wr->second.step,
                     wr->second.pos, wr->second.ordinal);
          char msg[384];
          snprintf(msg, sizeof msg,
                   "step %d launch %zu: allocation #%u (%llu words) word %llu holds 0x%016llx%s, expected 0x%016llx%s "
                   "(%llu sampled words wrong)",
                   step, pos, t.ordinal, static_cast<unsigned long long>(t.words), static_cast<unsigned long long>(bad_i),
                   static_cast<unsigned long long>(bad_v), by,
                   static_cast<unsigned long long>(sig_word(t.expect, bad_i)),
                   bad_v == 0xa5a5a5a5a5a5a5a5ull ? ": a fresh physical handle never filled" : "",
                   static_cast<unsigned long long>(bad));
          chk->first = msg;
        }
      }
    }
    if (!t.next) continue;  // read only (ReplayOptions::relaunch)
    if (whole)
      for (uint64_t i = 0; i < t.words; ++i) w[i] = sig_word(t.next, i);
    else
      for_sampled(t.words, [&](uint64_t i) { w[i] = sig_word(t.next, i); });
    chk->writers[sig_word(t.next, 0)] = {step, pos, t.ordinal};
  }
  if (checked) ++chk->launches;
}

// ReplayOptions::relaunch: a kernel's fourth parameter is its launch's table (step, position,
// then per touched allocation its base, words, expected and next signatures and ordinal), so that
// the body the driver runs again reads it from the arguments.
constexpr size_t kTableHead = 2, kTableSlot = 5;
void run_table(const unsigned char* table, size_t slots, ContentCheck* chk) {
  auto word = [&](size_t i) {
    uint64_t v;
    std::memcpy(&v, table + 8 * i, 8);
    return v;
  };
  std::vector<Touch> touches;
  for (size_t k = 0; k < slots; ++k) {
    const size_t at = kTableHead + kTableSlot * k;
    if (const uint64_t base = word(at))
      touches.push_back(Touch{base, word(at + 1), word(at + 2), word(at + 3), static_cast<uint32_t>(word(at + 4))});
  }
  run_body(touches, chk, static_cast<int>(word(0)), word(1), true);
}

class Replayer {
 public:
  Replayer(const StepTrace& rec, const ReplayOptions& opt)
      : rec_(rec), opt_(opt), log_(1 << 16, 1 << 20), ex_(drv_, opt.exec), tracker_(drv_, log_),
        asm_(tracker_.funcs(), assembler_options()), rng_(opt.seed) {
    if (!acting()) return;
    const uint64_t div = std::max<uint32_t>(opt_.size_divisor, 1);
    // The GPU's 2 MiB granularity, scaled (the simulated driver wants whole pages).
    granularity_ = std::max<uint64_t>(4096, round_up((2u << 20) / div, 4096));
    drv_.set_granularity(granularity_);
    drv_.set_copy_delay(opt_.copy_delay);
    tracker_.set_gate(opt_.cap ? opt_.cap->attach(drv_, granularity_, tracker_.allocs()) : &ex_);
    tracker_.set_pass_launch_args(opt_.relaunch);
    res_.offload.divisor = static_cast<uint32_t>(div);
    res_.offload.granularity = granularity_;
    res_.offload.recorded_peak = peak_live_bytes(rec_);
    res_.offload.budget = static_cast<uint64_t>(opt_.budget_fraction * static_cast<double>(res_.offload.recorded_peak));
    res_.offload.plan = "no step repeated the one before it: nothing planned";
  }

  ReplayResult run();

 private:
  static StepAssembler::Options assembler_options() {
    StepAssembler::Options ao;
    ao.telemetry_wait_ns = 0;  // no GPU times to wait for
    return ao;
  }

  bool acting() const { return opt_.offload || opt_.cap; }  // sizes scaled, every launch checked
  void alloc(uint32_t o);
  void release(uint32_t o);
  void launch(int step, size_t p);
  void join(Stream from, Stream to);
  // ReplayOptions::relaunch: a kernel launch's arguments in buf_ (pointers, scalars, the table of
  // its touches) and relaunch_params_ pointing at them.
  void put_table(const std::vector<Touch>& touches, int step, size_t p, size_t w);
  void run_gpu();
  void sample_footprint();
  void pump();
  void plan_from(const StepTrace& t);
  void begin_step();
  void end_step();
  void carry_over(const std::map<uint64_t, std::vector<uint32_t>>& carried_by_size);

  const StepTrace& rec_;
  ReplayOptions opt_;
  SimDriver drv_;
  EventLog log_;
  std::vector<unsigned char> host_;  // the executor's host memory: outlives it
  Executor ex_;
  Tracker tracker_;
  StepAssembler asm_;
  std::mt19937_64 rng_;
  ReplayResult res_;

  std::map<uint32_t, size_t> width_;
  std::map<uint32_t, Func> funcs_;
  std::vector<unsigned char> buf_;
  void* relaunch_params_[4] = {};  // ReplayOptions::relaunch: the launch's arguments, in buf_
  // Per ordinal: where it lives, its content signature, the stream that last touched it.
  std::vector<DevPtr> addr_;
  std::vector<uint64_t> sig_;
  std::vector<Stream> last_stream_;
  std::vector<bool> member_;
  // relaunch: per ordinal, 0 untouched since its birth, 1 touched by fills only, 2 written since
  // (a touch now reads it). A fill launch (fill_kernel_) writes what it touches, and so does the
  // first other launch after fills only: PyTorch's deterministic mode fills each new tensor before
  // the operation that made it writes it.
  std::vector<uint8_t> written_;
  std::map<uint32_t, bool> fill_kernel_;
  // by recorded kernel id: its name says it fills

  // Offload mode: the allocator (a caching pool, stream-ordered as cudaMallocAsync is).
  std::unordered_multimap<uint64_t, DevPtr> pool_;
  uint64_t plain_live_ = 0;  // live bytes the allocator served
  uint64_t granularity_ = 0;
  uint64_t footprint_ = 0;   // this step's peak
  std::vector<uint64_t> last_tokens_;
  ExecutorStats at_start_;
  ContentCheck check_;
  bool stopped_ = false;  // cap mode: the manager refused an allocation or a launch
};

void Replayer::alloc(uint32_t o) {
  const TraceAlloc& a = rec_.allocs[o];
  sig_[o] = 0;
  if (!written_.empty()) written_[o] = 0;
  last_stream_[o] = a.stream;
  member_[o] = false;

  if (!acting()) {
    addr_[o] = drv_.alloc(a.bytes);
    tracker_.on_alloc(addr_[o], a.bytes, a.stream);
    return;
  }
  // Runtime::place (or place_capped), then Runtime::track_alloc for what is not placed.
  uint64_t tag = 0;
  DevPtr p = 0;
  if (opt_.cap) {
    bool refused = false;
    p = opt_.cap->alloc(a.bytes, a.stream, &tag, &refused);
    if (refused) {
      stopped_ = true;  // the program would see out-of-memory here
      return;
    }
  } else {
    p = ex_.place(a.bytes, a.stream, tracker_.launches(), &tag);
  }
  if (p) {
    member_[o] = true;
  } else {
    tag = 0;
    if (auto it = pool_.find(a.bytes); it != pool_.end()) {
      p = it->second;
      pool_.erase(it);
    } else {
      p = drv_.alloc(a.bytes);
    }
    plain_live_ += a.bytes;
    if (opt_.cap) opt_.cap->pooled(p, a.bytes);
  }
  addr_[o] = p;
  tracker_.on_alloc(p, a.bytes, a.stream, tag);
  if (!opt_.cap) ex_.note_live(tracker_.allocs().live_bytes());
  sample_footprint();
}

void Replayer::release(uint32_t o) {
  const TraceAlloc& a = rec_.allocs[o];
  const DevPtr p = addr_[o];
  addr_[o] = 0;
  const std::optional<AllocEntry> e = tracker_.allocs().find(p);
  const AllocId id = e && e->base == p ? e->id : 0;
  tracker_.on_free(p, a.stream);
  if (!acting()) {
    drv_.free(p);
    return;
  }
  // Freed on the allocation's stream, after its last use on any stream (record_stream).
  if (last_stream_[o] != a.stream) join(last_stream_[o], a.stream);
  if (opt_.cap ? opt_.cap->free(p, a.stream, a.bytes, id) : ex_.release(p, a.stream)) return;
  plain_live_ -= a.bytes;
  // The block is reusable once the stream has reached the free.
  drv_.launch(a.stream, [this, p, bytes = a.bytes] { pool_.emplace(bytes, p); });
}

void Replayer::put_table(const std::vector<Touch>& touches, int step, size_t p, size_t w) {
  // The table after the scalars: the body the driver runs (again) reads it.
  const size_t at = 8 * w + 16;
  buf_.resize(at + 8 * (kTableHead + kTableSlot * w), 0);
  auto put = [&](size_t i, uint64_t v) { std::memcpy(buf_.data() + at + 8 * i, &v, 8); };
  put(0, static_cast<uint64_t>(step));
  put(1, p);
  for (size_t k = 0; k < touches.size() && k < w; ++k) {
    const size_t s = kTableHead + kTableSlot * k;
    put(s, touches[k].base);
    put(s + 1, touches[k].words);
    put(s + 2, touches[k].expect);
    put(s + 3, touches[k].next);
    put(s + 4, touches[k].ordinal);
  }
  relaunch_params_[0] = buf_.data();
  relaunch_params_[1] = buf_.data() + 8 * w;
  relaunch_params_[2] = buf_.data() + 8 * w + 8;
  relaunch_params_[3] = buf_.data() + at;
}

void Replayer::join(Stream from, Stream to) {
  uint64_t ev = drv_.create_event();
  drv_.record_event(ev, from);
  drv_.stream_wait(to, ev);
  drv_.destroy_event(ev);
}

void Replayer::launch(int step, size_t p) {
  const TraceLaunch& l = rec_.launches[p];
  std::vector<Touch> touches;
  if (acting()) {
    // The program orders a use after the previous one on another stream (an event wait).
    std::vector<uint32_t> objs(l.allocs.begin(), l.allocs.end());
    std::sort(objs.begin(), objs.end());
    objs.erase(std::unique(objs.begin(), objs.end()), objs.end());
    for (uint32_t o : objs) {
      if (!addr_[o]) continue;
      if (last_stream_[o] != l.stream) join(last_stream_[o], l.stream);
      last_stream_[o] = l.stream;
      uint64_t next = mix((uint64_t{o} << 40) ^ (static_cast<uint64_t>(step) << 24) ^ p ^ 0x5eed) | 1;
      if (opt_.relaunch && l.kind == EventKind::Kernel) {
        if (written_[o] == 2) next = 0;  // read: the signature stays
        written_[o] = fill_kernel_[l.kernel] ? std::max<uint8_t>(written_[o], 1) : 2;
      }
      touches.push_back(Touch{addr_[o], rec_.allocs[o].bytes / 8, sig_[o], next, o});
      if (next) sig_[o] = next;
    }
  }
  // Interior pointers: views point past their storage's start.
  auto ptr = [&](uint32_t o) { return addr_[o] + (rec_.allocs[o].bytes > 64 ? 32 : 0); };
  switch (l.kind) {
    case EventKind::Kernel: {
      size_t w = std::max<size_t>(width_[l.kernel], 1);
      buf_.assign(8 * w + 16, 0);
      for (size_t i = 0; i < l.allocs.size(); ++i) {
        DevPtr v = ptr(l.allocs[i]);
        std::memcpy(buf_.data() + 8 * i, &v, 8);
      }
      uint32_t scalar = 7;
      uint64_t stride = 4096;
      std::memcpy(buf_.data() + 8 * w, &scalar, 4);
      std::memcpy(buf_.data() + 8 * w + 8, &stride, 8);
      if (opt_.relaunch) {
        put_table(touches, step, p, w);
        const LaunchGeom g;
        tracker_.on_kernel(funcs_[l.kernel], l.stream, relaunch_params_, nullptr, &g);
        break;
      }
      void* params[3] = {buf_.data(), buf_.data() + 8 * w, buf_.data() + 8 * w + 8};
      tracker_.on_kernel(funcs_[l.kernel], l.stream, params, nullptr);
      break;
    }
    case EventKind::Copy:
      tracker_.on_copy(l.allocs.size() > 0 ? ptr(l.allocs[0]) : 0, l.allocs.size() > 1 ? ptr(l.allocs[1]) : 0, 0,
                       l.stream);
      break;
    case EventKind::Memset:
      tracker_.on_memset(l.allocs.empty() ? 0 : ptr(l.allocs[0]), 0, l.stream);
      break;
    default:
      tracker_.on_graph(l.stream);
  }
  if (!acting()) return;
  if (opt_.cap && opt_.cap->refused_launch()) {
    stopped_ = true;  // the hook returns out-of-memory: the launch never runs
    return;
  }
  // Queued after whatever the gate queued on the stream (the waits for reloads).
  if (opt_.relaunch && l.kind == EventKind::Kernel)
    drv_.launch_kernel(funcs_[l.kernel], LaunchGeom{}, l.stream, relaunch_params_);  // its table holds the touches
  else
    drv_.launch(l.stream, [touches = std::move(touches), chk = &check_, step, p] { run_body(touches, chk, step, p); });
  if (opt_.cap) opt_.cap->after_launch();
  run_gpu();
  sample_footprint();
}

// The simulated GPU runs behind the host by a random number of ops; past max_queued the host
// waits for it, as a real host blocks when the launch queue is full.
void Replayer::run_gpu() {
  uint32_t n = std::uniform_int_distribution<uint32_t>(0, opt_.gpu_ops_max)(rng_);
  for (uint32_t i = 0; i < n && drv_.step(rng_); ++i) {
  }
  while (drv_.pending_ops() > opt_.max_queued)
    if (!drv_.step(rng_)) drv_.run_all();  // only blocked waits: run_all names the deadlock
}

void Replayer::sample_footprint() {
  footprint_ = std::max(footprint_, plain_live_ + drv_.vmm_stats().physical_bytes);
}

void Replayer::pump() {
  log_.drain([&](const Event& e, const AllocId* acc) { asm_.consume(e, acc); });
  if (opt_.offload) ex_.poll();
  if (opt_.cap) opt_.cap->poll();
  for (StepTrace& t : asm_.take_ready(0, false)) {
    if (opt_.offload) plan_from(t);
    if (opt_.cap) opt_.cap->step_seen(t.launches.size());
    res_.steps.push_back(std::move(t));
  }
}

// As preload/plan_controller.cpp's PlanController::plan_from, with the sizes the recording was scaled by.
void Replayer::plan_from(const StepTrace& t) {
  std::vector<uint64_t> tokens = step_tokens(t);
  bool repeats = tokens == last_tokens_;
  last_tokens_ = std::move(tokens);
  if (!repeats || (ex_.installed() && !ex_.deviated()) || !ex_.idle()) return;
  ReplayOffload& ro = res_.offload;
  PlanOptions o;
  o.budget = ro.budget;
  o.granularity = drv_.vmm_granularity();
  o.min_bytes = (kActivationMinBytes + ro.divisor - 1) / ro.divisor;
  o.member_align = std::max<uint64_t>(64, o.member_align / ro.divisor);
  std::string why;
  Plan plan;
  if (opt_.planner) {
    // The replayed step ran on the simulated GPU: its launches carry the recorded times.
    StepTrace timed = t;
    if (timed.launches.size() == rec_.launches.size())
      for (size_t i = 0; i < timed.launches.size(); ++i) {
        timed.launches[i].gpu_start_ns = rec_.launches[i].gpu_start_ns;
        timed.launches[i].gpu_ns = rec_.launches[i].gpu_ns;
      }
    plan = opt_.planner(timed, o, ro.divisor, &why);
  } else {
    plan = build_plan(t, o, &why);
  }
  if (plan.arenas.empty()) {
    ro.plan = "not offloading: " + why;
    return;
  }
  // Host memory as if pinned in chunks smaller than an arena, from a phase that is not a
  // multiple of anything: copies are split at the chunk boundaries.
  const uint64_t phase = 12344;
  ro.host_chunk = std::max<uint64_t>(4096, plan.handle_bytes / 2 + 4104);
  host_.assign(plan.host_bytes() + phase, 0);
  HostMemory hm{host_.data() + phase, host_.data(), ro.host_chunk};
  const uint64_t n = plan.step_launches;
  uint64_t anchor = plan_anchor(t.first_launch, n, tracker_.launches());
  ro.plan = plan.describe();
  ro.predicted_peak = plan.predicted_peak;
  ro.handles = plan.handles;
  ro.handle_bytes = plan.handle_bytes;
  ro.arenas = static_cast<uint32_t>(plan.arenas.size());
  ro.moved_per_step = 0;
  for (const ArenaPlan& a : plan.arenas) ro.moved_per_step += a.used;
  ro.meets_budget = plan.meets_budget;
  if (!ex_.install(std::move(plan), anchor, hm, &why)) {
    ro.plan = "install refused: " + why;
    return;
  }
  ro.installed = true;
}

void Replayer::begin_step() {
  if (opt_.cap) {
    opt_.cap->begin_step();
    footprint_ = 0;
    sample_footprint();
  }
  if (!opt_.offload) return;
  at_start_ = ex_.stats();
  ex_.reset_peak();
  footprint_ = 0;
  sample_footprint();
}

void Replayer::end_step() {
  if (opt_.cap) {
    opt_.cap->end_step();
    ReplayOffloadStep st;
    st.footprint_peak = footprint_;
    res_.offload.steps.push_back(st);
  }
  if (!opt_.offload) return;
  ExecutorStats s = ex_.stats();
  ReplayOffloadStep st;
  st.active = s.steps_active > at_start_.steps_active;
  st.evictions = s.evictions - at_start_.evictions;
  st.reloads = s.reloads - at_start_.reloads;
  st.misses = s.misses - at_start_.misses;
  st.late_reloads = s.late_reloads - at_start_.late_reloads;
  st.abandoned = s.evictions_abandoned - at_start_.evictions_abandoned;
  st.footprint_peak = footprint_;
  st.device_peak = s.device_peak;
  ReplayOffload& ro = res_.offload;
  if (st.active && ro.first_active < 0) {
    ro.first_active = static_cast<int>(ro.steps.size());
  } else if (st.active) {
    ++ro.steady_steps;
    ro.steady_misses += st.misses;
    ro.steady_footprint = std::max(ro.steady_footprint, st.footprint_peak);
    ro.steady_device_peak = std::max(ro.steady_device_peak, st.device_peak);
  }
  ro.steps.push_back(st);
}

// Carries what outlives the step into the next one's "born before" slots: carried_by_size maps
// bytes to the ordinals born before the step and freed in it.
void Replayer::carry_over(const std::map<uint64_t, std::vector<uint32_t>>& carried_by_size) {
  std::map<uint64_t, size_t> used;
  for (const TraceAlloc& a : rec_.allocs) {
    if (a.alloc_pos < 0 || a.free_pos >= 0 || !addr_[a.ordinal]) continue;
    auto it = carried_by_size.find(a.bytes);
    size_t& k = used[a.bytes];
    if (it != carried_by_size.end() && k < it->second.size()) {
      uint32_t to = it->second[k++];
      addr_[to] = addr_[a.ordinal];
      sig_[to] = sig_[a.ordinal];
      if (!written_.empty()) written_[to] = written_[a.ordinal];
      last_stream_[to] = last_stream_[a.ordinal];
      member_[to] = member_[a.ordinal];
      addr_[a.ordinal] = 0;
    } else {
      release(a.ordinal);  // nothing in the recording carries it: let it go
    }
  }
}

ReplayResult Replayer::run() {
  const StepTrace& rec = rec_;
  // One simulated kernel per recorded kernel, wide enough for its widest launch.
  for (const TraceLaunch& l : rec.launches)
    if (l.kind == EventKind::Kernel) width_[l.kernel] = std::max(width_[l.kernel], l.allocs.size());
  for (auto& [id, w] : width_) {
    uint32_t bytes = static_cast<uint32_t>(8 * std::max<size_t>(w, 1));
    const std::string name = rec.kernels.count(id) ? rec.kernels.at(id) : "?";
    fill_kernel_[id] = name.find("FillFunctor") != std::string::npos;
    if (!opt_.relaunch) {
      funcs_[id] = drv_.add_kernel(name, {{0, bytes}, {bytes, 4}, {bytes + 8, 8}});
      continue;
    }
    const size_t slots = std::max<size_t>(w, 1);
    const uint32_t table = static_cast<uint32_t>(8 * (kTableHead + kTableSlot * slots));
    funcs_[id] = drv_.add_kernel(name, {{0, bytes}, {bytes, 4}, {bytes + 8, 8}, {bytes + 16, table}},
                                 [chk = &check_, slots, at = bytes + 16](const unsigned char* a) {
                                   run_table(a + at, slots, chk);
                                 });
  }

  // Births and deaths before each position (frees first: the allocator may reuse them).
  const size_t n = rec.launches.size();
  std::vector<std::vector<uint32_t>> born(n + 1), dies(n + 1);
  std::vector<uint32_t> before_step;  // ordinals alive when the step starts
  for (const TraceAlloc& a : rec.allocs) {
    if (a.alloc_pos >= 0) born[static_cast<size_t>(a.alloc_pos)].push_back(a.ordinal);
    else before_step.push_back(a.ordinal);
    if (a.free_pos >= 0) dies[static_cast<size_t>(a.free_pos)].push_back(a.ordinal);
  }
  // Allocations born in a step that outlive it become, next step, the ones of the same size
  // that the recording shows freed after having been born before the step (gradients).
  std::map<uint64_t, std::vector<uint32_t>> carried_by_size;  // bytes -> ordinals freed in-step
  for (uint32_t o : before_step)
    if (rec.allocs[o].free_pos >= 0) carried_by_size[rec.allocs[o].bytes].push_back(o);

  addr_.assign(rec.allocs.size(), 0);
  sig_.assign(rec.allocs.size(), 0);
  last_stream_.assign(rec.allocs.size(), 0);
  member_.assign(rec.allocs.size(), false);
  if (opt_.relaunch) written_.assign(rec.allocs.size(), 0);
  for (uint32_t o : before_step) alloc(o);

  for (int r = 0; r < opt_.repeats; ++r) {
    begin_step();
    for (size_t p = 0; p <= n; ++p) {
      for (uint32_t o : dies[p])
        if (addr_[o]) release(o);
      for (uint32_t o : born[p])
        if (!stopped_) alloc(o);
      if (p == n || stopped_) break;
      launch(r, p);
      if (stopped_) break;
      if ((p & 255) == 0) pump();
    }
    if (stopped_) {
      end_step();
      break;
    }
    carry_over(carried_by_size);
    if (opt_.mark_steps) tracker_.mark_step();
    end_step();
    pump();
  }
  if (acting()) {
    drv_.run_all();
    if (opt_.offload) ex_.poll();
    if (opt_.cap) opt_.cap->poll();
  }
  log_.drain([&](const Event& e, const AllocId* acc) { asm_.consume(e, acc); });
  for (StepTrace& t : asm_.take_ready(0, true)) res_.steps.push_back(std::move(t));
  res_.period = asm_.detector().period();
  res_.hook_ns_mean = tracker_.counters().hook_ns_mean();
  for (const StepTrace& t : res_.steps) {
    std::string why;
    if (same_step(rec, t, &why)) ++res_.matching_steps;
    else if (res_.first_mismatch.empty()) res_.first_mismatch = "step " + std::to_string(t.step) + ": " + why;
  }
  res_.stopped = stopped_;
  if (opt_.cap) {
    opt_.cap->detach();
    tracker_.set_gate(nullptr);
  }
  if (acting()) {
    ReplayOffload& ro = res_.offload;
    if (opt_.offload) ro.stats = ex_.stats();
    ro.vmm_misuses = drv_.vmm_stats().misuses;
    ro.launches_verified = check_.launches;
    ro.words_checked = check_.words;
    ro.mismatches = check_.mismatches;
    ro.first_mismatch = check_.first;
  }
  return std::move(res_);
}

}  // namespace

uint64_t peak_live_bytes(const StepTrace& t) {
  const size_t n = t.launches.size();
  std::vector<int64_t> delta(n + 1, 0);
  int64_t v = 0;
  for (const TraceAlloc& a : t.allocs) {
    if (a.alloc_pos < 0) v += static_cast<int64_t>(a.bytes);
    else delta[static_cast<size_t>(a.alloc_pos)] += static_cast<int64_t>(a.bytes);
    if (a.free_pos >= 0) delta[static_cast<size_t>(a.free_pos)] -= static_cast<int64_t>(a.bytes);
  }
  int64_t peak = n ? INT64_MIN : v;
  for (size_t i = 0; i < n; ++i) peak = std::max(peak, v += delta[i]);
  return static_cast<uint64_t>(std::max<int64_t>(peak, 0));
}

StepTrace scale_step(const StepTrace& t, uint32_t divisor) {
  StepTrace s = t;
  const uint64_t d = std::max<uint32_t>(divisor, 1);
  for (TraceAlloc& a : s.allocs) a.bytes = std::max<uint64_t>(64, round_up((a.bytes + d - 1) / d, 8));
  return s;
}

bool same_step(const StepTrace& a, const StepTrace& b, std::string* why) {
  auto fail = [&](std::string s) {
    if (why) *why = std::move(s);
    return false;
  };
  if (a.launches.size() != b.launches.size())
    return fail("launch count " + std::to_string(a.launches.size()) + " vs " + std::to_string(b.launches.size()));
  std::vector<Key> aa, ba;
  for (const TraceAlloc& x : a.allocs) aa.emplace_back(x.bytes, x.alloc_pos, x.free_pos);
  for (const TraceAlloc& x : b.allocs) ba.emplace_back(x.bytes, x.alloc_pos, x.free_pos);
  std::sort(aa.begin(), aa.end());
  std::sort(ba.begin(), ba.end());
  if (aa != ba) return fail("the allocations differ");
  for (size_t i = 0; i < a.launches.size(); ++i) {
    const TraceLaunch &x = a.launches[i], &y = b.launches[i];
    std::string xn = x.kind == EventKind::Kernel ? a.kernels.at(x.kernel) : "";
    std::string yn = y.kind == EventKind::Kernel ? b.kernels.at(y.kernel) : "";
    if (x.kind != y.kind || xn != yn || x.stream != y.stream)
      return fail("launch " + std::to_string(i) + " is a different launch");
    if (touched(a, x) != touched(b, y)) return fail("launch " + std::to_string(i) + " touches other allocations");
  }
  return true;
}

ReplayResult replay(const StepTrace& rec, const ReplayOptions& opt) {
  if (!opt.offload && !opt.cap) return Replayer(rec, opt).run();
  StepTrace scaled = scale_step(rec, opt.size_divisor);
  return Replayer(scaled, opt).run();
}

}  // namespace offload
