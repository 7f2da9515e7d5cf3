// The Chrome trace: valid JSON, a track per rank and stream, a memory counter per rank.
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "simulator/chrome_trace.h"
#include "simulator/simulate.h"
#include "sim_fixtures.h"

using namespace ftplan;
using namespace ftplan::sim;
using namespace ftplan::sim::testing;

TEST_CASE("the Chrome trace is valid JSON with events on every rank and a memory counter", "[sim]") {
  const Strategy strategy = GENERATE(Strategy::pipeline_1f1b, Strategy::fsdp, Strategy::zero3_offload);
  CAPTURE(to_string(strategy));
  StepInputs in = model_inputs(strategy, 4, 6, 4);
  in.checkpointing = true;
  const StepSimulation sim = simulate_step(in);

  const std::string path = std::string(FTPLAN_BINARY_DIR) + "/sim_trace_test.json";
  chrome_trace_write(path, sim.graph, sim.schedule);
  std::ifstream file(path);
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  nlohmann::json trace;
  REQUIRE_NOTHROW(trace = nlohmann::json::parse(text.str()));  // valid JSON
  REQUIRE(trace.contains("traceEvents"));
  REQUIRE(trace["traceEvents"].is_array());

  std::set<int> ranks_with_ops, ranks_with_memory, ranks_named;
  std::size_t ops = 0;
  for (const auto& e : trace["traceEvents"]) {
    const std::string ph = e.at("ph");
    const int pid = e.at("pid");
    if (ph == "X") {
      ++ops;
      ranks_with_ops.insert(pid);
      CHECK(e.at("ts").get<double>() >= 0.0);
      CHECK(e.at("dur").get<double>() >= 0.0);
      CHECK(e.at("tid").get<int>() < kStreamCount);
      CHECK(!e.at("name").get<std::string>().empty());
    } else if (ph == "C") {
      CHECK(e.at("name") == "memory");
      CHECK(e.at("args").at("GiB").get<double>() > 0.0);
      ranks_with_memory.insert(pid);
    } else if (ph == "M" && e.at("name") == "process_name") {
      ranks_named.insert(pid);
    }
  }
  const int ranks = sim.graph.num_ranks;
  CHECK(ranks == (strategy == Strategy::pipeline_1f1b ? 4 : 1));
  CHECK(ops == graph_op_count(sim.graph));
  CHECK(static_cast<int>(ranks_with_ops.size()) == ranks);
  CHECK(static_cast<int>(ranks_with_memory.size()) == ranks);
  CHECK(static_cast<int>(ranks_named.size()) == ranks);

  // The summary carries the per-rank figures `ftplan simulate --json` promises.
  const nlohmann::json summary = simulation_summary_json(in, sim);
  REQUIRE(summary.at("ranks").size() == static_cast<std::size_t>(ranks));
  for (const char* key : {"step_time_s", "exposed_comm_s", "bubble_fraction", "peak_memory_bytes"})
    CHECK(summary["ranks"][0].contains(key));
}
