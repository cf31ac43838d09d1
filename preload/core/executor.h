// Executor: the acting half of the shim. It places planned allocations in arenas, evicts
// them to host memory after their last forward use, reloads them before their backward
// use, and keeps every launch safe whatever the plan says.
//
// Arenas. Each offloaded arena is a reserved virtual range of `handle_bytes`; while it holds
// data one physical handle from a small recycled set is mapped under it. Members sit at
// fixed offsets, so their addresses are the same every step and stay valid while the
// arena is evicted (PyTorch keeps its pointers; only the backing goes).
//
// Ordering (docs/design.md, Invariants). Every stream that may have queued work on an arena's
// memory is in the arena's stream list: the streams of the launches that touched it, the
// streams its members were freed on, our offload stream while a D2H reads it and our
// prefetch stream while an H2D writes it. An eviction records an event on each listed
// stream and the offload stream waits on all of them before copying; physical memory is
// unmapped only once every recorded event has completed. A reload copies on the prefetch
// stream and every launch touching the arena before that copy is known complete waits on
// its event (cuStreamWaitEvent), on the launching stream, before it is launched.
//
// Hand-overs. When every handle the plan allows is mapped, a reload (or a placement) takes
// the handle of the oldest arena whose memory is on its way out (its copy out, or a freed
// arena's last work, still queued): the taker's stream waits for that work on the GPU, and the
// old owner's range stays mapped until it completes, then is unmapped. The host never blocks
// for a handle then. An old owner touched again before its copy out completes cannot keep its
// bytes as an abandoned eviction does: the host waits for the copy and it is reloaded.
//
// Safety net. Every launch's touched allocations reach before_launch: a touched arena that
// is evicted is reloaded there and then (a demand reload, counted as a miss); one being
// evicted keeps its memory (the eviction is abandoned). A launch we cannot see into (graph
// replay, a kernel whose parameters the driver cannot describe, too many pointers) makes
// every arena resident first. A step whose launches stop matching the plan turns the plan
// off (demand mode: no new placements, evicted arenas come back when touched); the worker
// installs a fresh plan once the arenas have drained.
//
// Threading: place/release/before_launch come from hooks on any thread; poll and install
// from the worker. One mutex guards the state; it is held only around driver calls that do
// not re-enter the shim (copies, events, map/unmap), and the only blocking call made under
// it is waiting for one of our own copies or a freed arena's last work (device budget:
// without hand-overs, or an arena whose handle was handed over and is touched again).
// With no plan installed every entry point returns after one atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/alloc_table.h"
#include "core/backing.h"
#include "core/driver.h"
#include "core/event_log.h"
#include "core/persistent_pool.h"
#include "planner/plan.h"

namespace offload {

// AllocIds of arena members carry this bit and the arena's index: a launch's sorted access
// list ends with them, so the hot path checks one word to know if it touches an arena.
inline constexpr AllocId kArenaIdBit = AllocId{1} << 63;
inline AllocId arena_alloc_id(uint64_t tag, AllocId counter) {
  return kArenaIdBit | (tag << 32) | (counter & 0xffffffffu);
}
// The arena index an arena member's id carries (its tag less one).
inline uint64_t arena_of(AllocId id) { return ((id >> 32) & 0x7fffffffu) - 1; }
// AllocIds of the residency manager's ranges (residency/residency.h) carry this bit and the
// range's slot: they sort after every other id and before the arenas'.
inline constexpr AllocId kRangeIdBit = AllocId{1} << 62;
// A tracker tag with this bit names a range's slot (Tracker::on_alloc).
inline constexpr uint64_t kRangeTag = uint64_t{1} << 40;
inline AllocId range_alloc_id(uint64_t slot, AllocId counter) {
  return kRangeIdBit | ((slot & 0x3fffffffu) << 32) | (counter & 0xffffffffu);
}
inline bool is_range_id(AllocId id) { return (id & (kArenaIdBit | kRangeIdBit)) == kRangeIdBit; }
inline uint32_t range_slot(AllocId id) { return static_cast<uint32_t>((id >> 32) & 0x3fffffffu); }

// What a launch gate sees: called by the tracker before each launch is forwarded.
class LaunchGate {
 public:
  virtual ~LaunchGate() = default;
  virtual void before_launch(uint64_t launch_no, EventKind kind, uint32_t kernel, Stream s,
                             const AllocId* acc, size_t n, uint8_t flags) = 0;
  // A host-to-device copy wrote device pointers into allocation `table`: the arena members
  // `targets` (sorted). Launches that touch `table` touch them too.
  virtual void note_pointer_table(AllocId table, const AllocId* targets, size_t n) = 0;
};

// Device memory held to a budget by another owner (the residency manager under the hard cap):
// the executor takes room there before it makes an arena's handle and gives it back when it
// releases one, so that one count holds both. take makes room (evicting what the owner may) or
// says false: for a placement (Want::Spare, which has somewhere else to go) only while the owner
// keeps room for its own largest need; for a reload (Want::Needed) down to what launches in
// flight hold; Want::Forced counts bytes that must be made whatever the room.
class DeviceRoom {
 public:
  enum class Want : uint8_t { Spare, Needed, Forced };
  virtual ~DeviceRoom() = default;
  virtual bool take(uint64_t bytes, Want want) = 0;
  virtual void give(uint64_t bytes) = 0;
};

// Where evicted bytes go: plan.host_bytes() bytes at `ptr`, pinned in registrations of
// `chunk` bytes from `origin` (a copy never spans two; chunk 0: one registration).
struct HostMemory {
  unsigned char* ptr = nullptr;
  const unsigned char* origin = nullptr;
  uint64_t chunk = 0;
};

struct ExecutorStats {
  uint64_t installs = 0, deviations = 0, steps_active = 0;
  // Planned allocations served by the allocator instead: no handle free and none on its way
  // back (no_handle), or the arena still holding last step's members or moving (busy).
  uint64_t placed = 0, arena_busy = 0, no_handle = 0;
  uint64_t evictions = 0, evictions_abandoned = 0, reloads = 0, conservative = 0, copy_failures = 0;
  uint64_t pointer_tables = 0;  // host-to-device copies seen writing pointers into arenas
  // A miss: a launch touched an evicted arena whose reload the plan had not started (a
  // planning bug). A late reload: one the plan had due but the in-flight cap held back, issued
  // at the consuming launch instead.
  uint64_t misses = 0, late_reloads = 0;
  uint64_t bytes_out = 0, bytes_in = 0;
  uint64_t handles_created = 0, handles_released = 0, over_budget = 0;
  // Under the cap (a DeviceRoom): resident arenas sent out early because a reload found every
  // handle held, nothing leaving and no room to make another.
  uint64_t room_evictions = 0;
  uint64_t sheds = 0;  // the residency manager asked for the arenas' room back (Executor::shed)
  uint64_t first_step_trims = 0;  // the allocator's pool trimmed at a plan's first launch
  uint64_t budget_waits = 0;
  // Arena handles taken from an arena on its way out (copy out or last work still queued),
  // the taker ordered after it on the GPU instead of the host waiting (Options::hand_over).
  uint64_t handovers = 0;
  uint64_t held_bytes = 0, held_peak = 0;   // physical bytes we hold
  uint64_t device_peak = 0;                 // live allocation bytes outside arenas + held
  // Host time (TSC cycles): in before_launch, and of that waiting for the budget (our copies
  // or freed arenas); all waits for the budget, the allocation hook's included.
  uint64_t gate_calls = 0, gate_cycles = 0, gate_wait_cycles = 0, wait_cycles = 0;
  // Weight streaming: weights whose backing we hold (lent by the PersistentPool), their
  // evictions and reloads (planned and on demand), the bytes moved, the most of their bytes
  // mapped at once, and reloads that first waited for an eviction to finish (the plan's bound).
  uint64_t weights = 0, weight_evictions = 0, weight_reloads = 0, weight_misses = 0, weight_abandoned = 0;
  uint64_t weight_bytes_out = 0, weight_bytes_in = 0, weight_mapped_peak = 0, weight_waits = 0;
  uint64_t weight_over_bound = 0;  // reloads that found the bound full and nothing leaving
  uint64_t weight_handovers = 0;   // reloads that took leaving weights' handles, ordered on the GPU
  uint64_t weight_split = 0;       // reloads mapped on several handles
  // Weights touched again while their memory was another's and their last use not yet seen
  // complete: the host waited for that use (settle_handed) before mapping them again.
  uint64_t weight_settles = 0;
  // Weights the application marked read-only (offload_mark_read_only), and their evictions
  // that copied nothing (the host copy was current).
  uint64_t weight_read_only = 0, weight_clean_evictions = 0;
  // The host's waits in the last finished active step, longest first (at most 16): the launch
  // position it waited at, for how long, what for ('w' a weight's reload for a leaving weight's
  // copy, 's' a weight settling its last use, 'a' an arena), and whether the stream of that
  // launch had nothing left queued when the wait ended (1; 0 work queued; -1 unknown): such a
  // wait leaves the GPU idle until the host launches again.
  struct HostWait {
    int64_t pos = -1;
    uint64_t cycles = 0;
    char kind = '?';
    int drained = -1;
  };
  std::vector<HostWait> last_step_waits;
  uint64_t last_step_wait_count = 0, last_step_drained = 0;
  std::vector<uint64_t> recent_misses;      // misses in each of the last finished active steps
  std::vector<uint64_t> recent_late;        // late reloads in each of them
  std::string plan;                         // the installed plan, described
};

class Executor final : public LaunchGate {
 public:
  struct Options {
    // Reload copies queued and not yet complete, at most (0: the plan's handle count, which
    // already bounds the bytes a reload may bring in).
    uint32_t max_reloads_in_flight = 0;
    // Test-only: drops a wait, for the tests that prove a missing wait is caught
    // (SkipHandoverWait: an arena's or a weight's wait for its memory's last owner).
    enum class Fault : uint8_t { None, SkipReloadWait, SkipEvictWait, SkipHandoverWait };
    Fault fault = Fault::None;
    // Every handle held: a reload or a placement takes the handle of an arena on its way out
    // and its first use waits for that arena's last work on the GPU (true), or the host waits
    // for that work to finish first (false: the behaviour before hand-overs, kept for tests).
    bool hand_over = true;
    // A weight's reload past the plan's bound with no weight of its size leaving takes pieces:
    // whole kept handles and leaving weights' handles of other sizes, the GPU waiting for their copies
    // out (true); or the host waits for a copy out to end first (false: the behaviour before,
    // kept for tests and comparisons).
    bool split_weights = true;
    // Weights' memory in handles of one unit (the largest common divisor of the streamed
    // weights' sizes, when a weight is at most 16 of them): every leaving weight's memory then
    // fits every reload, which takes it with the GPU waiting instead of the host (true); or a
    // handle per weight, of its size (false: the behaviour before, kept for comparisons).
    bool unit_weights = true;
    uint64_t unit_max_pieces = 16;  // weight_unit's: a weight needing more keeps its own size
  };
  Executor(Driver& driver, Options o);
  // Where streamed weights live (OFFLOAD_PERSISTENT_MIN); without it a plan's weights stay put.
  void set_persistent(PersistentPool* pool) { pool_ = pool; }
  // Under the hard cap: arenas' handles are made in `room` (before any plan is installed).
  void set_room(DeviceRoom* room) { room_ = room; }
  // Under the cap, the residency manager cannot fit a launch touching `acc` (or an allocation,
  // acc empty) beside the arenas' handles: resident arenas the launch does not touch go out (the
  // host waits for every copy out and freed arena's last work) and every handle no arena maps
  // goes back to the room. blind: the launch touches every arena.
  void shed(const AllocId* acc, size_t n, bool blind);
  ~Executor() override;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Worker. Installs `plan` to take effect from the step that starts at launch `anchor`
  // (the first launch numbered anchor + k * step_launches that passes before_launch).
  // `host` must outlive the plan. Refused (false, *why) while an earlier plan's arenas still hold members, or
  // if the driver refuses the reservation or the streams.
  bool install(Plan plan, uint64_t anchor, HostMemory host, std::string* why);
  bool installed() const { return installed_.load(std::memory_order_acquire); }
  // True once the installed plan was turned off by a deviation (the worker re-plans).
  bool deviated() const { return deviated_.load(std::memory_order_relaxed); }
  uint64_t misses();  // launches that found what they touch not resident, and late reloads
  // For the telemetry pushed to offloadd, without stats()'s copies, so far: bytes copied out
  // (weights' included), the host's waits for the budget (TSC cycles), and the misses.
  struct Moves {
    uint64_t bytes_out = 0, wait_cycles = 0, misses = 0;
  };
  Moves moves();
  // True when no arena holds members or physical memory (a new plan can go in).
  bool idle();
  // Worker: turns the plan off as a deviation would (demand mode until the arenas drain), so
  // that a revised plan can go in.
  void retire(const char* why);

  // Hooks. place: an arena address for a planned allocation (and its tracker tag), or 0 to
  // let the allocator serve it. `next_launch`: the number the next launch will get.
  DevPtr place(uint64_t bytes, Stream s, uint64_t next_launch, uint64_t* tag);
  // True if `p` is an arena member (then the allocator must not see the free). A streamed
  // weight's backing goes back to the PersistentPool first (false: the pool frees it).
  bool release(DevPtr p, Stream s);
  void before_launch(uint64_t launch_no, EventKind kind, uint32_t kernel, Stream s,
                     const AllocId* acc, size_t n, uint8_t flags) override;
  void note_pointer_table(AllocId table, const AllocId* targets, size_t n) override;
  // A question about `p` that announces a use (a pointer-attribute query): an evicted arena is
  // reloaded now, so that the memory is mapped; the launch that follows waits for the copy.
  void prepare_access(DevPtr p);
  // After every allocation: the tracker's live bytes, for the device-footprint peak.
  void note_live(uint64_t live_bytes);
  // The application's word that [p, p+bytes) is not written from now on while it lives (a
  // frozen parameter): a streamed weight inside such a range is copied out once, and later evictions
  // only unmap it. forget_read_only: the range (or part of it) was freed; the word goes with it.
  void mark_read_only(DevPtr p, uint64_t bytes);
  void forget_read_only(DevPtr p, uint64_t bytes);
  bool any_read_only() const { return any_read_only_.load(std::memory_order_relaxed); }
  bool read_only(DevPtr p, uint64_t bytes);  // [p, p+bytes) inside one marked range

  // Worker (hooks call it too): finishes evictions and drains whose copies have completed.
  void poll();
  void reset_peak();
  ExecutorStats stats();
  // What the pool's trim asks at every step, without stats()'s copies: plans installed, steps
  // run under one, the most physical memory held beside the pool, and the installed plan's budget;
  // for PoolRefine, the plan's resident peak, its predicted footprint, its handles' bytes, and
  // whether it is a plan of arenas alone.
  struct TrimView {
    uint64_t installs = 0, steps_active = 0, held_peak = 0, budget = 0;
    uint64_t resident_peak = 0, predicted_peak = 0, handle_bytes = 0;  // handle_bytes: all of the plan's
    bool arenas_only = false;
    uint64_t spare = 0;  // room the plan keeps under `budget` for one more handle (Plan::spare)
  };
  TrimView trim_view();
  // The pool's trim before the installed plan's first step, taken at the step's mark (the
  // runtime waits for the GPU, then trims to the bytes returned); then the first launch leaves
  // the pool alone. nullopt: not due (taken already, the step begun, or no plan) or a plan that
  // streams weights. Without marks, the trim happens at the first launch, without a wait, and
  // is counted in first_step_trims.
  std::optional<uint64_t> take_first_step_trim();

 private:
  enum class State : uint8_t { Empty, Resident, Evicting, Evicted, Reloading, Draining };
  static constexpr int kMaxStreams = 8;
  struct Member {
    uint64_t offset, bytes;
    bool live;
  };
  struct Arena {
    DevPtr va = 0;
    State state = State::Empty;
    int handle = -1;                // index in handles_
    uint32_t live = 0;              // members placed and not freed
    uint64_t used = 0;
    uint64_t filled_step = ~uint64_t{0};  // the step its members were placed in
    std::vector<Member> members;    // by offset
    Stream streams[kMaxStreams]{};  // streams that may have work queued on it
    uint64_t events[kMaxStreams]{};
    int nstreams = 0;
    bool overflow = false;          // more streams than we can track: never unmapped
    uint64_t ev_d2h = 0, ev_h2d = 0;
    bool h2d_pending = false;       // reload copy not yet seen complete
    uint64_t host_offset = 0;
    bool in_busy = false;           // listed in busy_
    // Evicting or Draining, its handle given to another arena (which waits for this one's
    // last work on the GPU): still mapped here until that work completes, then unmapped; the
    // handle is the other arena's.
    bool handed = false;
  };
  // A streamed weight: one PersistentPool block whose backing we hold while lent.
  struct Weight {
    DevPtr va = 0;
    uint64_t used = 0;              // bytes copied out and back
    uint64_t size = 0;              // mapped bytes (the block's)
    uint64_t room = 0;              // the range reserved at va (the pool's: past size, room for units)
    uint64_t id = 0;                // the tracker's id for it
    Backing backing;                // mapped at va (empty: none)
    State state = State::Resident;  // Resident, Evicting, Evicted or Reloading (Empty: given back)
    Stream streams[kMaxStreams]{};
    uint64_t events[kMaxStreams]{};
    int nstreams = 0;
    bool overflow = false;
    uint64_t ev_d2h = 0, ev_h2d = 0;
    bool h2d_pending = false;
    uint64_t host_offset = 0;
    bool in_busy = false;
    // Evicting, some of its handles given to reloads (which wait for this copy out on the GPU):
    // its range is unmapped once the copy completes; the given handles stay the others'.
    bool handed() const {
      for (const Piece& p : backing)
        if (p.given) return true;
      return false;
    }
    // Marked read-only by the application; host_current: the host copy holds its bytes (a copy
    // out of it has completed under this plan), so an eviction need not copy.
    bool read_only = false, host_current = false;
  };
  struct Action {
    int64_t pos;
    uint32_t index;  // arena, or window for a weight
    bool evict;
    bool weight;
  };

  template <class T> void add_stream(T& a, Stream s);
  template <class T> bool copy(T& a, bool to_host, Stream s);  // in pieces that respect the pinned chunks
  template <class T> bool record_all(T& a);  // one event per listed stream
  template <class T> bool all_done(T& a);
  // An arena or weight whose reload was just queued on the prefetch stream: reloading, used by
  // that stream alone so far.
  template <class T> void reload_queued(T& a);
  // Work about to be queued on `s` uses `a`: it follows a's reload, and `s` is one of a's streams.
  template <class T> void used_on(T& a, Stream s);
  // Weights. install_weights: lends the plan's weights from the pool (keeping those lent
  // already); give_back_weights: every resident one goes back (false if one is not resident).
  bool install_weights(std::string* why);
  bool give_back_weights();
  int weight_of(uint64_t id) const;       // index in weights_ by tracker id, -1: none
  int weight_at(DevPtr p) const;          // the weight whose range holds p, -1: none
  void evict_weight(uint32_t i);
  bool reload_weight(uint32_t i, bool demand);
  void ensure_weight(uint32_t i, Stream s, bool demand);
  // Memory for a weight of `size` about to be mapped, within the plan's bound where it can be:
  // a kept handle of the size, a new one, a leaving weight's handle of the size, or pieces
  // (whole kept handles and leaving weights' handles no larger than the weight, adding up to
  // its size, perhaps with a new one for the rest within the bound). The
  // GPU must wait for the events in *after (those weights' copies out) before writing it. The
  // host waits only when nothing at all is leaving. False: the device refused a new handle.
  bool weight_backing(uint64_t size, uint64_t room, Backing* out, std::vector<uint64_t>* after);
  // Pieces for weight_backing from kept handles, leaving weights and room under `bound`; false
  // (nothing taken) when they do not add up to `size`.
  bool gather_pieces(uint64_t size, uint64_t bound, Backing* out, std::vector<uint64_t>* after);
  uint64_t new_weight_handle(uint64_t size);  // counted as mapped; 0: refused
  // Shared by weight_backing, gather_pieces and unit_backing. take_piece: a leaving weight's
  // piece given to the memory gathered in *out, the GPU to wait for its copy out (*after, once
  // per weight). drop_oldest_kept: the oldest kept handle released (false: none kept).
  // over_bound: says (three times at most) that a reload maps past the plan's bound.
  // wait_leaving: the host waits for a leaving weight's copy out (a weight wait).
  void take_piece(Weight& x, Piece& p, Backing* out, std::vector<uint64_t>* after);
  bool drop_oldest_kept();
  void over_bound(uint64_t bound);
  void wait_leaving(const Weight& w);
  // weight_backing when the weights' memory is in units (weight_unit_ != 0): kept units, new
  // ones within the bound, leaving weights' pieces (the GPU waits for them), and the host
  // waits only when nothing at all is leaving.
  bool unit_backing(uint64_t size, uint64_t room, uint64_t bound, Backing* out, std::vector<uint64_t>* after);
  // An evicted weight backed again and mapped (weight_backing), `s` waiting for the copies out
  // of the weights its memory came from; aborts when the device refuses (`what` says whose).
  void remap_weight(Weight& w, Stream s, const char* what);
  // The range of a weight whose copy out completed unmapped; the handles not given away kept
  // for later reloads while within the plan's bound, released otherwise.
  void unmap_evicted(Weight& w);
  void settle_handed(Weight& w);  // a handed weight's copy out done and its range unmapped
  void lend_back(Weight& w);      // its backing back to the pool: the weight is Empty
  void drop_weight_handle(uint64_t size, uint64_t handle);  // an unmapped handle released
  // A handle about to leave our hands (released, or back to the pool) may still be mapped at
  // the weight it was taken from: that weight's copy out has ended (the taker waited for it on
  // the GPU) but was not seen yet. Its range is unmapped first (settle_handed).
  void unmap_donor_of(uint64_t handle);
  uint64_t weight_bound() const;          // mapped bytes the plan allows now (0: no bound)
  void mark_weight_busy(uint32_t i);
  // A handle for a reload (for_reload) or a placement whose memory is first used on `s`: a
  // free one, a new one within the plan's count, else (Options::hand_over) that of the oldest
  // arena on its way out, with `s` made to wait for that arena's last work; -1: none.
  int acquire_handle(bool for_reload, Stream s);
  int donor() const;              // the arena whose handle a hand-over would take, -1: none
  // Under the cap, a reload with no handle and no room: a resident arena the launch being gated
  // does not touch starts its copy out (its handle then goes to the reload on the GPU). False:
  // none can go.
  bool evict_for_room();
  bool touched_now(uint32_t i) const;  // the launch being gated touches arena i
  // Resident with members, its bytes current, and not touched by the launch being gated.
  bool may_send_out(uint32_t i) const;
  void start_evict(uint32_t i);   // the copy out of a resident arena, after every stream's work
  void settle_handed(Arena& a);   // a handed arena's last work waited for and its range unmapped
  // What must finish before another may use the memory of arena `b` on its way out: its copy
  // out (Evicting), else the last work on it (Draining). Waited for on stream `s`, or on the host.
  void gpu_wait_leaving(const Arena& b, Stream s);
  void host_wait_leaving(const Arena& b);
  // Unmaps its range (nothing queued uses it); its handle goes back unless it was handed over.
  void unmap_arena(Arena& a, const char* what);
  void give_handle(int h);
  void evict(uint32_t i);
  bool reload(uint32_t i);
  void ensure_resident(uint32_t i, Stream s, bool demand);
  bool take_pending(uint32_t i);  // drops i from the held-back reloads; true if it was there
  // A reload made on demand: late if the plan had it due but held back, else a miss.
  void count_demand(uint32_t i, bool late, const char* how);
  void poll_locked();
  void mark_busy(uint32_t i);     // lists an arena in busy_ (once)
  void finish_step();
  void deviate(const char* why);
  void update_peak();
  size_t reloads_in_flight() const;
  bool reload_may_start() const;  // a planned reload: under the in-flight cap, with a handle to use
  size_t live_handles() const;    // physical handles held (free or mapped)
  void release_handle(int h);     // back to the device; its slot in handles_ becomes 0
  uint32_t reload_cap() const { return opt_.max_reloads_in_flight ? opt_.max_reloads_in_flight : plan_.handles; }
  void teardown_locked();
  // install's steps, under mu_. may_install_locked: false with *why while the previous plan's
  // arenas or weights still hold data, or when `plan` moves nothing. make_arenas_locked: the
  // address space and each arena's events for `plan`; false with *why when the driver refuses.
  // schedule_locked: the installed plan's arenas emptied for their members (by offset), and
  // its evictions and reloads listed in the order they are due.
  bool may_install_locked(const Plan& plan, std::string* why) const;
  bool make_arenas_locked(const Plan& plan, std::string* why);
  void schedule_locked();
  std::string describe_handles() const;  // for the log: arenas holding memory, and their state
  // The pool's trim before an installed plan's first step, once per install: the bytes the pool
  // may keep (the budget less the plan's handles), or nullopt when it is not due or the plan is
  // not one of arenas alone. Under mu_.
  std::optional<uint64_t> first_step_keep_locked();
  void trim_at_first_launch(Stream s);  // under mu_, at the first launch (on `s`) of the first step

  Driver& driver_;
  Options opt_;
  std::mutex mu_;
  std::atomic<bool> installed_{false};
  std::atomic<bool> deviated_{false};
  std::atomic<DevPtr> va_lo_{0}, va_hi_{0};
  Plan plan_;
  uint64_t anchor_ = 0;
  HostMemory host_;
  std::vector<Arena> arenas_;
  std::vector<Action> actions_;   // by position
  size_t cursor_ = 0;             // next action this step
  std::vector<uint32_t> pending_reloads_;
  bool active_ = false;           // a step of the plan is running
  bool first_step_due_ = false;   // the installed plan's first step has not started
  uint64_t step_ = 0;             // (launch number - anchor) / launches per step
  uint64_t sub_launch_ = ~uint64_t{0};
  uint32_t sub_ = 0;
  uint64_t step_misses_ = 0, step_late_ = 0;
  int64_t cur_pos_ = -1;  // position of the launch being gated
  Stream cur_stream_ = 0;  // its stream
  const AllocId* cur_acc_ = nullptr;  // what it touches (during before_launch), and whether it is
  size_t cur_count_ = 0;              // a launch we cannot see into (which touches every arena)
  bool cur_blind_ = false;
  static constexpr size_t kWaitsKept = 16;           // ExecutorStats::last_step_waits, at most
  std::vector<ExecutorStats::HostWait> step_waits_;  // this step's (capacity kept: no allocation)
  uint64_t step_wait_count_ = 0, step_drained_ = 0;
  void note_wait(char kind, uint64_t cycles);
  uint64_t gate_calls_ = 0, gate_cycles_ = 0, gate_wait_cycles_ = 0, wait_cycles_ = 0;  // under mu_
  Stream offload_stream_ = 0, prefetch_stream_ = 0;
  DevPtr reservation_ = 0;
  uint64_t reservation_bytes_ = 0;
  std::vector<uint64_t> handles_;   // physical handles we hold (0: released slot)
  std::vector<int> free_handles_;
  std::vector<uint32_t> busy_;      // arenas whose memory is waiting on the GPU, oldest first
  // Pointer tables: allocation -> the arenas its pointers lead into (newest kept, bounded).
  std::vector<std::pair<AllocId, std::vector<uint32_t>>> tables_;
  static constexpr size_t kMaxTables = 256;
  PersistentPool* pool_ = nullptr;
  DeviceRoom* room_ = nullptr;
  std::vector<Weight> weights_;             // by plan weight index
  std::vector<std::pair<uint64_t, uint32_t>> weight_ids_;  // (tracker id, index), sorted
  std::vector<std::pair<DevPtr, uint32_t>> weight_vas_;    // (va, index), sorted
  std::vector<std::pair<uint64_t, uint64_t>> free_weight_handles_;  // (size, handle), unmapped, oldest first
  uint64_t weight_unit_ = 0;  // Options::unit_weights: the handle size of new weight memory; 0: none
  std::vector<uint32_t> weight_busy_;       // weights with copies in flight
  struct PieceCand {                        // gather_pieces' candidates
    uint64_t bytes;
    int weight;    // -1: a kept handle
    size_t index;  // in free_weight_handles_, or the weight's piece
  };
  std::vector<PieceCand> scratch_cands_;
  std::vector<size_t> scratch_chosen_;
  std::vector<bool> scratch_taken_;
  std::vector<uint64_t> scratch_after_;
  std::vector<std::pair<DevPtr, DevPtr>> read_only_;  // [lo, hi) the application marked
  std::atomic<bool> any_read_only_{false};
  std::atomic<DevPtr> read_only_lo_{0}, read_only_hi_{0};  // the marks' span: a free outside it skips the lock
  bool marked_read_only(DevPtr lo, DevPtr hi) const;  // inside one marked range
  void note_read_only_span();  // any_read_only_ and the span, after read_only_ changed
  uint64_t weight_mapped_ = 0;              // lent weights' mapped bytes, free handles included
  std::atomic<uint64_t> weight_lo_{0}, weight_hi_{0};  // their address range (for release / queries)
  std::atomic<uint64_t> member_live_{0}, held_{0}, last_live_{0}, device_peak_{0}, lent_live_{0};
  ExecutorStats st_;
};

}  // namespace offload
