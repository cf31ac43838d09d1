// A plan of arenas on top of the hard cap: one launch gate for both. The residency manager
// sees each launch first (its ranges reloaded and marked in flight), then the executor, whose
// reloads may take room (DeviceRoom) that the manager makes by evicting ranges this launch
// does not touch.
#pragma once

#include "core/executor.h"
#include "residency/residency.h"

namespace offload {

class CapAndPlan final : public LaunchGate {
 public:
  CapAndPlan(Residency& r, Executor& e) : r_(r), e_(e) {}
  void before_launch(uint64_t launch_no, EventKind kind, uint32_t kernel, Stream s, const AllocId* acc, size_t n,
                     uint8_t flags) override {
    r_.before_launch(launch_no, kind, kernel, s, acc, n, flags);
    if (Residency::last_launch_captured()) return;  // recorded into a graph: nothing runs now
    // Refused while the arenas hold room: they give back what this launch does not touch, and
    // the manager tries once more (its refusal then stands, said and counted).
    if (Residency::refusal_pending() && r_.external()) {
      e_.shed(acc, n, blind_launch(kind, flags));
      (void)Residency::take_refusal();
      Residency::LastTry last;
      r_.before_launch(launch_no, kind, kernel, s, acc, n, flags);
    }
    e_.before_launch(launch_no, kind, kernel, s, acc, n, flags);
  }
  // An allocation of the manager's (Residency::alloc): refused while the arenas hold room, they
  // give back what they can and it is tried once more.
  DevPtr alloc(uint64_t bytes, Stream s, uint64_t* tag, bool* refused) {
    DevPtr p = r_.alloc(bytes, s, tag, refused);
    if (!*refused || !r_.external()) return p;
    e_.shed(nullptr, 0, false);
    Residency::LastTry last;
    return r_.alloc(bytes, s, tag, refused);
  }
  void note_pointer_table(AllocId table, const AllocId* targets, size_t n) override {
    r_.note_pointer_table(table, targets, n);
    e_.note_pointer_table(table, targets, n);
  }

 private:
  Residency& r_;
  Executor& e_;
};

}  // namespace offload
