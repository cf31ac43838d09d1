// OFFLOAD_* settings and byte sizes.
#include "common/env.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace offload {
namespace {

constexpr uint64_t KiB = 1024, MiB = KiB * 1024, GiB = MiB * 1024;

TEST(ParseSize, PlainBytes) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("1048576"), 1048576u);
  EXPECT_EQ(parse_size("100B"), 100u);
  EXPECT_EQ(parse_size("100b"), 100u);
}

TEST(ParseSize, BinaryUnits) {
  EXPECT_EQ(parse_size("64k"), 64 * KiB);
  EXPECT_EQ(parse_size("2KiB"), 2 * KiB);
  EXPECT_EQ(parse_size("512MiB"), 512 * MiB);
  EXPECT_EQ(parse_size("40GiB"), 40 * GiB);
  EXPECT_EQ(parse_size("3M"), 3 * MiB);
  EXPECT_EQ(parse_size("1G"), GiB);
  EXPECT_EQ(parse_size("2TiB"), 2 * GiB * 1024);
  // Kubernetes' and numfmt's spellings: the IEC prefix without the B.
  EXPECT_EQ(parse_size("40Gi"), 40 * GiB);
  EXPECT_EQ(parse_size("512Mi"), 512 * MiB);
  EXPECT_EQ(parse_size("8ki"), 8 * KiB);
  EXPECT_EQ(parse_size("1Ti"), GiB * 1024);
}

TEST(ParseSize, DecimalUnits) {
  EXPECT_EQ(parse_size("1GB"), 1000000000u);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_size("3kB"), 3000u);
  EXPECT_EQ(parse_size("7MB"), 7000000u);
}

TEST(ParseSize, Decimals) {
  EXPECT_EQ(parse_size("0.5k"), 512u);
  EXPECT_EQ(parse_size("1.5GiB"), GiB + GiB / 2);
  EXPECT_EQ(parse_size("0.25MiB"), MiB / 4);
  EXPECT_EQ(parse_size("2.0"), 2u);
}

TEST(ParseSize, Rejections) {
  for (const char* bad : {"", "-1", "12XB", "GiB", "B", ".", "1.2.3", "1e9", "1 GiB", "GiB1", "0x10",
                          "+5", "5 ", "5GiBs", "1..5k"})
    EXPECT_FALSE(parse_size(bad).has_value()) << "'" << bad << "'";
}

TEST(ParseSize, RejectsSizesPastSixtyFourBits) {
  EXPECT_FALSE(parse_size("16777216TiB").has_value());  // 2^64 bytes
  EXPECT_FALSE(parse_size("99999999999999999999999").has_value());
  EXPECT_TRUE(parse_size("16777215TiB").has_value());
}

// --- read_settings -----------------------------------------------------------------------

struct Env {
  std::map<std::string, std::string> vars;
  std::vector<std::string> asked;
  std::function<const char*(const char*)> getter() {
    return [this](const char* name) -> const char* {
      asked.push_back(name);
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

Settings read(Env& env, std::vector<std::string>* errors) { return read_settings(env.getter(), errors); }

TEST(ReadSettings, DefaultsWhenNothingIsSet) {
  Env env;
  std::vector<std::string> errors;
  Settings s = read(env, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(s.trace_dir, "");
  EXPECT_EQ(s.trace_steps, 12u);
  EXPECT_TRUE(s.telemetry);
  EXPECT_EQ(s.cupti_lib, "");
  EXPECT_EQ(s.log_level, "info");
  EXPECT_TRUE(s.enabled);
  for (const char* v : {"OFFLOAD_TRACE", "OFFLOAD_TRACE_STEPS", "OFFLOAD_TELEMETRY", "OFFLOAD_CUPTI_LIB",
                        "OFFLOAD_LOG_LEVEL", "OFFLOAD_DISABLE"})
    EXPECT_NE(std::find(env.asked.begin(), env.asked.end(), v), env.asked.end()) << v << " is read";
}

TEST(ReadSettings, EmptyValuesMeanUnset) {
  Env env;
  for (const char* v : {"OFFLOAD_TRACE", "OFFLOAD_TRACE_STEPS", "OFFLOAD_TELEMETRY", "OFFLOAD_CUPTI_LIB",
                        "OFFLOAD_LOG_LEVEL", "OFFLOAD_DISABLE"})
    env.vars[v] = "";
  std::vector<std::string> errors;
  Settings s = read(env, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(s.trace_steps, 12u);
  EXPECT_TRUE(s.enabled);
  EXPECT_TRUE(s.telemetry);
}

TEST(ReadSettings, EachVariable) {
  Env env;
  env.vars = {{"OFFLOAD_TRACE", "/tmp/offload traces"},
              {"OFFLOAD_TRACE_STEPS", "5"},
              {"OFFLOAD_TELEMETRY", "off"},
              {"OFFLOAD_CUPTI_LIB", "/opt/cuda/libcupti.so.13"},
              {"OFFLOAD_LOG_LEVEL", "debug"},
              {"OFFLOAD_DISABLE", "1"}};
  std::vector<std::string> errors;
  Settings s = read(env, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(s.trace_dir, "/tmp/offload traces");
  EXPECT_EQ(s.trace_steps, 5u);
  EXPECT_FALSE(s.telemetry);
  EXPECT_EQ(s.cupti_lib, "/opt/cuda/libcupti.so.13");
  EXPECT_EQ(s.log_level, "debug");
  EXPECT_FALSE(s.enabled);
}

TEST(ReadSettings, AcceptedSpellings) {
  auto one = [](const char* var, const char* val) {
    Env env;
    env.vars[var] = val;
    std::vector<std::string> errors;
    Settings s = read(env, &errors);
    EXPECT_TRUE(errors.empty()) << var << "=" << val;
    return s;
  };
  EXPECT_TRUE(one("OFFLOAD_TELEMETRY", "cupti").telemetry);
  EXPECT_FALSE(one("OFFLOAD_TELEMETRY", "cupti").telemetry_sampled);
  EXPECT_TRUE(one("OFFLOAD_TELEMETRY", "sampled").telemetry);
  EXPECT_TRUE(one("OFFLOAD_TELEMETRY", "sampled").telemetry_sampled);
  EXPECT_FALSE(one("OFFLOAD_TELEMETRY", "off").telemetry_sampled);
  for (const char* l : {"debug", "info", "warn", "error", "off"}) EXPECT_EQ(one("OFFLOAD_LOG_LEVEL", l).log_level, l);
  // A job's ranks other than 0 log warnings and errors only, unless a level is given.
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").log_level_for(-1), "info");
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").log_level_for(0), "info");
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").log_level_for(3), "warn");
  EXPECT_EQ(one("OFFLOAD_LOG_LEVEL", "info").log_level_for(3), "info");
  EXPECT_EQ(one("OFFLOAD_LOG_LEVEL", "debug").log_level_for(0), "debug");
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "true").enabled);
  EXPECT_TRUE(one("OFFLOAD_DISABLE", "0").enabled);
  EXPECT_TRUE(one("OFFLOAD_DISABLE", "false").enabled);
  EXPECT_EQ(one("OFFLOAD_TRACE_STEPS", "1").trace_steps, 1u);
  EXPECT_EQ(one("OFFLOAD_TRACE_STEPS", "100000").trace_steps, 100000u);
  EXPECT_TRUE(one("OFFLOAD_TRACE_LEAD", "1").trace_lead);
  EXPECT_TRUE(one("OFFLOAD_TRACE_LEAD", "true").trace_lead);
  EXPECT_FALSE(one("OFFLOAD_TRACE_LEAD", "0").trace_lead);
  EXPECT_FALSE(one("OFFLOAD_TRACE_LEAD", "false").trace_lead);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").trace_lead) << "off unless asked";
  EXPECT_TRUE(one("OFFLOAD_HOST_POOL", "48GiB").host_pool_set);
  EXPECT_EQ(one("OFFLOAD_HOST_POOL", "48GiB").host_pool_bytes, 48ull << 30);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").host_pool_set) << "the default is not asked for";
  EXPECT_EQ(one("OFFLOAD_CAP_PIECE", "32MiB").cap_piece, 32ull << 20);
  EXPECT_EQ(one("OFFLOAD_CAP_PIECE", "0").cap_piece, 0u);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_piece, 64ull << 20);
  EXPECT_EQ(one("OFFLOAD_CAP_WHOLE", "8MiB").cap_whole, 8ull << 20);
  EXPECT_EQ(one("OFFLOAD_CAP_WHOLE", "0").cap_whole, 0u);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_whole, 32ull << 20);
  EXPECT_EQ(one("OFFLOAD_CAP_EXTRA_PIECES", "3").cap_extra_pieces, 3u);
  EXPECT_EQ(one("OFFLOAD_CAP_EXTRA_PIECES", "0").cap_extra_pieces, 0u);
  EXPECT_EQ(one("OFFLOAD_CAP_EXTRA_PIECES", "any").cap_extra_pieces, Settings::kAnyPieces);
  EXPECT_EQ(one("OFFLOAD_CAP_EXTRA_PIECES", "auto").cap_extra_pieces, Settings::kAutoPieces);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_extra_pieces, Settings::kAnyPieces);
  EXPECT_FALSE(one("OFFLOAD_CAP_TILE", "any").cap_tile_exact);
  EXPECT_TRUE(one("OFFLOAD_CAP_TILE", "exact").cap_tile_exact);
  EXPECT_FALSE(one("OFFLOAD_CAP_TILE", "exact").cap_size_classes);
  EXPECT_TRUE(one("OFFLOAD_CAP_TILE", "class").cap_tile_exact);
  EXPECT_TRUE(one("OFFLOAD_CAP_TILE", "class").cap_size_classes);
  EXPECT_TRUE(one("OFFLOAD_DISABLE", "0").cap_refit);
  EXPECT_FALSE(one("OFFLOAD_CAP_REFIT", "0").cap_refit);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_evict_first);
  EXPECT_TRUE(one("OFFLOAD_CAP_EVICT_FIRST", "1").cap_evict_first);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_recompute);
  EXPECT_TRUE(one("OFFLOAD_CAP_RECOMPUTE", "1").cap_recompute);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_drop_first, 1u);
  EXPECT_EQ(one("OFFLOAD_CAP_DROP_FIRST", "16").cap_drop_first, 16u);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_recompute_probes, 12u);
  EXPECT_EQ(one("OFFLOAD_CAP_RECOMPUTE_PROBES", "48").cap_recompute_probes, 48u);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_recompute_updates);
  EXPECT_TRUE(one("OFFLOAD_CAP_RECOMPUTE_UPDATES", "1").cap_recompute_updates);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_plan);
  EXPECT_TRUE(one("OFFLOAD_CAP_PLAN", "1").cap_plan);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_prefetch_max, Settings::kQuarterStep);
  EXPECT_EQ(one("OFFLOAD_CAP_PREFETCH_MAX", "0").cap_prefetch_max, 0u);
  EXPECT_EQ(one("OFFLOAD_CAP_PREFETCH_MAX", "64").cap_prefetch_max, 64u);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_prefetch_grow_unwasted);
  EXPECT_TRUE(one("OFFLOAD_CAP_PREFETCH_GROW", "unwasted").cap_prefetch_grow_unwasted);
  EXPECT_FALSE(one("OFFLOAD_CAP_PREFETCH_GROW", "always").cap_prefetch_grow_unwasted);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_prefetch_nearest);
  EXPECT_TRUE(one("OFFLOAD_CAP_PREFETCH_ORDER", "nearest").cap_prefetch_nearest);
  EXPECT_FALSE(one("OFFLOAD_CAP_PREFETCH_ORDER", "slots").cap_prefetch_nearest);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_lru_victims);
  EXPECT_TRUE(one("OFFLOAD_CAP_VICTIMS", "lru").cap_lru_victims);
  EXPECT_FALSE(one("OFFLOAD_CAP_VICTIMS", "next-use").cap_lru_victims);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_prefetch_hold);
  EXPECT_TRUE(one("OFFLOAD_CAP_PREFETCH_HOLD", "on").cap_prefetch_hold);
  EXPECT_FALSE(one("OFFLOAD_CAP_PREFETCH_HOLD", "off").cap_prefetch_hold);
  EXPECT_TRUE(one("OFFLOAD_DISABLE", "0").cap_prefetch_room);
  EXPECT_TRUE(one("OFFLOAD_CAP_PREFETCH_ROOM", "on").cap_prefetch_room);
  EXPECT_FALSE(one("OFFLOAD_CAP_PREFETCH_ROOM", "off").cap_prefetch_room);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_tile_exact);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_keep_asked);
  EXPECT_TRUE(one("OFFLOAD_CAP_KEEP_ASKED", "1").cap_keep_asked);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_pool_short, 0u);
  EXPECT_EQ(one("OFFLOAD_CAP_POOL_SHORT", "512").cap_pool_short, 512u);
  EXPECT_DOUBLE_EQ(one("OFFLOAD_DISABLE", "0").cap_pool_short_share, 0.25);
  EXPECT_DOUBLE_EQ(one("OFFLOAD_CAP_POOL_SHORT_SHARE", "12.5%").cap_pool_short_share, 0.125);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_ahead_to_ceiling);
  EXPECT_TRUE(one("OFFLOAD_CAP_AHEAD_HORIZON", "ceiling").cap_ahead_to_ceiling);
  EXPECT_FALSE(one("OFFLOAD_CAP_AHEAD_HORIZON", "lead").cap_ahead_to_ceiling);
  EXPECT_FALSE(one("OFFLOAD_DISABLE", "0").cap_grant_apart);
  EXPECT_TRUE(one("OFFLOAD_CAP_GRANT", "apart").cap_grant_apart);
  EXPECT_FALSE(one("OFFLOAD_CAP_GRANT", "inline").cap_grant_apart);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_gate, 0u);
  EXPECT_EQ(one("OFFLOAD_CAP_GATE", "4MiB").cap_gate, 4ull << 20);
  EXPECT_EQ(one("OFFLOAD_CAP_GATE", "off").cap_gate, 0u);
  EXPECT_EQ(one("OFFLOAD_CAP_GATE", "0").cap_gate, 0u);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_gate_ahead, 32u);
  EXPECT_EQ(one("OFFLOAD_CAP_GATE_AHEAD", "128").cap_gate_ahead, 128u);
  EXPECT_DOUBLE_EQ(one("OFFLOAD_DISABLE", "0").cap_ahead_share, 0.125);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").cap_ahead_bytes, 0u);
  EXPECT_DOUBLE_EQ(one("OFFLOAD_CAP_AHEAD", "3%").cap_ahead_share, 0.03);
  EXPECT_DOUBLE_EQ(one("OFFLOAD_CAP_AHEAD", "0%").cap_ahead_share, 0.0);
  EXPECT_EQ(one("OFFLOAD_CAP_AHEAD", "2GiB").cap_ahead_bytes, 2ull << 30);
  EXPECT_DOUBLE_EQ(one("OFFLOAD_CAP_AHEAD", "2GiB").cap_ahead_share, 0.0);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").host_ahead, 0u);
  EXPECT_EQ(one("OFFLOAD_HOST_AHEAD", "auto").host_ahead, Settings::kHostAheadAuto);
  EXPECT_EQ(one("OFFLOAD_HOST_AHEAD", "off").host_ahead, 0u);
  EXPECT_EQ(one("OFFLOAD_HOST_AHEAD", "0").host_ahead, 0u);
  EXPECT_EQ(one("OFFLOAD_HOST_AHEAD", "3GiB").host_ahead, 3ull << 30);
  EXPECT_EQ(one("OFFLOAD_DISABLE", "0").host_premake, Settings::kHostPremakeAuto);
  EXPECT_EQ(one("OFFLOAD_HOST_PREMAKE", "auto").host_premake, Settings::kHostPremakeAuto);
  EXPECT_EQ(one("OFFLOAD_HOST_PREMAKE", "off").host_premake, 0u);
  EXPECT_EQ(one("OFFLOAD_HOST_PREMAKE", "0").host_premake, 0u);
  EXPECT_EQ(one("OFFLOAD_HOST_PREMAKE", "16GiB").host_premake, 16ull << 30);
  EXPECT_TRUE(one("OFFLOAD_DISABLE", "0").host_premake_past_eviction);
  EXPECT_TRUE(one("OFFLOAD_HOST_PREMAKE_UNTIL", "target").host_premake_past_eviction);
  EXPECT_FALSE(one("OFFLOAD_HOST_PREMAKE_UNTIL", "eviction").host_premake_past_eviction);
}

TEST(ReadSettings, EachBadValueIsAnErrorNamingTheVariable) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"OFFLOAD_TRACE_STEPS", "0"},      {"OFFLOAD_TRACE_STEPS", "-3"},   {"OFFLOAD_TRACE_STEPS", "100001"},
      {"OFFLOAD_TRACE_STEPS", "many"},   {"OFFLOAD_TRACE_STEPS", "5x"},   {"OFFLOAD_TRACE_STEPS", "99999999999999999999"},
      {"OFFLOAD_TELEMETRY", "on"},       {"OFFLOAD_TELEMETRY", "CUPTI"},  {"OFFLOAD_TRACE_LEAD", "yes"},  {"OFFLOAD_LOG_LEVEL", "verbose"},
      {"OFFLOAD_LOG_LEVEL", "trace"},    {"OFFLOAD_DISABLE", "yes"},      {"OFFLOAD_DISABLE", "2"},
      {"OFFLOAD_CAP_PIECE", "big"}, {"OFFLOAD_CAP_WHOLE", "whole"},      {"OFFLOAD_CAP_EXTRA_PIECES", "-1"}, {"OFFLOAD_CAP_EXTRA_PIECES", "many"},
      {"OFFLOAD_CAP_EXTRA_PIECES", "2000"}, {"OFFLOAD_CAP_TILE", "some"}, {"OFFLOAD_CAP_REFIT", "yes"}, {"OFFLOAD_CAP_EVICT_FIRST", "first"},
      {"OFFLOAD_CAP_RECOMPUTE", "on"}, {"OFFLOAD_CAP_KEEP_ASKED", "yes"}, {"OFFLOAD_CAP_AHEAD", "60%"},
      {"OFFLOAD_CAP_AHEAD", "-1%"}, {"OFFLOAD_CAP_AHEAD", "x%"}, {"OFFLOAD_CAP_AHEAD", "%"}, {"OFFLOAD_CAP_AHEAD", "a lot"},
      {"OFFLOAD_CAP_DROP_FIRST", "0"}, {"OFFLOAD_CAP_DROP_FIRST", "2000"}, {"OFFLOAD_CAP_DROP_FIRST", "first"},
      {"OFFLOAD_CAP_RECOMPUTE_PROBES", "2"}, {"OFFLOAD_CAP_RECOMPUTE_PROBES", "256"}, {"OFFLOAD_CAP_RECOMPUTE_PROBES", "many"},
      {"OFFLOAD_CAP_RECOMPUTE_UPDATES", "yes"}, {"OFFLOAD_CAP_AHEAD_HORIZON", "far"}, {"OFFLOAD_CAP_GRANT", "later"}, {"OFFLOAD_CAP_GATE", "on"}, {"OFFLOAD_CAP_GATE", "4KiB"}, {"OFFLOAD_CAP_GATE", "2GiB"}, {"OFFLOAD_CAP_GATE_AHEAD", "0"}, {"OFFLOAD_CAP_GATE_AHEAD", "4096"}, {"OFFLOAD_CAP_GATE_AHEAD", "many"}, {"OFFLOAD_CAP_AHEAD_HORIZON", "1"},
      {"OFFLOAD_CAP_PREFETCH_MAX", "-1"}, {"OFFLOAD_CAP_PREFETCH_MAX", "soon"}, {"OFFLOAD_CAP_PREFETCH_MAX", "2000000"}, {"OFFLOAD_CAP_PREFETCH_GROW", "never"}, {"OFFLOAD_CAP_PREFETCH_ORDER", "furthest"}, {"OFFLOAD_CAP_VICTIMS", "belady"}, {"OFFLOAD_CAP_PREFETCH_HOLD", "yes"}, {"OFFLOAD_CAP_PREFETCH_ROOM", "1"}, {"OFFLOAD_CAP_POOL_SHORT", "short"}, {"OFFLOAD_CAP_POOL_SHORT", "-3"}, {"OFFLOAD_CAP_POOL_SHORT_SHARE", "0%"}, {"OFFLOAD_CAP_POOL_SHORT_SHARE", "60%"}, {"OFFLOAD_CAP_POOL_SHORT_SHARE", "0.25"},
      {"OFFLOAD_HOST_AHEAD", "on"}, {"OFFLOAD_HOST_AHEAD", "1MiB"}, {"OFFLOAD_HOST_AHEAD", "-1GiB"},
      {"OFFLOAD_HOST_PREMAKE", "on"}, {"OFFLOAD_HOST_PREMAKE", "1MiB"}, {"OFFLOAD_HOST_PREMAKE", "lots"},
      {"OFFLOAD_HOST_PREMAKE_UNTIL", "step"},
  };
  for (auto [var, val] : bad) {
    Env env;
    env.vars[var] = val;
    std::vector<std::string> errors;
    Settings s = read(env, &errors);
    ASSERT_EQ(errors.size(), 1u) << var << "=" << val;
    EXPECT_NE(errors[0].find(var), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find(std::string("'") + val + "'"), std::string::npos) << "names the value: " << errors[0];
    EXPECT_NE(errors[0].find("expected"), std::string::npos) << "says what is accepted: " << errors[0];
    // A bad value leaves the default in place.
    Settings d;
    EXPECT_EQ(s.trace_steps, d.trace_steps);
    EXPECT_EQ(s.telemetry, d.telemetry);
    EXPECT_EQ(s.log_level, d.log_level);
    EXPECT_EQ(s.enabled, d.enabled);
  }
}

TEST(ReadSettings, SeveralBadValuesAreAllReported) {
  Env env;
  env.vars = {{"OFFLOAD_TRACE_STEPS", "x"}, {"OFFLOAD_TELEMETRY", "y"}, {"OFFLOAD_LOG_LEVEL", "z"},
              {"OFFLOAD_DISABLE", "w"}, {"OFFLOAD_TRACE", "/ok"}};
  std::vector<std::string> errors;
  Settings s = read(env, &errors);
  EXPECT_EQ(errors.size(), 4u);
  EXPECT_EQ(s.trace_dir, "/ok");
}

}  // namespace
}  // namespace offload

namespace offload {
namespace {

TEST(DeviceBudget, SizesAndFractions) {
  struct Case {
    const char* value;
    uint64_t bytes;
    double fraction;
  };
  for (Case c : {Case{"40GiB", 40ull << 30, 0}, Case{"12884901888", 12884901888ull, 0}, Case{"16MiB", 16ull << 20, 0},
                 Case{"0.5", 0, 0.5}, Case{"50%", 0, 0.5}, Case{"1.0", 0, 1.0}, Case{"100%", 0, 1.0},
                 Case{"12.5%", 0, 0.125}}) {
    Env env;
    env.vars["OFFLOAD_DEVICE_BUDGET"] = c.value;
    std::vector<std::string> errors;
    Settings s = read(env, &errors);
    EXPECT_TRUE(errors.empty()) << c.value;
    EXPECT_EQ(s.device_budget, c.bytes) << c.value;
    EXPECT_DOUBLE_EQ(s.device_budget_fraction, c.fraction) << c.value;
    EXPECT_TRUE(s.offload()) << c.value;
  }
  Settings half;
  half.device_budget_fraction = 0.5;
  EXPECT_EQ(half.budget_bytes(80ull << 30), 40ull << 30);
  EXPECT_EQ(half.budget_bytes(0), 0u);  // an unknown GPU size gives no budget
  Settings none;
  EXPECT_FALSE(none.offload());
  EXPECT_EQ(none.budget_bytes(80ull << 30), 0u);
}

TEST(DeviceBudget, BlocksTheCacheKeepsComeOutOfWhatThePlanMayFill) {
  Settings s;
  s.device_budget = 20ull << 30;
  EXPECT_EQ(s.plan_budget_bytes(141ull << 30), 20ull << 30) << "no cache: the whole budget";
  s.block_cache = 512ull << 20;
  EXPECT_EQ(s.block_cache_under(s.budget_bytes(0)), 512ull << 20);
  EXPECT_EQ(s.plan_budget_bytes(141ull << 30), (20ull << 30) - (512ull << 20));
  // A cache of more than half the budget keeps half of it; the plan gets the other half.
  s.block_cache = 30ull << 30;
  EXPECT_EQ(s.block_cache_under(20ull << 30), 10ull << 30);
  EXPECT_EQ(s.plan_budget_bytes(141ull << 30), 10ull << 30);
  // A budget as a fraction of an unknown GPU: no budget, and the cache keeps its own bound.
  Settings f;
  f.device_budget_fraction = 0.5;
  f.block_cache = 512ull << 20;
  EXPECT_EQ(f.plan_budget_bytes(0), 0u);
  EXPECT_EQ(f.block_cache_under(f.budget_bytes(0)), 512ull << 20);
  EXPECT_EQ(f.plan_budget_bytes(80ull << 30), (40ull << 30) - (512ull << 20));
  // Observing only: nothing to plan, the cache as asked.
  Settings none;
  none.block_cache = 512ull << 20;
  EXPECT_EQ(none.plan_budget_bytes(80ull << 30), 0u);
  EXPECT_EQ(none.block_cache_under(none.budget_bytes(80ull << 30)), 512ull << 20);
}

TEST(DeviceBudget, BadValuesAreErrorsThatSayWhatIsAccepted) {
  for (const char* v : {"0", "0.0", "0%", "1.5", "150%", "-1", "-0.5", "10MiB", "1", "lots", "40 GiB", "%", "0.5.5",
                        "nan", "inf"}) {
    Env env;
    env.vars["OFFLOAD_DEVICE_BUDGET"] = v;
    std::vector<std::string> errors;
    Settings s = read(env, &errors);
    ASSERT_EQ(errors.size(), 1u) << v;
    EXPECT_NE(errors[0].find("OFFLOAD_DEVICE_BUDGET"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("a share of the GPU's memory"), std::string::npos) << errors[0];
    EXPECT_FALSE(s.offload()) << v;
  }
}

}  // namespace
}  // namespace offload

namespace offload {
namespace {

TEST(Planner, OffloadPlannerChoosesTheBuiltInPlanOrSaysWhatIsAccepted) {
  {
    Env env;
    std::vector<std::string> errors;
    EXPECT_FALSE(read(env, &errors).builtin_plan);
    EXPECT_TRUE(errors.empty());
  }
  for (const char* v : {"auto", "builtin"}) {
    Env env;
    env.vars["OFFLOAD_PLANNER"] = v;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).builtin_plan, std::string(v) == "builtin") << v;
    EXPECT_TRUE(errors.empty()) << v;
  }
  for (const char* v : {"gpu", "Builtin", "built-in", "1"}) {
    Env env;
    env.vars["OFFLOAD_PLANNER"] = v;
    std::vector<std::string> errors;
    EXPECT_FALSE(read(env, &errors).builtin_plan) << v;
    ASSERT_EQ(errors.size(), 1u) << v;
    EXPECT_NE(errors[0].find("OFFLOAD_PLANNER"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("auto or builtin"), std::string::npos) << errors[0];
  }
}

// One meaning of a share everywhere: of the GPU's memory ("50%", "50%gpu", "0.5"); "%step" says
// a share of a recorded step's footprint, which the shim refuses (no step is known at the start).
TEST(DeviceBudget, ASharesMeaningIsTheSameEverywhereAndStepSharesAreExplicit) {
  using Of = BudgetSpec::Of;
  struct Case {
    const char* text;
    std::optional<Of> of;
    double share;
    uint64_t bytes;
  };
  const Case cases[] = {
      {"40GiB", Of::Bytes, 0, 40ull << 30}, {"50%", Of::Gpu, 0.5, 0},     {"50%gpu", Of::Gpu, 0.5, 0},
      {"0.5", Of::Gpu, 0.5, 0},             {"50%step", Of::Step, 0.5, 0}, {"100%step", Of::Step, 1.0, 0},
      {"12.5%", Of::Gpu, 0.125, 0},         {"150%", std::nullopt, 0, 0},  {"0%step", std::nullopt, 0, 0},
      {"%step", std::nullopt, 0, 0},        {"50%cpu", std::nullopt, 0, 0}, {"1.5", std::nullopt, 0, 0},
      {"x%", std::nullopt, 0, 0},           {"0", std::nullopt, 0, 0},
  };
  for (const Case& c : cases) {
    const auto b = parse_budget(c.text);
    ASSERT_EQ(b.has_value(), c.of.has_value()) << c.text;
    if (!b) continue;
    EXPECT_EQ(b->of, *c.of) << c.text;
    EXPECT_DOUBLE_EQ(b->share, c.share) << c.text;
    EXPECT_EQ(b->bytes, c.bytes) << c.text;
  }
  for (const char* v : {"50%gpu", "50%"}) {
    Env env;
    env.vars["OFFLOAD_DEVICE_BUDGET"] = v;
    std::vector<std::string> errors;
    EXPECT_DOUBLE_EQ(read(env, &errors).device_budget_fraction, 0.5) << v;
    EXPECT_TRUE(errors.empty()) << v;
  }
  Env env;
  env.vars["OFFLOAD_DEVICE_BUDGET"] = "50%step";
  std::vector<std::string> errors;
  EXPECT_FALSE(read(env, &errors).offload());
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("before any step is seen"), std::string::npos) << errors[0];
}

// Watching alone is light (launches counted, not scanned); a budget or a trace needs every
// launch scanned, so they make it full unless OFFLOAD_OBSERVE says otherwise.
TEST(Observe, LightWithoutABudgetOrATraceFullWithEitherOrWhenAsked) {
  struct Case {
    std::map<std::string, std::string> vars;
    bool full;
  };
  const Case cases[] = {
      {{}, false},
      {{{"OFFLOAD_DEVICE_BUDGET", "40GiB"}}, true},
      {{{"OFFLOAD_DEVICE_BUDGET", "50%"}}, true},
      {{{"OFFLOAD_TRACE", "/tmp/t"}}, true},
      {{{"OFFLOAD_OBSERVE", "full"}}, true},
      {{{"OFFLOAD_OBSERVE", "light"}}, false},
      {{{"OFFLOAD_OBSERVE", "light"}, {"OFFLOAD_TRACE", "/tmp/t"}}, false},
      {{{"OFFLOAD_OBSERVE", "full"}, {"OFFLOAD_DEVICE_BUDGET", "40GiB"}}, true},
  };
  for (const Case& c : cases) {
    Env env;
    env.vars = c.vars;
    std::vector<std::string> errors;
    Settings s = read(env, &errors);
    EXPECT_TRUE(errors.empty()) << (errors.empty() ? "" : errors[0]);
    EXPECT_EQ(s.observe_full(), c.full) << ::testing::PrintToString(c.vars);
  }
}

TEST(Observe, BadValuesAndLightUnderABudgetAreErrors) {
  for (const char* v : {"Light", "none", "1"}) {
    Env env;
    env.vars["OFFLOAD_OBSERVE"] = v;
    std::vector<std::string> errors;
    read(env, &errors);
    ASSERT_EQ(errors.size(), 1u) << v;
    EXPECT_NE(errors[0].find("light or full"), std::string::npos) << errors[0];
  }
  Env env;
  env.vars = {{"OFFLOAD_OBSERVE", "light"}, {"OFFLOAD_DEVICE_BUDGET", "40GiB"}};
  std::vector<std::string> errors;
  read(env, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("a budget needs every launch scanned"), std::string::npos) << errors[0];
}

TEST(Planner, OffloadPoolRefineIsOnUnlessTurnedOffAndSaysWhatIsAccepted) {
  {
    Env env;
    std::vector<std::string> errors;
    EXPECT_TRUE(read(env, &errors).pool_refine);
    EXPECT_TRUE(errors.empty());
  }
  for (const char* v : {"0", "false", "1", "true"}) {
    Env env;
    env.vars["OFFLOAD_POOL_REFINE"] = v;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).pool_refine, v[0] == '1' || v[0] == 't') << v;
    EXPECT_TRUE(errors.empty()) << v;
  }
  for (const char* v : {"off", "yes", "2", "True"}) {
    Env env;
    env.vars["OFFLOAD_POOL_REFINE"] = v;
    std::vector<std::string> errors;
    EXPECT_TRUE(read(env, &errors).pool_refine) << v;  // the default stands
    ASSERT_EQ(errors.size(), 1u) << v;
    EXPECT_NE(errors[0].find("OFFLOAD_POOL_REFINE"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("0, 1, true or false"), std::string::npos) << errors[0];
  }
}

TEST(Persistent, OffloadPersistentMinTakesASizeOrOff) {
  {
    Env env;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).persistent_min, 0u);
    EXPECT_TRUE(errors.empty());
  }
  const std::pair<const char*, uint64_t> good[] = {{"32MiB", 32ull << 20}, {"2MiB", 2ull << 20}, {"1GiB", 1ull << 30}, {"off", 0}, {"0", 0}};
  for (auto [v, want] : good) {
    Env env;
    env.vars["OFFLOAD_PERSISTENT_MIN"] = v;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).persistent_min, want) << v;
    EXPECT_TRUE(errors.empty()) << v;
  }
  for (const char* v : {"1MiB", "lots", "-5MiB", "32 MiB", "on"}) {
    Env env;
    env.vars["OFFLOAD_PERSISTENT_MIN"] = v;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).persistent_min, 0u) << v;
    ASSERT_EQ(errors.size(), 1u) << v;
    EXPECT_NE(errors[0].find("OFFLOAD_PERSISTENT_MIN"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("at least 2MiB"), std::string::npos) << errors[0];
  }
}

TEST(Settings, BlockCacheTakesASizeOrOffAndRejectsTheRestByName) {
  {
    Env env;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).block_cache, 0u) << "off unless asked for";
    EXPECT_TRUE(errors.empty());
  }
  const std::pair<const char*, uint64_t> good[] = {{"8GiB", 8ull << 30}, {"512MiB", 512ull << 20}, {"off", 0}, {"0", 0}};
  for (auto [v, want] : good) {
    Env env;
    env.vars["OFFLOAD_BLOCK_CACHE"] = v;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).block_cache, want) << v;
    EXPECT_TRUE(errors.empty()) << v;
  }
  for (const char* v : {"lots", "-5MiB", "on", "8 GiB"}) {
    Env env;
    env.vars["OFFLOAD_BLOCK_CACHE"] = v;
    std::vector<std::string> errors;
    EXPECT_EQ(read(env, &errors).block_cache, 0u) << v;
    ASSERT_EQ(errors.size(), 1u) << v;
    EXPECT_NE(errors[0].find("OFFLOAD_BLOCK_CACHE"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find(v), std::string::npos) << "names the value: " << errors[0];
  }
}

// A typo in a variable's name would be ignored in silence: the names liboffload does not read
// are listed, with the known name they are closest to.
TEST(UnknownSettings, TyposAreNamedWithTheClosestKnownName) {
  const char* env[] = {"PATH=/usr/bin", "OFFLOAD_DEVICE_BUDGET=40GiB", "OFFLOAD_BUDGET=40GiB",
                       "OFFLOAD_TELEMTRY=off", "OFFLOAD_XYZZY_FOO=1", "OFFLOAD_LIB=/x.so", "NOT_OFFLOAD_X=1", nullptr};
  const std::vector<std::string> got = unknown_settings(env);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "OFFLOAD_BUDGET (did you mean OFFLOAD_DEVICE_BUDGET?)");
  EXPECT_EQ(got[1], "OFFLOAD_TELEMTRY (did you mean OFFLOAD_TELEMETRY?)");
  EXPECT_EQ(got[2], "OFFLOAD_XYZZY_FOO");
  const char* clean[] = {"OFFLOAD_CAP=1", "HOME=/root", nullptr};
  EXPECT_TRUE(unknown_settings(clean).empty());
  EXPECT_TRUE(unknown_settings(nullptr).empty());
}

}  // namespace
}  // namespace offload
