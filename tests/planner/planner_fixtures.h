// Shared by the planner tests: a job of ftexec's behaviour (profiles are tested in test_framework.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "planner/training_setup.h"

namespace ftplan::testing {

inline TrainingSetup ftexec_setup(const std::string& model, Method method, int64_t gpus, int64_t seq_len,
                                  int64_t grad_accum = 1) {
  TrainingSetup s;
  s.framework = "ftexec";  // the formulas checked are ftexec's behaviour; profiles: test_framework.cpp
  s.model = model;
  s.method = method;
  s.num_gpus = gpus;
  s.seq_len = seq_len;
  s.grad_accum = grad_accum;
  return s;
}

}  // namespace ftplan::testing
