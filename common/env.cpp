#include "common/env.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <string_view>

namespace offload {

std::optional<uint64_t> parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  char* end = nullptr;
  std::string num = s.substr(0, i);
  double v = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(v) || v < 0) return std::nullopt;
  std::string unit;
  for (size_t k = i; k < s.size(); ++k) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(s[k])));
  double mult;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "ki" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mi" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gi" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "ti" || unit == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else return std::nullopt;
  double bytes = v * mult;
  if (bytes >= 18446744073709551615.0) return std::nullopt;
  return static_cast<uint64_t>(bytes);
}

std::optional<BudgetSpec> parse_budget(const std::string& s) {
  BudgetSpec b;
  std::string num = s;
  bool percent = false;
  for (auto [suffix, of] : {std::pair{"%step", BudgetSpec::Of::Step}, {"%gpu", BudgetSpec::Of::Gpu}, {"%", BudgetSpec::Of::Gpu}})
    if (num.ends_with(suffix)) {
      num.resize(num.size() - strlen(suffix));
      b.of = of;
      percent = true;
      break;
    }
  const bool decimal = num.find('.') != std::string::npos && num.find_first_not_of("0123456789.") == std::string::npos;
  if (percent || decimal) {
    char* end = nullptr;
    double f = std::strtod(num.c_str(), &end);
    if (percent) f /= 100;
    if (num.empty() || *end || !std::isfinite(f) || f <= 0 || f > 1 || num.find_first_not_of("0123456789.") != std::string::npos)
      return std::nullopt;
    if (!percent) b.of = BudgetSpec::Of::Gpu;
    b.share = f;
    return b;
  }
  auto size = parse_size(s);
  if (!size || *size == 0) return std::nullopt;
  b.bytes = *size;
  return b;
}

namespace {

// A whole number from lo to hi, in decimal with nothing after it; nullopt for anything else.
std::optional<uint64_t> parse_count(const char* v, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*v == '-' || end == v || *end || n < lo || n > hi) return std::nullopt;
  return n;
}

// A percentage, "N%" with nothing else (N finite), as N; nullopt for anything else.
std::optional<double> parse_percent(const char* v) {
  const std::string_view sv(v);
  if (!sv.ends_with("%")) return std::nullopt;
  char* end = nullptr;
  const double pct = std::strtod(v, &end);
  if (end == v || end != v + sv.size() - 1 || !std::isfinite(pct)) return std::nullopt;
  return pct;
}

// Reads the variables one at a time; what is wrong with each is said in the order read.
struct SettingsReader {
  const std::function<const char*(const char*)>& get;
  std::vector<std::string>* errors;

  void bad(const char* var, const char* val, const char* accepted) const {
    errors->push_back(std::string(var) + "='" + val + "' is not valid: expected " + accepted);
  }
  // A switch: 1 or true turns it on, 0 or false leaves it off; anything else is said.
  void flag(const char* var, bool& on) const {
    const char* v = get(var);
    if (!v || !*v) return;
    const std::string s = v;
    if (s == "1" || s == "true") on = true;
    else if (s == "0" || s == "false") on = false;
    else bad(var, v, "0, 1, true or false");
  }
  // One of two words: `off` leaves the setting off (the default), `on` turns it on; anything
  // else is said, with what each means.
  void choice(const char* var, const char* off, const char* on, bool& set, const char* accepted) const {
    const char* v = get(var);
    if (!v || !*v) return;
    if (std::string_view(v) == on) set = true;
    else if (std::string_view(v) == off) set = false;
    else bad(var, v, accepted);
  }
  // `auto` (set to `auto_value`), `off` or 0 (0), or a size of at least 64 MiB.
  void auto_size(const char* var, uint64_t auto_value, uint64_t& set, const char* example) const {
    const char* v = get(var);
    if (!v || !*v) return;
    const std::string_view sv(v);
    const auto size = parse_size(v);
    if (sv == "auto") set = auto_value;
    else if (sv == "off" || (size && *size == 0)) set = 0;
    else if (size && *size >= (64ull << 20)) set = *size;
    else bad(var, v, (std::string("auto, off, or a size of at least 64MiB (e.g. ") + example + ")").c_str());
  }
};

// The trace, telemetry, logging and daemon settings.
void read_tooling(const SettingsReader& in, Settings& st) {
  const auto& get = in.get;
  if (const char* v = get("OFFLOAD_TRACE"); v && *v) st.trace_dir = v;
  if (const char* v = get("OFFLOAD_TRACE_STEPS"); v && *v) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end || n < 1 || n > 100000) in.bad("OFFLOAD_TRACE_STEPS", v, "a step count from 1 to 100000");
    else st.trace_steps = static_cast<uint32_t>(n);
  }
  in.flag("OFFLOAD_TRACE_LEAD", st.trace_lead);
  if (const char* v = get("OFFLOAD_TELEMETRY"); v && *v) {
    std::string s = v;
    if (s == "cupti") st.telemetry = true;
    else if (s == "sampled") st.telemetry = st.telemetry_sampled = true;
    else if (s == "off") st.telemetry = false;
    else in.bad("OFFLOAD_TELEMETRY", v, "'cupti', 'sampled' or 'off'");
  }
  if (const char* v = get("OFFLOAD_CUPTI_LIB"); v && *v) st.cupti_lib = v;
  if (const char* v = get("OFFLOAD_LOG_LEVEL"); v && *v) {
    std::string s = v;
    if (s == "debug" || s == "info" || s == "warn" || s == "error" || s == "off") st.log_level = s, st.log_level_set = true;
    else in.bad("OFFLOAD_LOG_LEVEL", v, "one of debug, info, warn, error, off");
  }
  if (const char* v = get("OFFLOAD_DISABLE"); v && *v) {
    std::string s = v;
    if (s == "1" || s == "true") st.enabled = false;
    else if (s == "0" || s == "false") st.enabled = true;
    else in.bad("OFFLOAD_DISABLE", v, "0, 1, true or false");
  }
  if (const char* v = get("OFFLOAD_DAEMON"); v && *v) {
    std::string s = v;
    if (s == "auto" || s == "connect" || s == "off") st.daemon = s;
    else in.bad("OFFLOAD_DAEMON", v, "'auto' (connect, else start offloadd), 'connect' (only connect) or 'off'");
  }
  if (const char* v = get("OFFLOAD_DAEMON_BIN"); v && *v) st.daemon_bin = v;
}

// The memory settings: the host pool, the device budget, the weights, the block cache, the planner.
void read_memory(const SettingsReader& in, Settings& st) {
  const auto& get = in.get;
  if (const char* v = get("OFFLOAD_HOST_POOL"); v && *v) {
    auto size = parse_size(v);
    if (!size || *size < (64ull << 20)) in.bad("OFFLOAD_HOST_POOL", v, "a size of at least 64MiB, e.g. 32GiB");
    else {
      st.host_pool_bytes = *size;
      st.host_pool_set = true;
    }
  }
  if (const char* v = get("OFFLOAD_DEVICE_BUDGET"); v && *v) {
    const auto b = parse_budget(v);
    if (b && b->of == BudgetSpec::Of::Step)
      in.bad("OFFLOAD_DEVICE_BUDGET", v,
             "a size or a share of the GPU's memory: the budget holds from the first allocation, before any step is seen");
    else if (!b || (b->of == BudgetSpec::Of::Bytes && b->bytes < (16ull << 20)))
      in.bad("OFFLOAD_DEVICE_BUDGET", v, "a size of at least 16MiB (e.g. 40GiB) or a share of the GPU's memory (50%, 50%gpu or 0.5)");
    else if (b->of == BudgetSpec::Of::Gpu) st.device_budget_fraction = b->share;
    else st.device_budget = b->bytes;
  }
  if (const char* v = get("OFFLOAD_PERSISTENT_MIN"); v && *v) {
    std::string s = v;
    auto size = s == "off" ? std::optional<uint64_t>(0) : parse_size(s);
    if (!size || (*size && *size < (2ull << 20)))
      in.bad("OFFLOAD_PERSISTENT_MIN", v, "a size of at least 2MiB (e.g. 32MiB), or off (0)");
    else st.persistent_min = *size;
  }
  if (const char* v = get("OFFLOAD_BLOCK_CACHE"); v && *v) {
    std::string s = v;
    auto size = s == "off" ? std::optional<uint64_t>(0) : parse_size(s);
    if (!size) in.bad("OFFLOAD_BLOCK_CACHE", v, "a size (e.g. 8GiB: freed blocks kept at most), or off (0)");
    else st.block_cache = *size;
  }
  if (const char* v = get("OFFLOAD_PLANNER"); v && *v) {
    std::string s = v;
    if (s == "builtin") st.builtin_plan = true;
    else if (s != "auto") in.bad("OFFLOAD_PLANNER", v, "auto or builtin");
  }
  in.flag("OFFLOAD_POOL_REFINE", st.pool_refine);
}

// The cap's settings.
void read_cap(const SettingsReader& in, Settings& st) {
  const auto& get = in.get;
  in.flag("OFFLOAD_CAP", st.cap);
  if (const char* v = get("OFFLOAD_CAP_MIN"); v && *v) {
    auto size = parse_size(v);
    if (!size || *size < (64ull << 10)) in.bad("OFFLOAD_CAP_MIN", v, "a size of at least 64KiB (e.g. 2MiB)");
    else st.cap_min = *size;
  }
  if (const char* v = get("OFFLOAD_CAP_PIECE"); v && *v) {
    auto size = parse_size(v);
    if (!size) in.bad("OFFLOAD_CAP_PIECE", v, "a size (e.g. 64MiB), or 0 for one handle per range");
    else st.cap_piece = *size;
  }
  if (const char* v = get("OFFLOAD_CAP_WHOLE"); v && *v) {
    auto size = parse_size(v);
    if (!size) in.bad("OFFLOAD_CAP_WHOLE", v, "a size (e.g. 16MiB), or 0 to let spares tile any range");
    else st.cap_whole = *size;
  }
  if (const char* v = get("OFFLOAD_CAP_EXTRA_PIECES"); v && *v) {
    if (std::string_view(v) == "any") st.cap_extra_pieces = Settings::kAnyPieces;
    else if (std::string_view(v) == "auto") st.cap_extra_pieces = Settings::kAutoPieces;
    else if (const auto n = parse_count(v, 0, 1024)) st.cap_extra_pieces = *n;
    else in.bad("OFFLOAD_CAP_EXTRA_PIECES", v, "a count from 0 to 1024, any, or auto");
  }
  if (const char* v = get("OFFLOAD_CAP_TILE"); v && *v) {
    if (std::string_view(v) == "exact") st.cap_tile_exact = true, st.cap_size_classes = false;
    else if (std::string_view(v) == "class") st.cap_tile_exact = true, st.cap_size_classes = true;
    else if (std::string_view(v) == "any") st.cap_tile_exact = false, st.cap_size_classes = false;
    else in.bad("OFFLOAD_CAP_TILE", v, "exact, class or any");
  }
  in.flag("OFFLOAD_CAP_REFIT", st.cap_refit);
  in.flag("OFFLOAD_CAP_EVICT_FIRST", st.cap_evict_first);
  in.flag("OFFLOAD_CAP_KEEP_ASKED", st.cap_keep_asked);
  if (const char* v = get("OFFLOAD_CAP_POOL_SHORT"); v && *v) {
    if (const auto n = parse_count(v, 0, 1'000'000)) st.cap_pool_short = uint32_t(*n);
    else in.bad("OFFLOAD_CAP_POOL_SHORT", v, "a count of launches from 0 (off) to 1000000");
  }
  if (const char* v = get("OFFLOAD_CAP_POOL_SHORT_SHARE"); v && *v) {
    if (const auto pct = parse_percent(v); pct && *pct > 0 && *pct <= 50) st.cap_pool_short_share = *pct / 100;
    else in.bad("OFFLOAD_CAP_POOL_SHORT_SHARE", v, "a share of the budget above 0% and up to 50% (e.g. 25%)");
  }
  in.choice("OFFLOAD_CAP_AHEAD_HORIZON", "lead", "ceiling", st.cap_ahead_to_ceiling,
            "lead (the current prefetch lead) or ceiling (a quarter step)");
  in.choice("OFFLOAD_CAP_GRANT", "inline", "apart", st.cap_grant_apart,
            "inline (each mapping's access granted where it is made) or apart (on a thread of its own)");
  if (const char* v = get("OFFLOAD_CAP_GATE"); v && *v) {
    const auto size = std::string_view(v) == "off" ? std::optional<uint64_t>(0) : parse_size(v);
    if (!size || (*size && (*size < (256ull << 10) || *size > (1ull << 30))))
      in.bad("OFFLOAD_CAP_GATE", v, "off, or the size of a gated chunk of a copy out, 256KiB to 1GiB (e.g. 4MiB)");
    else st.cap_gate = *size;
  }
  if (const char* v = get("OFFLOAD_CAP_GATE_AHEAD"); v && *v) {
    if (const auto n = parse_count(v, 1, 1024)) st.cap_gate_ahead = uint32_t(*n);
    else in.bad("OFFLOAD_CAP_GATE_AHEAD", v, "a count of gated chunks from 1 to 1024 queued ahead of the link before chunks widen");
  }
  if (const char* v = get("OFFLOAD_CAP_AHEAD"); v && *v) {
    const auto pct = parse_percent(v);
    const auto size = std::string_view(v).ends_with("%") ? std::nullopt : parse_size(v);
    if (size) st.cap_ahead_bytes = *size, st.cap_ahead_share = 0;
    else if (pct && *pct >= 0 && *pct <= 50) st.cap_ahead_share = *pct / 100, st.cap_ahead_bytes = 0;
    else in.bad("OFFLOAD_CAP_AHEAD", v, "a share of the budget from 0% to 50% (e.g. 12.5%), or a size (e.g. 2GiB)");
  }
  in.flag("OFFLOAD_CAP_RECOMPUTE", st.cap_recompute);
  in.flag("OFFLOAD_CAP_PLAN", st.cap_plan);
  in.flag("OFFLOAD_CAP_RECOMPUTE_UPDATES", st.cap_recompute_updates);
  if (const char* v = get("OFFLOAD_CAP_DROP_FIRST"); v && *v) {
    if (const auto n = parse_count(v, 1, 1024)) st.cap_drop_first = uint32_t(*n);
    else in.bad("OFFLOAD_CAP_DROP_FIRST", v, "a factor from 1 (by next use alone) to 1024");
  }
  if (const char* v = get("OFFLOAD_CAP_RECOMPUTE_PROBES"); v && *v) {
    if (const auto n = parse_count(v, 3, 255)) st.cap_recompute_probes = uint32_t(*n);
    else in.bad("OFFLOAD_CAP_RECOMPUTE_PROBES", v, "a count of launches a kernel from 3 to 255");
  }
  if (const char* v = get("OFFLOAD_CAP_PREFETCH_MAX"); v && *v) {
    if (const auto n = parse_count(v, 0, 1'000'000)) st.cap_prefetch_max = *n;
    else in.bad("OFFLOAD_CAP_PREFETCH_MAX", v, "a count of launches from 0 (no prefetching) to 1000000");
  }
  in.choice("OFFLOAD_CAP_PREFETCH_GROW", "always", "unwasted", st.cap_prefetch_grow_unwasted,
            "always (a late prefetch doubles the lead) or unwasted (only with none gone out unused within the lead)");
  in.choice("OFFLOAD_CAP_VICTIMS", "next-use", "lru", st.cap_lru_victims,
            "next-use (predicted from the step before, with prefetches) or lru (least recently used, reloads on demand only)");
  in.choice("OFFLOAD_CAP_PREFETCH_ORDER", "slots", "nearest", st.cap_prefetch_nearest,
            "slots (in the order the ranges were made) or nearest (the nearest predicted use first)");
  in.choice("OFFLOAD_CAP_PREFETCH_HOLD", "off", "on", st.cap_prefetch_hold,
            "off or on (a range prefetched and evicted unused is prefetched again only past where it was evicted)");
  in.choice("OFFLOAD_CAP_PREFETCH_ROOM", "off", "on", st.cap_prefetch_room,
            "off or on (a prefetch leaves room for what the allocations before its use took a step earlier)");
}

}  // namespace

Settings read_settings(const std::function<const char*(const char*)>& get,
                       std::vector<std::string>* errors) {
  Settings st;
  const SettingsReader in{get, errors};
  read_tooling(in, st);
  read_memory(in, st);
  read_cap(in, st);
  // After the budget: light observation is refused under one.
  if (const char* v = get("OFFLOAD_OBSERVE"); v && *v) {
    const std::string o = v;
    if (o != "light" && o != "full") in.bad("OFFLOAD_OBSERVE", v, "light or full");
    else if (o == "light" && st.offload())
      in.bad("OFFLOAD_OBSERVE", v, "full, or unset, with OFFLOAD_DEVICE_BUDGET (a budget needs every launch scanned)");
    else st.observe = o;
  }
  if (const char* v = get("OFFLOAD_HOST_LIMIT"); v && *v) {
    auto size = parse_size(v);
    if (!size || *size < (64ull << 20)) in.bad("OFFLOAD_HOST_LIMIT", v, "a size of at least 64MiB (e.g. 64GiB)");
    else st.host_limit = *size;
  }
  in.auto_size("OFFLOAD_HOST_AHEAD", Settings::kHostAheadAuto, st.host_ahead, "2GiB");
  in.auto_size("OFFLOAD_HOST_PREMAKE", Settings::kHostPremakeAuto, st.host_premake, "16GiB");
  in.choice("OFFLOAD_HOST_PREMAKE_UNTIL", "eviction", "target", st.host_premake_past_eviction,
            "eviction (the making stops at the first eviction) or target (it goes on to its size)");
  return st;
}

namespace {

// Every variable liboffload reads (the README's table), and the launcher's OFFLOAD_LIB.
constexpr const char* kKnownSettings[] = {
    "OFFLOAD_DEVICE_BUDGET", "OFFLOAD_CAP",       "OFFLOAD_CAP_MIN",     "OFFLOAD_CAP_PIECE", "OFFLOAD_CAP_WHOLE", "OFFLOAD_CAP_EXTRA_PIECES", "OFFLOAD_CAP_TILE", "OFFLOAD_CAP_REFIT", "OFFLOAD_CAP_EVICT_FIRST", "OFFLOAD_CAP_KEEP_ASKED", "OFFLOAD_CAP_POOL_SHORT", "OFFLOAD_CAP_POOL_SHORT_SHARE", "OFFLOAD_CAP_AHEAD", "OFFLOAD_CAP_AHEAD_HORIZON", "OFFLOAD_CAP_GRANT", "OFFLOAD_CAP_GATE", "OFFLOAD_CAP_GATE_AHEAD", "OFFLOAD_CAP_RECOMPUTE", "OFFLOAD_CAP_DROP_FIRST", "OFFLOAD_CAP_RECOMPUTE_PROBES", "OFFLOAD_CAP_RECOMPUTE_UPDATES", "OFFLOAD_CAP_PLAN", "OFFLOAD_CAP_PREFETCH_MAX", "OFFLOAD_CAP_PREFETCH_GROW", "OFFLOAD_CAP_PREFETCH_ORDER", "OFFLOAD_CAP_PREFETCH_HOLD", "OFFLOAD_CAP_PREFETCH_ROOM", "OFFLOAD_CAP_VICTIMS", "OFFLOAD_HOST_LIMIT", "OFFLOAD_HOST_AHEAD", "OFFLOAD_HOST_PREMAKE", "OFFLOAD_HOST_PREMAKE_UNTIL",
    "OFFLOAD_HOST_POOL",     "OFFLOAD_PERSISTENT_MIN", "OFFLOAD_PLANNER", "OFFLOAD_POOL_REFINE",
    "OFFLOAD_BLOCK_CACHE",   "OFFLOAD_TELEMETRY", "OFFLOAD_CUPTI_LIB",   "OFFLOAD_TRACE",
    "OFFLOAD_TRACE_STEPS",   "OFFLOAD_TRACE_LEAD", "OFFLOAD_DAEMON",     "OFFLOAD_DAEMON_BIN",
    "OFFLOAD_SOCKET",        "OFFLOAD_LOG_LEVEL", "OFFLOAD_DISABLE",     "OFFLOAD_LIB",
    "OFFLOAD_OBSERVE"};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> unknown_settings(const char* const* env) {
  std::vector<std::string> out;
  for (; env && *env; ++env) {
    const std::string kv = *env;
    if (kv.rfind("OFFLOAD_", 0) != 0) continue;
    const std::string name = kv.substr(0, kv.find('='));
    if (std::find(std::begin(kKnownSettings), std::end(kKnownSettings), name) != std::end(kKnownSettings)) continue;
    // The closest known name, if the two differ by a typo or a missing word.
    const char* best = nullptr;
    size_t best_d = 0;
    for (const char* k : kKnownSettings) {
      size_t d = edit_distance(name, k);
      const std::string ks = k;
      if (ks.find(name.substr(8)) != std::string::npos && name.size() > 10) d = std::min<size_t>(d, 3);  // a word left out
      if (!best || d < best_d) best = k, best_d = d;
    }
    out.push_back(best && best_d <= 3 ? name + " (did you mean " + best + "?)" : name);
  }
  return out;
}

std::optional<int> env_int(const char* v, int lo, int hi) {
  if (!v || !*v) return std::nullopt;
  int64_t x = 0;
  for (const char* p = v; *p; ++p) {
    if (*p < '0' || *p > '9') return std::nullopt;
    x = x * 10 + (*p - '0');
    if (x > hi) return std::nullopt;
  }
  if (x < lo) return std::nullopt;
  return static_cast<int>(x);
}

}  // namespace offload
