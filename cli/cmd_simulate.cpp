#include <iostream>

#include "cli/commands.h"
#include "planner/errors.h"
#include "planner/plan_search.h"

namespace ftplan::cli {

void rerank_with_simulator(const LoadedJob&, PlanResult&) { fail_input("--simulate: not wired yet"); }

int run_simulate(const SimulateOptions&) { fail_input("simulate: not wired yet"); }

int run_compare(const CompareOptions&) { fail_input("compare: not wired yet"); }

}  // namespace ftplan::cli
