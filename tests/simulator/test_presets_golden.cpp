// Every strategy preset gives exactly the numbers it gave before strategies became parallelism
// degrees (planner/parallelism.h): memory (every term, the three figures, the phases), the
// closed-form step, the simulated step and the search's choice, on every shipped job under several
// GPU counts and frameworks. tests/data/preset_golden.json holds the figures the last
// strategy-name-based code computed (commit 7dfa04d plus the model families); a change to the
// memory or time model that moves them on purpose regenerates the file:
//   FTPLAN_UPDATE_GOLDEN=1 build/tests/simulator_tests "[golden]"
// and says why in its commit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/framework.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/model_spec.h"
#include "planner/plan_search.h"
#include "planner/training_setup.h"
#include "simulator/plan_inputs.h"
#include "simulator/simulate.h"

namespace {

using nlohmann::json;

const char* kGoldenPath = "/tests/data/preset_golden.json";

struct Job {
  std::string name;
  ftplan::TrainingSetup setup;
  ftplan::ModelSpec model;
  ftplan::HardwareSpec hw;
};

Job load(const std::string& file, const std::string& framework, int64_t gpus) {
  Job j;
  j.name = file + " framework=" + framework + " gpus=" + std::to_string(gpus);
  const std::string path = ftplan::data_dir() + "/configs/jobs/" + file;
  ftplan::TrainingSetup s = ftplan::training_setup_from_json(ftplan::read_json_file(path), path);
  s.framework = framework;
  s.given.insert("framework");
  s.num_gpus = gpus;
  ftplan::apply_framework(s, ftplan::framework_profile(s.framework));
  j.model = ftplan::load_model(s.model);
  ftplan::apply_model(s, j.model);
  j.hw = ftplan::load_hardware(s.gpu);
  ftplan::validate_job(s, j.model, path);
  j.setup = s;
  return j;
}

json memory_json(const ftplan::MemoryEstimate& e) {
  const auto& m = e.per_gpu;
  return {{"weights", m.weights},
          {"gradients", m.gradients},
          {"optimizer", m.optimizer},
          {"activations", m.activations},
          {"logits_loss", m.logits_loss},
          {"temporary", m.temporary},
          {"overhead", m.overhead},
          {"total", m.total},
          {"host", m.host},
          {"allocated", e.allocated_peak},
          {"reserved", e.reserved_peak},
          {"device", e.device_peak},
          {"load", {e.load.device_bytes, e.load.host_bytes_per_node}},
          {"step", {e.step.device_bytes, e.step.host_bytes_per_node}},
          {"save", {e.save.device_bytes, e.save.host_bytes_per_node}},
          {"peak_phase", e.peak_phase},
          {"peak_moment", e.peak_moment},
          {"gpus_used", e.gpus_used},
          {"fits", e.fits}};
}

json step_json(const ftplan::StepEstimate& s) {
  return {{"compute_s", s.compute_s},       {"comm_s", s.comm_s},
          {"exposed_comm_s", s.exposed_comm_s}, {"bubble_s", s.bubble_s},
          {"optimizer_s", s.optimizer_s},   {"step_time_s", s.step_time_s},
          {"bubble_fraction", s.bubble_fraction}, {"tokens_per_step", s.tokens_per_step},
          {"mfu", s.mfu},                   {"comm_bytes_per_step", s.comm_bytes_per_step},
          {"flops_per_step", s.flops_per_step}};
}

// Every figure of every case, computed by today's code.
json compute_all() {
  json out = json::object();
  const std::vector<std::string> files = {"llama-3-8b-instruct-lora-a100-40gb.json", "tinyllama-lora-4x-rtx6000ada.json",
                                          "codellama-34b-lora-4x-rtx6000ada.json"};
  for (const auto& file : files)
    for (const std::string framework : {"hf", "deepspeed", "torchtune"})
      for (int64_t gpus : {1, 2, 4, 16}) {
        const Job job = load(file, framework, gpus);
        const ftplan::PlanContext ctx = ftplan::prepare_plan(job.model, job.hw, job.setup, gpus);
        json cases = json::object();
        for (ftplan::Strategy s : ftplan::applicable_strategies(job.model, job.hw, job.setup))
          for (auto ck : {ftplan::Checkpointing::none, ftplan::Checkpointing::full})
            for (int64_t b : {int64_t{1}, int64_t{4}}) {
              const ftplan::Candidate c = ftplan::preset_candidate(s, gpus, job.hw, b, ck,
                                                                   job.setup.attention.value_or(ftplan::Attention::fused));
              const std::string key = ftplan::to_string(s) + " mb" + std::to_string(b) + " ck=" + ftplan::to_string(ck);
              json entry;
              entry["memory"] = memory_json(ftplan::estimate_memory(ctx.memory, c, gpus));
              entry["step"] = step_json(ftplan::estimate_step(ctx, c));
              ftplan::StepOptions serial;
              serial.overlap = false;
              entry["step_serial_s"] = ftplan::estimate_step(ctx, c, serial).step_time_s;
              if (b == 1) {  // the simulator, with and without overlap
                for (bool overlap : {true, false}) {
                  const auto in = ftplan::sim::step_inputs_from_plan(ctx, c, overlap);
                  const auto sim = ftplan::sim::simulate_step(in);
                  int64_t peak = 0;
                  for (const auto& r : sim.schedule.ranks) peak = std::max(peak, r.peak_memory_bytes);
                  entry[overlap ? "sim" : "sim_serial"] = {{"step_time_s", sim.schedule.step_time_s},
                                                          {"peak_memory_bytes", peak},
                                                          {"ops", sim.graph.graph ? num_vertices(*sim.graph.graph) : 0}};
                }
              }
              cases[key] = entry;
            }
        ftplan::SearchOptions presets_only;  // the presets' search, as before (compositions are new)
        presets_only.compositions = false;
        const auto plan = ftplan::plan_job(job.model, job.hw, job.setup, ftplan::Objective::time, {}, presets_only);
        json choice = nullptr;
        if (plan.recommended) {
          const auto& r = *plan.recommended;
          choice = {{"name", r.candidate.name},
                    {"micro_batch", r.candidate.micro_batch},
                    {"checkpointing", ftplan::to_string(r.candidate.checkpointing)},
                    {"activation_offload", r.candidate.activation_offload},
                    {"score", r.score}};
        }
        out[job.name] = {{"cases", cases}, {"plan", choice}, {"evaluated", plan.evaluated}};
      }
  return out;
}

// Equal: integers, strings and booleans exactly; times to a relative 1e-9 (the refactor may add
// terms in another order).
void check_equal(const json& want, const json& got, const std::string& where) {
  if (want.is_object()) {
    REQUIRE(got.is_object());
    for (auto it = want.begin(); it != want.end(); ++it) {
      INFO(where + "." + it.key());
      REQUIRE(got.contains(it.key()));
      check_equal(it.value(), got.at(it.key()), where + "." + it.key());
    }
    CHECK(got.size() == want.size());
  } else if (want.is_array()) {
    REQUIRE(got.is_array());
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) check_equal(want[i], got[i], where + "[" + std::to_string(i) + "]");
  } else if (want.is_number_float() || got.is_number_float()) {
    const double a = want.get<double>(), b = got.get<double>();
    INFO(where << ": golden " << a << ", now " << b);
    CHECK(std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)));
  } else {
    INFO(where << ": golden " << want.dump() << ", now " << got.dump());
    CHECK(want == got);
  }
}

}  // namespace

TEST_CASE("every preset gives the numbers it gave before strategies became degrees", "[golden]") {
  const std::string path = std::string(FTPLAN_SOURCE_DIR) + kGoldenPath;
  const json now = compute_all();
  if (const char* update = std::getenv("FTPLAN_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream(path) << now.dump(1) << "\n";
    WARN("wrote " << path);
  }
  REQUIRE(std::filesystem::exists(path));
  const json golden = ftplan::read_json_file(path);
  REQUIRE(golden.size() == now.size());
  size_t cases = 0;
  for (auto it = golden.begin(); it != golden.end(); ++it) {
    INFO(it.key());
    REQUIRE(now.contains(it.key()));
    cases += it.value().at("cases").size();
    check_equal(it.value(), now.at(it.key()), it.key());
  }
  CHECK(cases > 1000);
}
