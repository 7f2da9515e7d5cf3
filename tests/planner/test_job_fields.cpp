// The one field table (hardening issue, item 1): job files and flags accept and refuse the same
// values, non-finite and overflowing numbers are input errors naming the field, and the whole-job
// checks run wherever a job is read.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/errors.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

using Catch::Matchers::Contains;

namespace {

// The outcome of giving `value` (as the text a user types) to field f: through a job file, and as
// a flag. "ok" or the error message.
std::string through_file(const ftplan::FieldSpec& f, const std::string& raw_json) {
  std::string key = f.key;
  nlohmann::json j = {{"model", "tiny-test"}};
  const std::string marker = "\"@@V@@\"";
  const auto dot = key.find('.');
  if (dot == std::string::npos) j[key] = "@@V@@";
  else j[key.substr(0, dot)][key.substr(dot + 1)] = "@@V@@";
  if (key == "dataset.mean_tokens_per_row" || key == "dataset.max_tokens_per_row")
    j["dataset"]["rows"] = 10;  // a dataset needs rows or tokens
  std::string text = j.dump();
  text.replace(text.find(marker), marker.size(), raw_json);
  const std::string path = std::string(FTPLAN_BINARY_DIR) + "/job_fields_test.json";
  std::ofstream(path) << text;
  try {
    ftplan::training_setup_from_json(ftplan::read_json_file(path), "job.json");
    return "ok";
  } catch (const ftplan::InputError& e) {
    return e.what();
  }
}

std::string through_flag(const ftplan::FieldSpec& f, const std::string& text) {
  try {
    ftplan::TrainingSetup s;
    ftplan::apply_job_field(s, f, ftplan::field_value_from_text(f, text, f.flag), f.flag);
    return "ok";
  } catch (const ftplan::InputError& e) {
    return e.what();
  }
}

std::string number_text(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

}  // namespace

TEST_CASE("every numeric field accepts and refuses the same values in a job file and as a flag", "[fields]") {
  int compared = 0;
  for (const ftplan::FieldSpec& f : ftplan::field_table()) {
    if (!(f.places & ftplan::kInJobFile) || !*f.flag) continue;
    if (f.type != ftplan::FieldType::integer && f.type != ftplan::FieldType::number) continue;
    const double step = f.type == ftplan::FieldType::integer ? 1.0 : (f.max - f.min) * 1e-6;
    std::vector<std::string> values = {number_text(f.min), number_text(f.max), number_text(f.min - step),
                                       number_text(f.max + step), "1e400", "-1e400", "0", "-1", "0.5"};
    for (const std::string& v : values) {
      CAPTURE(f.key, f.flag, v);
      const std::string file = through_file(f, v), flag = through_flag(f, v);
      CHECK((file == "ok") == (flag == "ok"));
      if (file != "ok") CHECK_THAT(file, Contains(std::string(f.key).substr(std::string(f.key).find('.') + 1)));
      if (flag != "ok") CHECK_THAT(flag, Contains(f.flag));
      ++compared;
    }
    // The bounds themselves: closed ends accepted, open ends refused.
    CHECK((through_flag(f, number_text(f.min)) == "ok") == !f.min_open);
    CHECK((through_flag(f, number_text(f.max)) == "ok") == !f.max_open);
  }
  CHECK(compared > 100);
}

TEST_CASE("flag text is parsed whole and finite", "[fields]") {
  const auto& seq = ftplan::field_by_flag("--seq-len");
  for (const char* bad : {"nan", "inf", "-inf", "1e400", "12abc", "0x10", "", "abc", " "}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(ftplan::field_int(seq, ftplan::field_value_from_text(seq, bad, "--seq-len"), "--seq-len"),
                    ftplan::InputError);
  }
  CHECK(ftplan::field_int(seq, ftplan::field_value_from_text(seq, "4096", "--seq-len"), "--seq-len") == 4096);
  CHECK(ftplan::field_int(seq, ftplan::field_value_from_text(seq, "4096.0", "--seq-len"), "--seq-len") == 4096);
  CHECK_THROWS_WITH(ftplan::field_int(seq, ftplan::field_value_from_text(seq, "2.5", "--seq-len"), "--seq-len"),
                    Contains("--seq-len") && Contains("whole number"));
  const auto& lr = ftplan::field_by_flag("--lr");
  CHECK_THROWS_WITH(ftplan::field_number(lr, ftplan::field_value_from_text(lr, "-1", "--lr"), "--lr"),
                    Contains("--lr") && Contains("(0, 10]"));
  const auto& headroom = ftplan::field_by_flag("--headroom");
  CHECK(ftplan::field_number(headroom, 0.9, "--headroom") == 0.9);  // was refused as a flag, accepted in a file
}

TEST_CASE("a number that overflows a double in any JSON file names the file and the key", "[fields]") {
  const std::string path = std::string(FTPLAN_BINARY_DIR) + "/overflow_test.json";
  std::ofstream(path) << "{\"model\": \"tiny-test\", \"lora\": {\"rank\": 8, \"alpha\": 1e400}}";
  CHECK_THROWS_WITH(ftplan::read_json_file(path), Contains(path) && Contains("alpha") && Contains("out of range"));
  std::ofstream(path) << "{\"hidden_size\": -1e999}";
  CHECK_THROWS_WITH(ftplan::read_json_file(path), Contains("hidden_size"));
}

TEST_CASE("whole-job checks name every operand", "[fields]") {
  const ftplan::ModelSpec tiny = ftplan::load_model("tiny-test");  // 2 layers, hidden 64
  ftplan::TrainingSetup s;
  s.model = "tiny-test";
  s.num_gpus = 8;
  s.strategy = ftplan::Strategy::pipeline_gpipe;
  CHECK_THROWS_WITH(ftplan::validate_job(s, tiny), Contains("--gpus") && Contains("8") && Contains("num_hidden_layers 2"));
  s.strategy = ftplan::Strategy::fsdp;
  CHECK_NOTHROW(ftplan::validate_job(s, tiny));
  s.method = ftplan::Method::lora;
  s.lora.rank = 128;
  CHECK_THROWS_WITH(ftplan::validate_job(s, tiny), Contains("--lora-rank") && Contains("hidden_size 64"));
  s.lora.rank = 8;
  s.micro_batch = 1 << 20;
  s.seq_len = 1 << 13;
  CHECK_THROWS_WITH(ftplan::validate_job(s, tiny), Contains("--micro-batch") && Contains("--seq-len"));
}

TEST_CASE("what ftexec cannot run is said before a plan is written", "[fields]") {
  const ftplan::ModelSpec tiny = ftplan::load_model("tiny-test");  // max_position_embeddings 512
  ftplan::TrainingSetup s;
  s.model = "tiny-test";
  s.seq_len = 256;
  CHECK(ftplan::exec_problems(s, tiny).empty());
  s.optimizer = ftplan::Optimizer::adamw8bit;
  s.precision = ftplan::Precision::mixed_fp32_grads;
  s.seq_len = 1024;
  const auto p = ftplan::exec_problems(s, tiny);
  REQUIRE(p.size() == 3);
  CHECK_THAT(p[0], Contains("--precision"));
  CHECK_THAT(p[1], Contains("--optimizer"));
  CHECK_THAT(p[2], Contains("--seq-len") && Contains("512"));
  // DeepSeek-V2-Lite (latent attention, experts): ftexec trains the family, eager only; no tensor parallelism.
  const ftplan::ModelSpec dsv = ftplan::load_model("deepseek-v2-lite");
  ftplan::TrainingSetup d;
  d.model = "deepseek-v2-lite";
  d.seq_len = 256;
  CHECK(ftplan::exec_problems(d, dsv).empty());
  d.attention = ftplan::Attention::fused;
  const auto q = ftplan::exec_problems(d, dsv);
  REQUIRE(q.size() == 1);
  CHECK_THAT(q[0], Contains("--attention (attention) fused") && Contains("latent attention"));
}
