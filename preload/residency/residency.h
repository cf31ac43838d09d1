// Residency: the hard device budget, from the first allocation.
//
// With OFFLOAD_DEVICE_BUDGET set, every allocation of at least `min_bytes` is served here,
// from birth, on a virtual range of its own backed by physical handles mapped one after
// another: handles of `piece_max` bytes and one for the rest, so that the handles one range
// gives back back the next range of any size without a driver allocation (the device cannot
// map part of a handle, and making a 64 MiB handle costs about as much as ten mappings), while
// a range needs few mappings. Each live range is in one of four states:
//
//        alloc ──► RESIDENT ──evict──► COPYING_OUT ──copy done, unmapped──► ON_HOST
//                    ▲   ▲                 │ touched: the eviction is              │
//                    │   └─────────────────┘ abandoned (still mapped)              │
//                    │                                                             │
//                    └──── copy known done ◄── COPYING_IN ◄──── touched: reload ───┘
//
// The cap. What we hold (every physical handle: live ranges, ranges copying out, freed
// ranges kept for reuse) plus the share set aside for the allocator's pool (the allocations
// under min_bytes) never exceeds the budget. An allocation or a reload that would cross it
// first makes room: freed ranges kept for reuse go first, then resident ranges, least
// recently touched first, never one that the launch being made touches.
//
// Ordering (the invariants of the design). Before a range's bytes are copied out, the copy
// stream waits for an event on every stream that touched the range since it was last made
// resident, recorded after the last launch that touched it there (one event per launch on a
// stream, kept in a ring per stream, so that an old range's copy waits for that range's
// work and not for the whole stream); the physical memory is unmapped only once the copy is
// known complete. A copy out that an allocation or a launch starts is queued after the mappings
// that call makes (an access grant waits for copies to the host), and always before any stream
// waits for it or the host asks about it. A reload copies on the launching stream, before the
// launch is forwarded; another stream that touches the range before that copy is known complete
// waits for its event. A freed range is reused at once on the freeing stream (stream order), on
// another stream after an event wait, and unmapped only once the free is known complete; the
// freeing stream first waits for the other streams that touched the range, so one event stands
// for all of them.
//
// The launch scan is the page-fault handler: before_launch reloads what the launch touches.
// A launch that touches more than the budget can hold at once (its ranges plus the pool's
// share), or one we cannot see into (a graph, a kernel the driver cannot describe) while the
// live ranges do not fit, is refused with an error naming the kernel, the bytes and the
// budget: the hook returns out-of-memory and the launch never runs on missing memory.
//
// Threading: every entry point may come from any thread; one mutex guards the state and is
// held around driver calls, none of which re-enters the shim. The only blocking calls made
// under it are waits for our own copies out and for freed ranges' last work, when the budget
// needs their memory.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/env.h"
#include "core/driver.h"
#include "core/event_log.h"
#include "core/executor.h"
#include "core/tracker.h"
#include "residency/granter.h"
#include "residency/host_store.h"
#include "residency/range.h"
#include "residency/recompute.h"
#include "residency/residency_options.h"
#include "residency/residency_stats.h"
#include "residency/room_profile.h"
#include "residency/stream_ring.h"

namespace offload {

class Residency final : public LaunchGate, public DeviceRoom {
 public:
  using State = RangeState;
  using Options = ResidencyOptions;  // residency/residency_options.h
  using Stats = ResidencyStats;  // residency/residency_stats.h

  Residency(Driver& d, HostStore& host, Options o);
  ~Residency() override;
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  // Hooks. alloc: a range for an allocation of at least min_bytes (its address; *tag for the
  // tracker), 0 when the allocation is not ours (smaller), or 0 with *refused set when the
  // budget cannot hold it (the hook answers out-of-memory; error() says why).
  DevPtr alloc(uint64_t bytes, Stream s, uint64_t* tag, bool* refused);
  // True if `p` is a range of ours (the allocator must not see the free).
  bool free(DevPtr p, Stream s);
  // An allocation under min_bytes about to go to the allocator's pool: grows the pool's share
  // first when the pool would need it. False when the budget cannot hold it.
  bool admit_small(uint64_t bytes);
  // The allocator served it at p (also an allocation alloc left to the pool: Options::pool_short).
  void small_allocated(uint64_t bytes, DevPtr p = 0);
  void small_freed(uint64_t bytes, DevPtr p = 0);
  uint64_t min_bytes() const { return o_.min_bytes; }
  uint64_t budget() const { return o_.budget; }
  // DeviceRoom: bytes another owner holds under this budget (a plan's arenas, core/executor.h),
  // counted as ours. take makes room for them first, as an allocation would (false: it cannot);
  // while any are held nothing is evicted ahead of need, as the plan made room for what it moves.
  bool take(uint64_t bytes, Want want) override;
  void give(uint64_t bytes) override;
  uint64_t external() const {
    std::lock_guard<std::mutex> lk(mu_);
    return external_;
  }
  // A launch refused on this thread and not yet taken (take_refusal). While another owner holds
  // room, a refused launch or allocation is neither counted nor said unless made under LastTry:
  // that owner may give the room back (CapAndPlan, Executor::shed) and it be tried again.
  static bool refusal_pending();
  struct LastTry {
    LastTry();
    ~LastTry();
  };

  void before_launch(uint64_t launch_no, EventKind kind, uint32_t kernel, Stream s, const AllocId* acc, size_t n,
                     uint8_t flags) override;
  // The hook forwarded the launch before_launch saw on this thread: its ranges are no longer
  // in flight, and an event on its stream now captures it.
  void after_launch();
  void note_pointer_table(AllocId table, const AllocId* targets, size_t n) override;
  // A small allocation was freed: a pointer table it held goes, and a producer that read it is
  // never made again (Options::recompute).
  void forget_table(AllocId table, Stream s = 0);
  // A launch before_launch refused on this thread (the hook returns out-of-memory); cleared.
  static bool take_refusal();
  // The last launch before_launch saw on this thread was on a stream capturing a CUDA graph.
  // Nothing runs at a capture, so nothing is reloaded, marked in flight or evicted for it (work
  // or events queued on that stream would join the graph); the graph's launch, which the shim
  // cannot see into, makes every range resident first.
  static bool last_launch_captured();
  // A pointer query that announces a use: an evicted range is reloaded (and waited for).
  void prepare_access(DevPtr p);
  // Names kernels in the refusal's message (FuncRegistry ids to names); may be unset.
  using Namer = std::string (*)(void* ctx, uint32_t kernel);
  void set_namer(Namer n, void* ctx) { namer_ = n, namer_ctx_ = ctx; }
  // Options::recompute: the allocation holding a device address, as the tracker knows it (its id,
  // base and size); false: none. Small allocations a producer reads are found through it.
  using Finder = bool (*)(void* ctx, DevPtr p, AllocId* id, DevPtr* base, uint64_t* bytes);
  // The largest plain id the finder's table has held (alloc_horizon): without it no small
  // allocation is known to be new at a launch, and none is a producer's small side.
  using Horizon = AllocId (*)(void* ctx);
  void set_finder(Finder f, void* ctx, Horizon h = nullptr) { finder_ = f, finder_ctx_ = ctx, horizon_ = h; }

  // Worker: finishes copies out that have completed, gives host slots back, and trims the
  // allocator's pool to its share when it holds more.
  void poll();
  void end_grants();  // at exit: the grants asked for are made, and the Granter's thread joined
  // Worker: the training step repeats every `launches` launches (0: not known). With it the
  // victim is the range whose next use, a step after its last ones, is furthest away
  // (Belady's rule); without it, the least recently touched.
  void set_period(uint64_t launches);
  Stats stats() const;
  HostStore::Stats host_stats() const { return host_.stats(); }
  // OFFLOAD_CAP_RECOMPUTE: the `n` writers that kept the most bytes from being made again (each
  // the last write since the range's producer), "name: ranges, GiB; ..."; "" if none.
  std::string rc_top_writers(size_t n) const;
  std::string error() const;  // the last refusal, said plainly; "" if none
  State state_of(DevPtr p) const;  // tests (the range holding p; Resident if not ours)
  // Options::extra_auto's limit: what one handle made costs in pieces mapped and unmapped.
  static constexpr uint64_t kExtraAutoMost = 32;
  // Options::recompute: launches of a kernel whose writes are watched (probed) before they are
  // taken as known: a launch that writes a range without changing its bytes (an in-place ReLU of
  // values already positive) hides that write, and another launch, on other values, may show it.
  static constexpr uint8_t kRecomputeProbes = 3;
  static_assert(Options{}.kernel_probes == 4 * kRecomputeProbes);
  static uint64_t extra_for(uint64_t create_ns, uint64_t piece_ns) {
    return std::clamp<uint64_t>((create_ns + piece_ns - 1) / std::max<uint64_t>(piece_ns, 1), 1, kExtraAutoMost);
  }
  struct InFlight;

 private:
  using Piece = residency_range::Piece;
  using Spare = residency_range::Spare;
  using Range = residency_range::Range;
  static constexpr uint64_t kNoKey = residency_range::kNoKey;
  static constexpr size_t kLifeUses = 64;  // uses of one life remembered

  void note_footprint();
  // What we and the pool may hold: the budget less the headroom and the outside growth.
  uint64_t limit() const { return o_.budget - std::min(o_.budget, outside_ + o_.headroom + external_); }
  void refresh_outside();
  bool give_host_read();             // host slots whose copies in have ended go back; any did
  void* take_host(uint64_t bytes);  // a host slot, from pinned room first (see there)
  uint64_t see_pool();  // what the pool holds now; notes it, and any excess over its share
  void open_inflight(InFlight& f, Stream s, uint64_t launch_no);  // under mu_
  void close_inflight(InFlight& f);  // under mu_
  // before_launch's parts: a launch recorded into a graph (nothing moves; its ranges are kept),
  // the live ranges a launch touches (sorted, each once), and a touched range's bookkeeping (its
  // uses, its streams, pinned in flight).
  void note_captured(uint64_t launch_no, Stream s, const AllocId* acc, size_t n);
  void collect_touched(bool blind, const AllocId* acc, size_t n, std::vector<uint32_t>* out) const;
  void mark_touched(uint32_t k, Stream s, uint64_t launch_no, InFlight& f);
  // Until `need` bytes fit the budget (spares that back them, or room for new handles): ranges
  // copying out give their handles or finish, spares that cannot back them and freed ranges go
  // back, and resident ranges
  // not in `keep` nor in flight are evicted, least recently touched first.
  bool make_room(uint64_t need, const uint32_t* keep, size_t nkeep, std::string* why);
  uint64_t short_of(uint64_t need);  // bytes the budget lacks for `need` with the spares that back it
  bool start_evict(uint32_t slot, std::string* why);  // the copy out: queued, or held back (DeferCopies)
  // Queues a started eviction's copy out: after the work of every stream that touched the range.
  void enqueue_copy_out(uint32_t slot);
  // Copies out held back are queued before anything asks about, waits for or orders work after
  // their events (the helpers below call ensure_recorded), at the next mapping's end (back_range),
  // and when the hook's call ends (DeferCopies). Until then nothing else sees them as queued.
  void flush_copies();
  void ensure_recorded(uint64_t e);  // flush_copies if `e` is a held-back copy's event
  struct DeferCopies {
    Residency& r;
    explicit DeferCopies(Residency& res) : r(res) { r.defer_copies_ = r.o_.copies_after_maps; }
    ~DeferCopies() {
      r.defer_copies_ = false;
      r.flush_copies();
    }
  };
  // Options::evict_before_busy_release: resident ranges (not in `keep`, furthest next use first)
  // with a handle that can back part of `need` are evicted and give their handles until it fits;
  // false when they cannot make it fit.
  bool evict_for_handles(uint64_t need, const uint32_t* keep, size_t nkeep, std::string* why);
  void finish_evict(uint32_t slot);  // waits for the copy out, unmaps; the handles are spares
  void release_freed(uint32_t slot);  // a freed range: waits for its free, unmaps; handles spare
  // A freed range (taken out of cached_) whose free may not be complete: its handles become
  // spares with its free's event at once, and it is unmapped once the free is (retire_done).
  void let_go_freed(uint32_t slot);
  void retire_done(uint32_t slot);  // waits for the free if need be, unmaps, gives the slot back
  // Its handles still spare with `event` (the copy or free it gave them before): nothing left to
  // wait for. A handle given on since then carries another range's event, which stays.
  void no_wait_for(const Range& r, uint64_t event);
  // What a range given the handles of `r`, copying out, waits for: its copy out, or, with nothing
  // copied (clean_out), its copy in.
  static uint64_t handover_event(const Range& r) { return r.in_done ? r.in_done : r.copy_event; }
  void abandon(Range& r);             // a range copying out is touched: it stays
  void carry_out(Range& r);           // free_event recorded after r.carry's waits, if any
  void copied_in(Range& r);           // its copy in known complete: resident, r.carry covered there
  // A range freed while copying out, its handles handed on: retired (retiring_, its address out
  // of by_va_) once the last work on its memory ends, its host slot given back then, and no host
  // wait now.
  void retire_copying(uint32_t slot);
  // Handles mapped under r.va from `from` (its pieces up to there stay) to r.bytes, for work
  // queued on `s` (which waits for given handles' copy out).
  // `copied_into`: a copy is queued into it next, which needs its grant made first (the driver
  // checks a copy's memory when it is called): granted here even with Options::grant_apart.
  bool back_range(Range& r, Stream s, std::string* why, uint64_t from = 0, bool copied_into = false);
  // alloc's ranges, under mu_. reuse_cached: a freed range of `size` kept for reuse, live again
  // on `s` (its address; 0: none kept, as no range's address is 0). new_range: a range made for
  // `size`, room made first; 0 with *refused and error_ set when the budget cannot hold it (*why:
  // the reason found so far, if any).
  DevPtr alloc_range(uint64_t size, uint64_t key, Stream s, uint64_t* tag, bool* refused);  // alloc's, under mu_
  DevPtr reuse_cached(uint64_t size, uint64_t key, Stream s, uint64_t* tag);
  DevPtr new_range(uint64_t size, uint64_t key, Stream s, uint64_t* tag, bool* refused, std::string* why);
  // A freed range refitted to serve an allocation of `size` on `s` (refit): its slot, or -1 when
  // none changes fewer mapped bytes than a new range would. *refused when the budget cannot hold it.
  int32_t refit_cached(uint64_t size, Stream s, std::string* why, bool* refused);
  // Pieces kept (from the first) and their bytes when r serves `size`; false: r cannot.
  bool refit_plan(const Range& r, uint64_t size, size_t* keep, uint64_t* kept) const;
  // Whether a handle of r can back part of `need` (with one handle per range: one of its size).
  bool can_back(const Range& r, uint64_t need) const;
  // Ranges still copying out give their handles to the spares, with their copy's event, until
  // `need` fits: the stream that maps one waits for that copy on the GPU, and the host does not.
  bool give_copies(uint64_t need);
  // Before `handle` is released: a range it was given from unmaps it first.
  void settle_given(uint64_t handle);
  bool reload(uint32_t slot, Stream s, std::string* why, bool keep_host = false);
  void give_host_after(Range& r, uint64_t event);  // its host slot goes back once `event` is done
  void give_host_after_copies(Range& r);           // ... once the copies queued so far are done
  bool release_clean(Range& r);  // its host copy kept since a prefetch goes back (after the copy in); any
  // A range on the host back on `s`: room made (`keep` kept) and copied in, or, dropped, made
  // again from its inputs (rc_restore); false with *why when the room cannot be had.
  bool bring_back(uint32_t slot, Stream s, const uint32_t* keep, size_t nkeep, std::string* why);
  // A range backed again on `s` (copied in or made again): its event there, and other streams
  // wait for it until it is known complete.
  void copying_in(Range& r, Stream s);
  uint64_t event_after(Stream s, uint64_t launch);  // an event capturing `launch` on s
  uint64_t next_use_distance(const Range& r, uint64_t now) const;  // larger: a better victim
  uint64_t range_size(uint64_t bytes) const;  // the bytes a range for an allocation maps
  // Launches until the range's next use as the step's period predicts it; false: no prediction.
  bool predicted_next_use(const Range& r, uint64_t now, uint64_t* dist) const;
  // An allocation's place in the step (launch % period, births there, size; kNoKey before the
  // period is known); a range born there, and the uses predicted for it.
  uint64_t birth_key(uint64_t size);
  void note_birth(Range& r, uint64_t key);
  // Options::pool_short: the allocation born at `key` goes to the allocator's pool, its share of
  // the budget grown for it (pool_short.cpp).
  bool pool_short(uint64_t bytes, uint64_t key);
  bool admit_locked(uint64_t bytes, bool quiet);  // admit_small's body, under mu_
  // The pool's share, grown for allocations since freed, back down towards `most` as far as the
  // pool (trimmed) allows: a launch's ranges or an allocation need the room. False: not to `most`.
  bool shrink_pool_share(uint64_t most);
  void note_death(const Range& r);           // a short life's uses become the prediction at its place
  void note_span(uint64_t key, uint64_t span, bool moved);  // Options::pool_short: a life's length at its place
  void pick_victims(std::vector<uint32_t>* out, const uint32_t* keep, size_t nkeep, uint64_t now);
  void evict_ahead(const uint32_t* keep, size_t nkeep);  // down to the low-water mark, no waiting
  void prefetch_due(uint64_t launch_no);  void prefetch_one(uint32_t k, uint64_t d, uint64_t launch_no);  // d: to its use
  bool held(const Range& r, uint64_t now, uint64_t d) const;  // Options::prefetch_hold
  bool room_ahead(uint32_t k, uint64_t d, uint64_t now) const;  // Options::prefetch_room
  uint64_t projected() const;  // held (the pool's share too) once copies out, freed ranges, spares go
  // Freed ranges kept for reuse, one let go for room (false: none kept); with keep_asked and the
  // period known, the one whose size the step asks for again furthest ahead. note_ask records an
  // allocation's size where in the step it is asked for; next_ask: launches until the step before
  // asked for that size again (UINT64_MAX: it did not).
  bool let_go_cached();
  void note_ask(uint64_t size);
  uint64_t next_ask(uint64_t size, uint64_t now) const;  // reloads ranges whose predicted use is within the lead
  // Options::recompute (recompute.cpp). rc_note_launch: after a launch's reloads, what it may
  // write (versions), whether it produced a range, and a probe of its kernel's writes.
  // rc_remake: a backed range made again by its producer on `s`; false: copy it in.
  void rc_note_launch(uint32_t kernel, Stream s, uint64_t launch_no, const AllocId* acc, size_t n,
                      const std::vector<uint32_t>& touched, bool blind);
  // Its parts: the range an update in place makes (-1: none); versions moved for what it may
  // write; the small allocations it may write (*table: it touches an arena or pointer table);
  // whether the ranges written besides `fresh` (*side_bytes) were each seen at a side position;
  // an update's chain taken as its prelude.
  int64_t rc_made_in_place(const std::vector<uint32_t>& touched);
  recompute::Made rc_bump_touched(uint32_t kernel, recompute::KernelKnow& kk, const std::vector<uint32_t>& touched,
                                  int64_t made, bool blind);
  bool rc_note_small_writes(const AllocId* acc, size_t n, bool* table);
  bool rc_side_known(const recompute::KernelKnow& kk, uint32_t fresh, uint64_t* side_bytes) const;
  void rc_take_prelude(recompute::KernelKnow& kk, uint32_t kernel, uint32_t fresh, int32_t prelude);
  bool rc_remake(uint32_t slot, Stream s);
  void rc_count_kept_back(const Range& r);  // copied back for its last writer (rc_top_writers)
  // Before a launch touching no range: the small allocations it touches taken as written.
  void rc_note_smalls_only(bool blind, const AllocId* acc, size_t n, Stream s, uint64_t launch_no);
  void rc_new_life(Range& r);            // born or freed: no producer, a new version
  // Whether a range being evicted can be dropped instead of copied out: its kernel trusted, its
  // inputs unchanged and none dropped (resident or with their bytes on the host), and room at any
  // later launch for it and them.
  bool rc_can_drop(uint32_t slot) const;
  void rc_drop(Range& r);    // evicted without a copy: its inputs gain a dependent
  void rc_undrop(Range& r);  // made again, or kept: its inputs lose a dependent
  // A range on the host whose producer's kernel has not been checked yet, with inputs to reload
  // first: worth making again (rc_restore) for the check, where a copy in would never give one.
  bool rc_check_wanted(uint32_t slot) const;
  uint64_t rc_restore_bytes(uint32_t slot) const;  // the room rc_restore takes: it, its inputs away, the side buffer
  // A dropped range made again on `s` (its inputs reloaded first, room made for all of them, `keep`
  // kept); false (with *why) only when the room cannot be had.
  bool rc_restore(uint32_t slot, Stream s, const uint32_t* keep, size_t nkeep, std::string* why);
  // `keep`, then `slot`, its producer's inputs and side: what making it again must not evict (unsorted).
  void rc_keep_list(const recompute::Producer& p, uint32_t slot, const uint32_t* keep, size_t nkeep,
                    std::vector<uint32_t>* out) const;
  // Before a launch that may write, or a free of, a range that dropped ranges are made from: they
  // are made again first, on `s`. `written`: the touched slots to look at.
  // `freeing`: a free, which ranges written besides a dropped one (its side) wait for too.
  bool rc_guard(const std::vector<uint32_t>& written, Stream s, const uint32_t* keep, size_t nkeep, std::string* why,
                bool freeing = false);
  // A producer's side (recompute_side.cpp): the buffer it is kept in, `bytes` at least, usable on
  // `s` (made once, room made with `keep` kept, or where it fits as things are with none); room for
  // it before a range is brought back; its handles let go; its ranges live where the arguments
  // point (`resident`: backed); saved and zeroed, and put back around the launch made again.
  bool rc_side_buffer(uint64_t bytes, Stream s, const uint32_t* keep, size_t nkeep, std::string* why);
  void rc_side_room(uint32_t slot, Stream s, const uint32_t* keep, size_t nkeep);
  void rc_side_release();
  bool rc_side_ready(const recompute::Producer& p, bool resident) const;
  bool rc_side_unchecked(const recompute::Producer& p) const;  // a side position not checked yet
  bool rc_side_save(const recompute::Producer& p, Stream s);
  void rc_side_put_back(const recompute::Producer& p, Stream s);
  bool rc_launch_again(const recompute::Producer& p, Stream s);  // its launch once more, on `s`
  // A launch made again into `r`, compared with its copy on the host where its kernel (or its
  // side's positions) is not checked yet; false: it differed (banned, or its side refused).
  bool rc_check_remade(const recompute::Producer& p, const Range& r, Stream s);
  // The touched slots (sorted) a launch of `kernel` may write, into rc_.written: those its kernel
  // was seen to write at the same argument positions (rc_.learned), else all. Its positions go
  // into rc_.at and rc_.at_slot; false when the launch cannot be described (no arguments).
  bool rc_may_write(uint32_t kernel, bool blind, const std::vector<uint32_t>& touched, const AllocId* acc, size_t n);
  // The small allocations this launch may write (rc_.small_hit) can be kept as its small side,
  // beside `side_bytes` of ranges.
  bool rc_small_side_kept(const recompute::KernelKnow& kk, uint64_t side_bytes) const;
  // Small allocations (recompute_small.cpp): the launch's index of the one holding `v` among
  // acc's, -1: none; versions moved; whether a producer's are as it read them.
  int32_t rc_small_at(DevPtr v, const AllocId* acc, size_t nsmall);  // acc's first nsmall: small
  bool rc_small_may_write(AllocId id) const;  // by its positions in this launch (rc_may_write's)
  int32_t rc_small_index(AllocId id) const;   // its index among the launch's (rc_.smalls), -1: none
  void rc_bump_small(AllocId id);
  void rc_bump_smalls(bool all, const AllocId* acc, size_t n);
  bool rc_smalls_kept(const recompute::Producer& p) const;
  bool rc_small_sides_live(const recompute::Producer& p) const;  // each followed and not freed
  // The followed small allocations a launch may write, into rc_.small_writes (blind: all; not
  // learned: all it touches); dropped ranges made from them made again first, on `s`.
  void rc_small_writes(bool blind, const AllocId* acc, size_t n);
  // freeing: rc_.small_writes are being freed (a dropped range keeping one as its side goes too).
  bool rc_guard_smalls(Stream s, const uint32_t* keep, size_t nkeep, std::string* why, bool freeing = false);
  // Followed small allocations a launch on `s` touches (blind: all): a touch each, and the launch
  // waits for a launch made again on another stream that put one back.
  void rc_touch_smalls(bool blind, const AllocId* acc, size_t n, Stream s, uint64_t launch_no);
  // Raises rc_small_floor_ past what a launch touches; returns it as it was before the launch.
  AllocId rc_floor_smalls(bool blind, const AllocId* acc, size_t n);
  void rc_follow_small(AllocId id);    // a producer lists it
  void rc_unfollow_small(AllocId id);  // one fewer does
  // The dropped ranges in rc_.deps made again on `s` (a guard's: before a write or free).
  bool rc_restore_deps(Stream s, const uint32_t* keep, size_t nkeep, std::string* why);
  std::pair<DevPtr, uint64_t> rc_span(const recompute::Probe& pr, uint32_t k) const;  // what a probe hashes at k
  // A probe of `kernel`'s writes at this launch, where they matter and none runs (before it is
  // forwarded: the hashes before); rc_finish_probe, from after_launch: what it wrote.
  void rc_start_probe(uint32_t kernel, Stream s, const std::vector<uint32_t>& touched, bool makes_new);
  void rc_finish_probe();
  void rc_drop_producer(Range& r);
  void rc_free_producer(int32_t id);  // a producer record and its preludes, back to the free list
  // Its producer and that one's preludes read nothing (fills, kMaxPrelude deep at most): a launch
  // that writes it makes it, with them as its prelude.
  bool rc_fill_only(const Range& r) const;
  // Its producer chain can run again, as it did, before a launch that writes it in place (an
  // update: a bias added, a mask applied): no side, no kernel banned, every input as it was read,
  // kMaxPrelude deep at most. rc_not_updatable says which of those fails (nullptr: none).
  const char* rc_not_updatable(const Range& r, uint32_t slot) const;
  bool rc_updatable(const Range& r, uint32_t slot) const { return !rc_not_updatable(r, slot); }
  // The inputs of a producer's preludes, moved to it: the chain is made again only while all are
  // as they were read, and none is written or freed while it is dropped.
  void rc_gather_inputs(int32_t head);
  bool rc_prelude_banned(const recompute::Producer& p) const;  // a kernel it launches first was banned since
  // A kernel it launches first that reads something and was never checked (alone or in a chain):
  // its chain's remake is compared with the copy on the host, as an unchecked kernel's is.
  bool rc_chain_unchecked(const recompute::Producer& p) const;
  bool rc_member_unchecked(const recompute::Producer& q) const;  // one such kernel of a chain
  // Its launch made again needs no comparison: its kernel, its side's positions and its chain's
  // kernels are all checked.
  bool rc_all_checked(const recompute::Producer& p) const;
  bool rc_launch_preludes(const recompute::Producer& p, Stream s);  // its small sides' fills, then its own, on `s`
  bool rc_launch_chain(int32_t head, Stream s);                    // a prelude chain, oldest first
  // A launch's record to launch it again (its arguments copied), as a free producer record.
  int32_t rc_record_launch(uint32_t kernel, const LaunchArgs* a, uint32_t len);
  // A kernel launch that points at small allocation `id` and at nothing else tracked (a fill):
  // recorded for the producer that writes `id` as its side. False: not (the floor is raised).
  bool rc_note_small_fill(uint32_t kernel, AllocId id, const LaunchArgs* a, uint32_t len);
  static bool rc_described(const LaunchArgs* a);     // what it takes to launch it again is there
  static uint32_t rc_args_len(const LaunchArgs& a);  // its arguments' bytes (of one described)
  void rc_looked_at_name(recompute::KernelKnow& kk, uint32_t kernel) const;  // kk.rng: its name says it draws random numbers
  // The producer of range `fresh` from this launch (recompute_producer.cpp); the log's lines naming
  // a kernel kept from being one for writing outside the ranges, or besides its range (`never`:
  // why that is not kept; nullptr: kept).
  void rc_record_producer(uint32_t kernel, const LaunchArgs* a, uint32_t fresh, const std::vector<uint32_t>& touched,
                          uint32_t len);
  void rc_say_small(recompute::KernelKnow& kk, uint32_t kernel, uint32_t fresh, bool table);
  void rc_say_side(recompute::KernelKnow& kk, uint32_t kernel, uint32_t fresh, const char* never);
  void rc_say_took(recompute::KernelKnow& kk, uint32_t kernel, uint32_t slot, int32_t producer);
  void rc_say_written(const Range& r, const recompute::Producer& p);  // why its remake is refused for a write
  // Device bytes copied to the host a chunk at a time after `s`'s work, each(chunk, offset, n)
  // until it answers false (recompute_bytes.cpp); their hash, or whether they equal `host`'s.
  template <class Each>
  bool rc_read(DevPtr va, uint64_t bytes, Stream s, Each each);
  uint64_t rc_hash(DevPtr va, uint64_t bytes, Stream s);
  bool rc_same(DevPtr va, const void* host, uint64_t bytes, Stream s);
  // An input a producer recorded at version `v`, still as it was and able to make it again.
  // An input as the producer read it: written since, it moved on; dropped, it is made again first
  // (a chain, within kMaxChain: rc_need).
  bool rc_input_kept(const Range& in, uint64_t v) const {
    return in.live && in.version == v && !in.in_graph &&
           (!in.dropped || o_.fault != Options::Fault::RecomputeNoChains);
  }
  // The room making `slot` again takes at most: it, its side and buffer, and each input, a dropped
  // one with the room making it again takes; UINT64_MAX past kMaxChain dropped ranges deep.
  static constexpr int kMaxChain = 16;
  uint64_t rc_need(uint32_t slot, int depth = 0) const;
  uint64_t lead_ceiling() const { return std::max<uint64_t>(1, std::min(period_ / 4 + 1, o_.prefetch_lead_max)); }
  // Launches ahead within which a range is used "soon": a prefetch would bring it back.
  uint64_t lead_reach() const { return std::max<uint64_t>(8, pf_lead_); }
  bool room_without_waiting(uint64_t need);
  bool fits(uint64_t need) const;  // the handover, spares that tile it, and room under the limit
  // The spares a range of `need` bytes maps (cleared first), the largest that fit first, in at
  // most extra_pieces more than the fewest that back it; their bytes.
  uint64_t pick_spares(uint64_t need, std::vector<std::multimap<uint64_t, Spare>::const_iterator>* out) const;
  uint64_t spare_cover(uint64_t need) const { return pick_spares(need, &picks_); }
  // Spares that cannot back `need` go until it fits: those whose last work is done first, then,
  // with busy_too, those whose release waits for a copy or a freed range's work.
  void release_spares_for(uint64_t need, bool busy_too);
  void unmap_pieces(const Range& r);
  // Small ranges backed whole: while making a handle costs at most twice a piece's mapping and
  // unmapping (running averages; whole until both are known). Decided at the start of an
  // allocation or a launch only: within one, every look at the spares must agree, or the room
  // made for a range would not be the room it takes.
  // So is the limit on extra pieces (Options::extra_auto).
  bool whole_pays() const { return whole_now_; }
  void decide_costs() {
    const bool known = o_.whole_measured && create_avg_ && map_avg_;
    const uint64_t piece = map_avg_ + unmap_avg_;
    whole_now_ = !known || create_avg_ <= 2 * piece;
    extra_now_ = o_.extra_auto && known ? extra_for(create_avg_, piece) : o_.extra_pieces;
  }

  static void average(uint64_t* avg, uint64_t sample) { *avg = *avg ? *avg - *avg / 8 + sample / 8 : sample; }
  // Handles become spares; `event`: work that still uses them, which whoever maps one waits for.
  void add_spare(uint64_t bytes, uint64_t handle, uint64_t event) {
    spares_.emplace(bytes, Spare{handle, event});
    spare_bytes_ += bytes;
  }
  void add_spares(const std::vector<Piece>& pieces, uint64_t event) {
    for (const Piece& p : pieces) add_spare(p.bytes, p.handle, event);
  }
  void spare_pieces(Range& r);  // its handles (unmapped) become spares
  void reap_copies();  // copies out known complete: their handles become spares
  void refuse_launch(uint32_t kernel, uint64_t bytes, size_t ranges, const std::string& why);
  void count_refused_alloc();  // not while another owner may give room back first (LastTry)
  uint64_t new_event();
  void drop_event(uint64_t e);
  int32_t slot_of(DevPtr p) const;  // the live or cached range holding p; -1 none
  void add_touch(Range& r, Stream s, uint64_t launch) { note_touch(r.touches, s, launch); }
  static void note_touch(std::vector<recompute::Touch>& touches, Stream s, uint64_t launch);  // the last per stream
  void order_after_touches(Stream s, const std::vector<recompute::Touch>& touches);  // after those on other streams

  Driver& d_;
  HostStore& host_;
  Options o_;
  std::unique_ptr<Granter> granter_;  // Options::grant_apart, where the driver offers its word
  bool grant_pending(const Range& r) const { return r.grant_no && granter_ && granter_->done() < r.grant_no; }
  void grant_wait(const Range& r);  // the host waits for r's grant, if any is still pending
  void grant_wait_for(uint64_t grant_no);  // the host waits for the Granter's grant number, counted
  uint64_t gran_ = 0;
  mutable std::mutex mu_;
  std::vector<Range> slots_;
  std::vector<uint32_t> free_slots_;
  std::map<DevPtr, uint32_t> by_va_;                 // live and cached ranges
  std::multimap<uint64_t, uint32_t> cached_;         // freed ranges kept mapped, by size
  std::multimap<uint64_t, Spare> spares_;            // handles held and free to map, by size
  mutable std::vector<std::multimap<uint64_t, Spare>::const_iterator> picks_;  // scratch
  std::vector<uint64_t> run_handles_, run_sizes_;                               // scratch
  std::unordered_map<Stream, StreamRing> rings_;
  std::unordered_map<AllocId, std::vector<AllocId>> tables_;  // pointer tables' range targets
  std::vector<uint64_t> spare_events_;
  struct PendingHost {
    void* host;
    uint64_t bytes;
    uint64_t event;  // the copy that still uses the slot
  };
  std::vector<PendingHost> pending_host_;
  std::vector<uint32_t> scratch_;                    // before_launch's touched slots
  std::vector<std::pair<Stream, uint64_t>> busy_streams_;  // reap_copies': the earliest free found running on each
  uint64_t frees_recorded_ = 0;                      // numbers the frees' events (Range::free_seq)
  Stream copy_stream_ = 0;
  uint64_t small_live_ = 0;
  uint64_t pool_seen_ = 0;  // what the pool held at the last look
  uint64_t pool_share_ = 0;
  uint64_t held_ = 0;
  uint64_t external_ = 0;  // DeviceRoom's: taken by another owner, off the limit
  uint64_t largest_need_ = 0;  // the most bytes one launch's ranges, or one allocation, needed so far
  uint64_t launches_seen_ = 0;
  uint64_t outside_base_ = UINT64_MAX, outside_ = 0;
  uint64_t period_ = 0;
  uint64_t create_avg_ = 0, map_avg_ = 0, unmap_avg_ = 0;  // ns per handle made, per piece mapped or unmapped
  bool whole_now_ = true;
  uint64_t extra_now_ = 0;  // decide_costs(); Options::extra_pieces until the first
  uint64_t out_bytes_ = 0;                  // bytes of ranges copying out
  // Launches that passed, lately, between a copy out's start and its end being found (a moving
  // average; Stats::out_lag): how deep the copy stream's queue runs, in the step's own units.
  uint64_t out_lag_ = 0;
  uint64_t cached_bytes_ = 0, spare_bytes_ = 0;  // of freed ranges kept, of spare handles
  std::vector<uint32_t> copying_out_;       // their slots
  bool defer_copies_ = false;               // inside an allocation's or a launch's call (DeferCopies)
  std::vector<uint32_t> deferred_, flushing_;  // evictions started there whose copies are not queued yet
  std::vector<uint32_t> retiring_;          // freed ranges let go (let_go_freed), still mapped
  Stream prefetch_stream_ = 0;
  uint64_t pf_lead_ = 0;                    // launches ahead of a predicted use that it is reloaded
  uint64_t pf_wasted_at_ = 0;               // 1 + the launch count when a prefetch last went out unused
  std::atomic<uint64_t> last_launch_{0};    // the last launch number any before_launch saw
  uint64_t birth_launch_ = 0, births_there_ = 0;  // allocations since that launch, for keys
  uint64_t copy_touches_ = 0;  // numbers the copy stream's touches of abandoned ranges
  // Place of birth in the step -> the launches after birth that touched the range last born there.
  std::unordered_map<uint64_t, std::vector<uint32_t>> lives_;
  // Options::pool_short. Place of birth -> how many launches the last one born there lived, and
  // whether it was evicted; the allocations left to the pool (address -> place, birth).
  struct ShortLife {
    uint32_t span = 0;
    bool moved = false;
  };
  std::unordered_map<uint64_t, ShortLife> spans_;
  struct Pooled {
    uint64_t key, birth;
  };
  std::unordered_map<DevPtr, Pooled> pooled_;
  uint64_t pooled_live_ = 0;
  uint64_t pool_need_ = 0;  // admit_locked is making room for the share to hold this much
  static thread_local uint64_t tl_pool_key;  // alloc left it to the pool: its place, until small_allocated
  // Sizes allocated in the step before and in this one -> where in the step (launch % period), in order.
  std::unordered_map<uint64_t, std::vector<uint32_t>> asks_prev_, asks_now_;
  uint64_t asks_step_ = UINT64_MAX;
  std::vector<uint32_t> victims_; std::vector<std::pair<uint64_t, uint32_t>> pf_due_;  // scratch
  RoomProfile room_;  // Options::prefetch_room
  Stats st_;
  std::string error_;
  Namer namer_ = nullptr;
  void* namer_ctx_ = nullptr;
  Finder finder_ = nullptr;
  Horizon horizon_ = nullptr;
  // One above every small allocation's id that some launch, copy or memset has touched (every one
  // born before a launch we cannot see into): one at or above it is new at the next launch.
  std::atomic<AllocId> rc_small_floor_{0};
  void* finder_ctx_ = nullptr;
  std::atomic<bool> rc_small_watch_{false};  // a producer reads or writes a small allocation: launches touching only those are looked at
  recompute::State rc_;  // Options::recompute (residency/recompute.h)
  Range rc_side_;        // rc_side_buffer's, outside slots_: never a victim
  struct RcWriting {
    Residency& r;
    RcWriting(Residency& res, bool on) : r(res) { r.rc_.writing = on; }
    ~RcWriting() {
      r.rc_.writing = false;
      r.rc_.prepared = false;
      r.rc_.writes.clear();
      r.rc_.small_writes.clear();
    }
  };
  std::atomic<bool> any_{false};  // a range exists: launches must be looked at
  bool capture_open_ = false;     // a capture on capture_stream_ since capture_from_
  Stream capture_stream_ = 0;
  uint64_t capture_from_ = 0;     // its first captured launch
  std::atomic<uint64_t> busy_ns_{0};
  std::atomic<uint64_t> lock_ns_{0};  // of busy_ns_: the hooks' waits for mu_ (the worker's poll holds it)
  // A hook's call under mu_: its whole time goes to busy_ns_ (waiting for mu_ counts), and the
  // part spent getting mu_ to lock_ns_.
  struct Busy {
    Residency& r;
    uint64_t t0;
    std::lock_guard<std::mutex> lk;
    explicit Busy(Residency& res) : r(res), t0(mono_now_ns()), lk(res.mu_) {
      r.lock_ns_.fetch_add(mono_now_ns() - t0, std::memory_order_relaxed);
    }
    ~Busy() { r.busy_ns_.fetch_add(mono_now_ns() - t0, std::memory_order_relaxed); }
  };
  static uint64_t mono_now_ns() { return static_cast<uint64_t>(mono_ns()); }
  void wait_event(uint64_t e);  // the host waits for `e`; counted, by the site set (WaitAt)
  enum class WaitSite : uint8_t { Other, Room, Release, Abandon };
  WaitSite wait_site_ = WaitSite::Other;
  struct WaitAt {  // the site of the waits made within its scope (the innermost counts)
    Residency& r;
    WaitSite prev;
    WaitAt(Residency& res, WaitSite site) : r(res), prev(res.wait_site_) { r.wait_site_ = site; }
    ~WaitAt() { r.wait_site_ = prev; }
  };
  // The driver's event calls, timed (Stats::event_ns): a query, a record, a stream's wait, a new one.
  int query_event(uint64_t e);
  bool record_event(uint64_t e, Stream s);
  bool order_after(Stream s, uint64_t e);
  uint64_t create_event();
  std::atomic<bool> has_tables_{false};
};

// The manager's counters as JSON (offload_stats_json's "residency"); "null" for none.
std::string residency_json(const Residency* r);

// The manager's policy from the shim's OFFLOAD_CAP_* settings onto `o` (pieces, tiling, refits,
// prefetching), for the shim and `offloadctl replay --cap` alike.
void apply_cap_policy(const Settings& s, Residency::Options* o);

}  // namespace offload
