// A step recorded on the H200, read from tests/data/traces/NAME.trace (a failure to read it is a test
// failure; the step is then empty).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "planner/step_trace.h"

namespace offload {

inline StepTrace recorded_step(const std::string& name) {
  std::ifstream is(std::string(OFFLOAD_TRACES_DIR) + "/" + name + ".trace");
  StepTrace t;
  std::string err;
  EXPECT_TRUE(is && StepTrace::read(is, &t, &err)) << name << ": " << err;
  return t;
}

}  // namespace offload
