// `ftplan compare`: every figure both files have, with the error in percent.
#include <catch2/catch.hpp>

#include "planner/compare_report.h"
#include "planner/errors.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinAbs;

namespace {

nlohmann::json sample_plan() {
  return {{"format", "ftplan-plan/1"},
          {"candidate", {{"strategy", "single"}, {"micro_batch", 8}, {"checkpointing", "none"}, {"attention", "fused"}}},
          {"predicted",
           {{"memory_per_gpu_bytes",
             {{"weights", 1000}, {"gradients", 1000}, {"optimizer", 2000}, {"activations", 5000},
              {"logits_loss", 900}, {"temporary", 100}, {"overhead", 0}, {"total", 10000}}},
            {"step_time_s", 2.0},
            {"tokens_per_s", 500.0},
            {"comm_bytes_per_step", 0}}}};
}

nlohmann::json sample_measured() {
  return {{"loss", {5.5, 5.0}},
          {"step_time_s", 2.5},
          {"tokens_per_s", 400.0},
          {"device", "cpu"},
          {"torch_version", "1.13.0"},
          {"candidate", {{"strategy", "single"}, {"micro_batch", 8}, {"checkpointing", "none"}, {"attention", "eager"}}},
          {"ranks",
           {{{"rank", 0},
             {"peak_memory_bytes", 11000},
             {"components", {{"weights", 1000}, {"gradients", 1000}, {"optimizer", 2000}, {"activations", 7000}}}}}}};
}

const nlohmann::json& row(const nlohmann::json& c, const std::string& figure) {
  for (const auto& r : c["rows"])
    if (r["figure"] == figure) return r;
  FAIL("no row " << figure);
  static nlohmann::json none;
  return none;
}

}  // namespace

TEST_CASE("compare_json has a row for every figure both files have", "[compare]") {
  const auto c = ftplan::compare_json(sample_plan(), sample_measured());
  // Hand-computed: (11000 - 10000) / 10000 = +10 %; step (2.5 - 2) / 2 = +25 %; tokens/s -20 %.
  CHECK_THAT(row(c, "peak memory per device")["error_pct"].get<double>(), WithinAbs(10.0, 1e-9));
  CHECK_THAT(row(c, "  weights")["error_pct"].get<double>(), WithinAbs(0.0, 1e-9));
  CHECK_THAT(row(c, "  activations + loss + temporary")["predicted"].get<double>(), WithinAbs(6000.0, 1e-9));
  CHECK_THAT(row(c, "  activations + loss + temporary")["error_pct"].get<double>(), WithinAbs(100.0 / 6.0, 1e-9));
  CHECK_THAT(row(c, "step_time_s")["error_pct"].get<double>(), WithinAbs(25.0, 1e-9));
  CHECK_THAT(row(c, "tokens_per_s")["error_pct"].get<double>(), WithinAbs(-20.0, 1e-9));
  // The run measured no communication: no comm row; the attention difference is a note.
  for (const auto& r : c["rows"]) CHECK(r["figure"] != "comm_bytes_per_step");
  CHECK_THAT(c["notes"].dump(), Contains("attention \\\"eager\\\""));
}

TEST_CASE("compare_report prints a table with units and the error", "[compare]") {
  const std::string t = ftplan::compare_report(sample_plan(), sample_measured());
  CHECK_THAT(t, Contains("figure") && Contains("predicted") && Contains("measured") && Contains("error %"));
  CHECK_THAT(t, Contains("peak memory per device") && Contains("10.0"));
  CHECK_THAT(t, Contains("2.500 s") && Contains("25.0"));
  CHECK_THAT(t, Contains("note: measured on cpu with libtorch 1.13.0"));
}

TEST_CASE("compare takes the most loaded rank and the communicated bytes when measured", "[compare]") {
  auto measured = sample_measured();
  measured["ranks"].push_back({{"rank", 1}, {"peak_memory_bytes", 12000}, {"comm_bytes_per_step", 50}});
  auto plan = sample_plan();
  plan["predicted"]["comm_bytes_per_step"] = 40;
  const auto c = ftplan::compare_json(plan, measured);
  CHECK(row(c, "peak memory per device")["measured"] == 12000.0);
  CHECK_THAT(row(c, "comm_bytes_per_step")["error_pct"].get<double>(), WithinAbs(25.0, 1e-9));
  plan["predicted"]["comm_bytes_per_step"] = 0;  // a zero prediction has no relative error
  CHECK(row(ftplan::compare_json(plan, measured), "comm_bytes_per_step")["error_pct"].is_null());
}

TEST_CASE("compare rejects a plan without a prediction", "[compare]") {
  CHECK_THROWS_AS(ftplan::compare_json(nlohmann::json::object(), sample_measured()), ftplan::InputError);
}

TEST_CASE("compare shows every rank beside the prediction and the bytes by collective", "[compare]") {
  auto measured = sample_measured();
  measured["ranks"][0]["comm_bytes"] = {{"all_reduce", 0}, {"reduce_scatter", 30}, {"all_gather", 20}, {"send", 0}};
  measured["ranks"][0]["components"]["buffers"] = 500;
  measured["ranks"].push_back({{"rank", 1}, {"peak_memory_bytes", 9000},
                               {"comm_bytes", {{"reduce_scatter", 30}, {"all_gather", 25}}}});
  const auto c = ftplan::compare_json(sample_plan(), measured);
  CHECK(row(c, "  rank 0 peak memory")["measured"] == 11000.0);
  CHECK(row(c, "  rank 1 peak memory")["predicted"] == 10000.0);
  CHECK_THAT(row(c, "  rank 1 peak memory")["error_pct"].get<double>(), WithinAbs(-10.0, 1e-9));
  CHECK(row(c, "  activations + loss + temporary")["measured"] == 7500.0);  // buffers count as temporary
  CHECK_THAT(c["notes"].dump(), Contains("reduce_scatter 30") && Contains("all_gather 25"));
}

TEST_CASE("compare shows the offloaded host memory beside the planner's", "[compare]") {
  auto plan = sample_plan();
  auto measured = sample_measured();
  measured["ranks"][0]["host_memory_bytes"] = 4200;
  // No host term in the plan (nothing offloaded): no row.
  for (const auto& r : ftplan::compare_json(plan, measured)["rows"]) CHECK(r["figure"] != "host memory per rank (offload)");
  plan["predicted"]["host_memory_per_gpu_bytes"] = 4000;
  measured["ranks"].push_back({{"rank", 1}, {"peak_memory_bytes", 9000}, {"host_memory_bytes", 4400}});
  const auto c = ftplan::compare_json(plan, measured);
  CHECK(row(c, "host memory per rank (offload)")["measured"] == 4400.0);  // the most loaded rank
  CHECK_THAT(row(c, "host memory per rank (offload)")["error_pct"].get<double>(), WithinAbs(10.0, 1e-9));
}

TEST_CASE("compare refuses a run of a different job, naming every field, unless forced", "[compare]") {
  nlohmann::json plan = sample_plan(), measured = sample_measured();
  plan["job"] = {{"model", "tiny-test"}, {"method", "full"}, {"seq_len", 128}, {"grad_accum", 1}, {"precision", "fp32"}};
  measured["job"] = plan["job"];
  CHECK(ftplan::job_differences(plan, measured).empty());
  CHECK_NOTHROW(ftplan::compare_json(plan, measured));

  measured["job"]["method"] = "lora";
  measured["job"]["seq_len"] = 256;
  measured["candidate"]["strategy"] = "ddp";
  measured["job"]["model"] = "llama-3-8b";
  const auto d = ftplan::job_differences(plan, measured);
  REQUIRE(d.size() == 4);
  CHECK_THROWS_WITH(ftplan::compare_json(plan, measured),
                    Contains("model: plan tiny-test") && Contains("method: plan full, measured lora") &&
                        Contains("seq_len: plan 128, measured 256") && Contains("strategy: plan single, measured ddp") &&
                        Contains("--force"));
  const auto forced = ftplan::compare_json(plan, measured, true);
  CHECK(forced["differences"].size() == 4);
  CHECK_THAT(forced["notes"][0].get<std::string>(), Contains("although the run differs"));

  // The same model named two ways (short name, config path) is the same model.
  measured = sample_measured();
  measured["job"] = plan["job"];
  measured["job"]["model"] = std::string(FTPLAN_SOURCE_DIR) + "/configs/models/tiny-test.json";
  CHECK(ftplan::job_differences(plan, measured).empty());
}
