// The bridge from the planner to the simulator: one candidate of a job becomes StepInputs whose
// durations, bytes and communication times come from the planner's own cost functions, so the
// simulation and the closed form (planner/step_time.h) differ only in how they overlap and
// schedule, never in a formula.
#pragma once

#include "planner/step_time.h"
#include "simulator/step_inputs.h"

namespace ftplan::sim {

StepInputs step_inputs_from_plan(const PlanContext& context, const Candidate& candidate, bool overlap = true);

}  // namespace ftplan::sim
