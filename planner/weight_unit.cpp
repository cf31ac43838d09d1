#include "planner/weight_unit.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace offload {

uint64_t weight_unit(const std::vector<uint64_t>& sizes, uint64_t max_pieces) {
  std::map<uint64_t, uint64_t> bytes;  // size -> bytes of weights of that size
  for (uint64_t s : sizes)
    if (s) bytes[s] += s;
  std::vector<std::pair<uint64_t, uint64_t>> order(bytes.begin(), bytes.end());
  std::sort(order.begin(), order.end(), [](const auto& x, const auto& y) {
    return x.second != y.second ? x.second > y.second : x.first > y.first;
  });
  uint64_t unit = 0, most = 0;
  for (const auto& [size, total] : order) {
    const uint64_t g = std::gcd(unit, size), m = std::max(most, size);
    if (m / g <= max_pieces) unit = g, most = m;
  }
  return unit;
}

bool in_units(uint64_t size, uint64_t unit, uint64_t max_pieces) {
  return unit && size >= unit && size / unit <= max_pieces;
}

}  // namespace offload
