#include "planner/compare_report.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>
#include <tuple>

#include "planner/errors.h"
#include "planner/format.h"
#include "planner/framework.h"
#include "planner/job_fields.h"
#include "planner/memory_report.h"
#include "planner/model_spec.h"
#include "planner/plan_report.h"
#include "planner/plan_search.h"
#include "planner/run_logs.h"

namespace ftplan {
namespace {

bool has_number(const nlohmann::json& j, const char* key) { return j.is_object() && j.contains(key) && j[key].is_number(); }

void add_row(nlohmann::json& rows, const std::string& figure, const std::string& unit, double predicted, double measured) {
  nlohmann::json row = {{"figure", figure}, {"unit", unit}, {"predicted", predicted}, {"measured", measured}};
  const double error = 100.0 * (measured - predicted) / predicted;
  row["error_pct"] = predicted != 0.0 && std::isfinite(error) ? nlohmann::json(error) : nlohmann::json(nullptr);
  rows.push_back(row);
}

// The largest value of ranks[i][path...] over the ranks that have it; NaN when none has it.
double max_over_ranks(const nlohmann::json& ranks, const char* key, const char* sub = nullptr) {
  double best = NAN;
  for (const auto& r : ranks) {
    const nlohmann::json* v = &r;
    if (sub) {
      if (!r.contains(sub) || !r[sub].is_object()) continue;
      v = &r[sub];
    }
    if (!has_number(*v, key)) continue;
    const double x = (*v)[key].get<double>();
    best = std::isnan(best) ? x : std::max(best, x);
  }
  return best;
}

std::string format_value(double v, const std::string& unit) {
  if (unit == "bytes") return format_bytes(v);
  if (unit == "s") return format_fixed(v, v < 1 ? 4 : 3) + " s";
  if (unit == "tokens/s") return format_fixed(v, 1) + " tokens/s";
  if (unit == "fraction") return format_fixed(100.0 * v, 2) + " %";
  return format_fixed(v, 3);
}

// A model reference (short name or config path) as the model it names: its stem when it cannot be
// loaded here (a run from another machine), else the architecture's parameter count and shape.
std::string model_identity(const std::string& ref) {
  try {
    const ModelSpec m = load_model(ref);
    return std::to_string(count_params(m).total) + " params, " + std::to_string(m.num_layers) + " layers, hidden " +
           std::to_string(m.hidden_size);
  } catch (const InputError&) {
    std::string stem = ref.substr(ref.find_last_of('/') == std::string::npos ? 0 : ref.find_last_of('/') + 1);
    if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".json") stem.resize(stem.size() - 5);
    return stem;
  }
}

std::string show(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// A row for a figure the log lacks: the prediction beside "missing".
void add_missing_row(nlohmann::json& rows, const std::string& figure, const std::string& unit, double predicted) {
  rows.push_back({{"figure", figure}, {"unit", unit}, {"predicted", predicted}, {"measured", nullptr},
                  {"error_pct", nullptr}, {"missing", true}});
}

std::optional<double> number_at(const nlohmann::json& j, const char* key) {
  if (!has_number(j, key)) return std::nullopt;
  const double v = j[key].get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

// GPUs of the planned job: the candidate's (1 for a single-GPU plan), else the job's.
double plan_gpus(const nlohmann::json& plan) {
  const nlohmann::json c = plan.contains("candidate") ? plan["candidate"] : nlohmann::json();
  if (c.is_object() && c.contains("strategy") && c["strategy"] == "single") return 1;
  if (c.is_object() && c.contains("parallel") && c["parallel"].is_object())
    if (auto g = number_at(c["parallel"], "gpus")) return *g;
  if (auto g = number_at(c, "gpus")) return *g;
  if (plan.contains("job"))
    if (auto g = number_at(plan["job"], "gpus")) return *g;
  return 1;
}

// Tokens of one sample as the planner counts them (step_time.cpp): the mean row length of padded,
// unpacked rows when the job gives it, else seq_len.
std::optional<double> plan_tokens_per_sample(const nlohmann::json& plan) {
  if (!plan.contains("job") || !plan["job"].is_object()) return std::nullopt;
  const auto& j = plan["job"];
  const auto seq = number_at(j, "seq_len");
  if (!seq) return std::nullopt;
  const bool packing = j.contains("packing") && j["packing"].is_boolean() && j["packing"].get<bool>();
  if (!packing && j.contains("dataset") && j["dataset"].is_object())
    if (auto mean = number_at(j["dataset"], "mean_tokens_per_row"); mean && *mean > 0) return std::min(*mean, *seq);
  return seq;
}

}  // namespace

nlohmann::json plan_for_framework(const nlohmann::json& plan, const std::string& framework) {
  if (!plan.is_object() || !plan.contains("job")) fail_input("plan: no \"job\" object (write it with `ftplan plan -o`)");
  TrainingSetup setup = training_setup_from_json(plan.at("job"), "plan: job");
  setup.framework = framework;
  apply_framework(setup, framework_profile(framework));
  const ModelSpec model = model_as_built(load_model(setup.model), framework_profile(setup.framework));
  apply_model(setup, model);
  HardwareSpec hw = load_hardware(setup.gpu);
  apply_topology(setup, hw);
  const Candidate c = candidate_from_setup(setup, hw);
  const PlanContext ctx = prepare_plan(model, hw, setup, setup.num_gpus, shard_shape(c.parallel));
  nlohmann::json out = plan;
  out["job"]["framework"] = framework;
  out["predicted"] = ranked_candidate_json(evaluate_candidate(ctx, c, Objective::time, true));
  return out;
}

std::vector<std::string> job_differences(const nlohmann::json& plan, const nlohmann::json& measured) {
  std::vector<std::string> out;
  if (!plan.contains("job") || !measured.is_object() || !measured.contains("job")) return out;
  const auto& pj = plan["job"];
  const auto& mj = measured["job"];
  auto get = [](const nlohmann::json& j, const char* key, const char* sub = nullptr) -> nlohmann::json {
    if (!j.is_object() || !j.contains(key)) return nullptr;
    if (!sub) return j[key];
    return j[key].is_object() && j[key].contains(sub) ? j[key][sub] : nlohmann::json(nullptr);
  };
  auto differ = [&](const std::string& name, const nlohmann::json& a, const nlohmann::json& b) {
    if (!a.is_null() && !b.is_null() && a != b) out.push_back(name + ": plan " + show(a) + ", measured " + show(b));
  };
  const nlohmann::json pm = get(pj, "model"), mm = get(mj, "model");
  if (pm.is_string() && mm.is_string() && pm != mm) {
    const std::string a = model_identity(pm.get<std::string>()), b = model_identity(mm.get<std::string>());
    if (a != b) out.push_back("model: plan " + show(pm) + " (" + a + "), measured " + show(mm) + " (" + b + ")");
  }
  for (const char* k : {"method", "precision", "seq_len", "grad_accum"}) differ(k, get(pj, k), get(mj, k));
  if (get(pj, "method") != "full") {
    differ("lora.rank", get(pj, "lora", "rank"), get(mj, "lora", "rank"));
    differ("lora.targets", get(pj, "lora", "targets"), get(mj, "lora", "targets"));
  }
  const nlohmann::json pc = plan.contains("candidate") ? plan["candidate"] : nlohmann::json::object();
  const nlohmann::json mc = measured.contains("candidate") ? measured["candidate"] : nlohmann::json::object();
  for (const char* k : {"strategy", "micro_batch", "checkpointing"}) differ(k, get(pc, k), get(mc, k));
  const nlohmann::json world = get(measured, "world_size");
  if (!world.is_null() && !get(pc, "gpus").is_null() && get(pc, "strategy") != "single") differ("gpus", get(pc, "gpus"), world);
  return out;
}

nlohmann::json compare_json(const nlohmann::json& plan, const nlohmann::json& measured, bool force) {
  if (!plan.is_object() || !plan.contains("predicted") || !plan["predicted"].is_object())
    fail_input("plan: no \"predicted\" object (write the plan with `ftplan plan -o plan.json`)");
  if (!measured.is_object()) fail_input("measured: expected a JSON object (written by `ftexec run --out`)");
  const auto& p = plan["predicted"];
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json notes = nlohmann::json::array();
  const std::vector<std::string> differences = job_differences(plan, measured);
  if (!differences.empty() && !force) {
    std::string msg = "measured: a run of a different job than the plan (";
    for (size_t i = 0; i < differences.size(); ++i) msg += (i ? "; " : "") + differences[i];
    fail_input(msg + "); --force compares them anyway");
  }
  for (const auto& d : differences) notes.push_back("compared with --force although the run differs: " + d);

  const nlohmann::json ranks = measured.contains("ranks") && measured["ranks"].is_array() ? measured["ranks"]
                                                                                          : nlohmann::json::array();
  if (p.contains("memory_per_gpu_bytes") && p["memory_per_gpu_bytes"].is_object() && !ranks.empty()) {
    const auto& m = p["memory_per_gpu_bytes"];
    auto pred = [&](const char* k) { return has_number(m, k) ? m[k].get<double>() : 0.0; };
    const double peak = max_over_ranks(ranks, "peak_memory_bytes");
    if (has_number(m, "total") && !std::isnan(peak)) add_row(rows, "peak memory per device", "bytes", pred("total"), peak);
    for (const char* k : {"weights", "gradients", "optimizer"}) {
      const double v = max_over_ranks(ranks, k, "components");
      if (has_number(m, k) && !std::isnan(v)) add_row(rows, std::string("  ") + k, "bytes", pred(k), v);
    }
    // Measured transient bytes plus the persistent communication buffers (DDP/ZeRO buckets), which
    // the planner counts in its temporary term.
    double act = NAN;
    for (const auto& r : ranks) {
      if (!r.contains("components") || !has_number(r["components"], "activations")) continue;
      const auto& c = r["components"];
      const double v = c["activations"].get<double>() + (has_number(c, "buffers") ? c["buffers"].get<double>() : 0.0);
      act = std::isnan(act) ? v : std::max(act, v);
    }
    if (!std::isnan(act))
      add_row(rows, "  activations + loss + temporary", "bytes",
              pred("activations") + pred("logits_loss") + pred("temporary"), act);
    // Every rank beside the prediction: the planner predicts the most loaded rank, which is every
    // rank of a data-parallel strategy and the busiest stage of a pipeline.
    if (ranks.size() > 1 && has_number(m, "total")) {
      for (const auto& r : ranks)
        if (has_number(r, "peak_memory_bytes") && has_number(r, "rank"))
          add_row(rows, "  rank " + std::to_string(r["rank"].get<int64_t>()) + " peak memory", "bytes", pred("total"),
                  r["peak_memory_bytes"].get<double>());
      notes.push_back("per rank: the prediction is the planner's most loaded rank (all ranks alike under data "
                      "parallelism; the busiest stage of a pipeline)");
    }
    // Offload: the host memory each rank's states take (ftexec's host pool, between steps).
    const double host = max_over_ranks(ranks, "host_memory_bytes");
    if (has_number(p, "host_memory_per_gpu_bytes") && p["host_memory_per_gpu_bytes"].get<double>() > 0 && !std::isnan(host))
      add_row(rows, "host memory per rank (offload)", "bytes", p["host_memory_per_gpu_bytes"].get<double>(), host);
    if (pred("overhead") > 0)
      notes.push_back("the predicted total includes " + format_bytes(pred("overhead")) +
                      " framework overhead, which the measured peak holds only on CUDA (device memory in use)");
    if (ranks.size() > 1) notes.push_back("measured: the most loaded of " + std::to_string(ranks.size()) + " ranks");
  }
  for (const auto& [key, unit] : std::vector<std::pair<const char*, const char*>>{
           {"step_time_s", "s"}, {"tokens_per_s", "tokens/s"}, {"mfu", "fraction"}}) {
    if (has_number(p, key) && has_number(measured, key))
      add_row(rows, key, unit, p[key].get<double>(), measured[key].get<double>());
  }
  if (has_number(p, "comm_bytes_per_step")) {
    double comm = has_number(measured, "comm_bytes_per_step") ? measured["comm_bytes_per_step"].get<double>()
                                                              : max_over_ranks(ranks, "comm_bytes_per_step");
    if (!std::isnan(comm)) add_row(rows, "comm_bytes_per_step", "bytes", p["comm_bytes_per_step"].get<double>(), comm);
  }
  // By process group, where the plan predicts them (predicted.comm_bytes_per_group) and the run
  // measured them (ftexec's comm_bytes_per_group: the largest rank's, per group).
  if (p.contains("comm_bytes_per_group") && p["comm_bytes_per_group"].is_object() && measured.contains("comm_bytes_per_group") &&
      measured["comm_bytes_per_group"].is_object()) {
    const auto& pg = p["comm_bytes_per_group"];
    const auto& mg = measured["comm_bytes_per_group"];
    for (const char* g : {"tp", "cp", "ep", "pp", "dp"}) {
      const bool predicted = has_number(pg, g) && pg[g].get<double>() > 0, ran = has_number(mg, g) && mg[g].get<double>() > 0;
      if (predicted || ran)
        add_row(rows, std::string("  comm bytes per step, ") + g + " group", "bytes", has_number(pg, g) ? pg[g].get<double>() : 0.0,
                has_number(mg, g) ? mg[g].get<double>() : 0.0);
    }
  }
  // The measured bytes by collective (the planner gives only their sum).
  {
    std::string by_op;
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather", "send"}) {
      const double v = max_over_ranks(ranks, op, "comm_bytes");
      if (!std::isnan(v) && v > 0) by_op += std::string(by_op.empty() ? "" : ", ") + op + " " + format_bytes(v);
    }
    if (!by_op.empty()) notes.push_back("measured per step by collective (largest rank): " + by_op);
  }
  // Say where the run differed from the plan (e.g. eager attention on a libtorch without SDPA).
  if (plan.contains("candidate") && measured.contains("candidate")) {
    for (const char* k : {"attention"}) {  // the others are job differences (above)
      const auto& a = plan["candidate"];
      const auto& b = measured["candidate"];
      if (a.contains(k) && b.contains(k) && a[k] != b[k])
        notes.push_back(std::string("the run used ") + k + " " + b[k].dump() + ", the plan " + a[k].dump());
    }
  }
  if (measured.contains("notes") && measured["notes"].is_array())
    for (const auto& n : measured["notes"]) notes.push_back("ftexec: " + (n.is_string() ? n.get<std::string>() : n.dump()));
  if (measured.contains("device") && measured["device"].is_string())
    notes.push_back("measured on " + measured["device"].get<std::string>() +
                    (measured.contains("torch_version") ? " with libtorch " + show(measured["torch_version"]) : ""));
  return {{"rows", rows}, {"notes", notes}, {"differences", differences}};
}

nlohmann::json compare_run_log(const nlohmann::json& plan, const RunLog& log, bool force) {
  if (log.format == "ftexec-measured/1") {
    nlohmann::json c = compare_json(plan, log.measured, force);
    c["run"] = {{"path", log.path}, {"format", log.format}};
    return c;
  }
  if (!plan.is_object() || !plan.contains("predicted") || !plan["predicted"].is_object())
    fail_input("plan: no \"predicted\" object (write the plan with `ftplan plan -o plan.json`)");
  const auto& p = plan["predicted"];
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json notes = nlohmann::json::array();

  // The job check, on what the log names.
  nlohmann::json named = {{"job", log.job.is_object() ? log.job : nlohmann::json::object()}};
  if (log.candidate.is_object()) named["candidate"] = log.candidate;
  if (log.world_size) named["world_size"] = *log.world_size;
  const std::vector<std::string> differences = job_differences(plan, named);
  if (!differences.empty() && !force) {
    std::string msg = log.path + ": a run of a different job than the plan (";
    for (size_t i = 0; i < differences.size(); ++i) msg += (i ? "; " : "") + differences[i];
    fail_input(msg + "); --force compares them anyway");
  }
  for (const auto& d : differences) notes.push_back("compared with --force although the run differs: " + d);

  // Memory: each figure against the prediction of the same thing.
  const nlohmann::json m = p.contains("memory_per_gpu_bytes") && p["memory_per_gpu_bytes"].is_object()
                               ? p["memory_per_gpu_bytes"]
                               : nlohmann::json::object();
  struct MemoryFigure {
    const char* figure;
    const char* predicted_key;
    std::optional<double> measured;
    bool show_missing;
  };
  const MemoryFigure memory[] = {
      {"peak allocated (max_memory_allocated)", "allocated_peak", log.allocated_peak_bytes, true},
      {"peak active (vs allocated)", "allocated_peak", log.active_peak_bytes, false},
      {"peak reserved (max_memory_reserved)", "reserved_peak", log.reserved_peak_bytes, true},
      {"device memory (nvidia-smi)", "device_peak", log.device_peak_bytes, true},
  };
  for (const auto& f : memory) {
    const auto predicted = number_at(m, f.predicted_key);
    if (!predicted) {
      if (f.measured) notes.push_back(std::string("the plan predicts no ") + f.predicted_key + " (a plan from an older ftplan)");
      continue;
    }
    if (f.measured) add_row(rows, f.figure, "bytes", *predicted, *f.measured);
    else if (f.show_missing) add_missing_row(rows, f.figure, "bytes", *predicted);
  }
  if (log.active_peak_bytes)
    notes.push_back("active (memory_stats active_bytes.all.peak: allocated blocks plus those freed but still awaited "
                    "by a stream, so at least allocated) is compared with the predicted allocated peak, the nearest "
                    "figure the planner has");
  if (m.contains("peak_phase") && m["peak_phase"].is_string() && m["peak_phase"] != "step")
    notes.push_back("the predicted peaks are in the " + m["peak_phase"].get<std::string>() +
                    " phase; logged step peaks may exclude loading and saving");

  // Time.
  const double gpus = plan_gpus(plan);
  const auto tokens_per_sample = plan_tokens_per_sample(plan);
  const auto predicted_tokens_per_step = number_at(p, "tokens_per_step");
  std::optional<double> step_time = log.step_time_s;
  if (!step_time && log.samples_per_s && tokens_per_sample && predicted_tokens_per_step && *log.samples_per_s > 0) {
    const double samples_per_step = *predicted_tokens_per_step / *tokens_per_sample;
    step_time = samples_per_step / *log.samples_per_s;
    notes.push_back("step_time_s: the plan's " + format_fixed(samples_per_step, 0) + " samples per step / the log's " +
                    format_fixed(*log.samples_per_s, 3) + " samples/s");
  }
  std::optional<double> tokens = log.tokens_per_s;
  if (!tokens && log.tokens_per_s_per_gpu) {
    tokens = *log.tokens_per_s_per_gpu * gpus;
    notes.push_back("tokens_per_s: the log's " + format_fixed(*log.tokens_per_s_per_gpu, 1) + " tokens/s per GPU x the plan's " +
                    format_fixed(gpus, 0) + " GPU(s)");
  } else if (!tokens && log.samples_per_s && tokens_per_sample) {
    tokens = *log.samples_per_s * *tokens_per_sample;
    notes.push_back("tokens_per_s: the log's " + format_fixed(*log.samples_per_s, 3) + " samples/s x the plan's " +
                    format_fixed(*tokens_per_sample, 0) + " tokens per sample");
  }
  for (const auto& [key, unit, measured] : std::vector<std::tuple<const char*, const char*, std::optional<double>>>{
           {"step_time_s", "s", step_time}, {"tokens_per_s", "tokens/s", tokens}}) {
    const auto predicted = number_at(p, key);
    if (!predicted) continue;
    if (measured) add_row(rows, key, unit, *predicted, *measured);
    else add_missing_row(rows, key, unit, *predicted);
  }

  // Loss: the planner predicts none; what the log holds, for the record.
  if (!log.loss.empty()) {
    const auto& a = log.loss.front();
    const auto& b = log.loss.back();
    notes.push_back("loss: " + std::to_string(log.loss.size()) + " logged values, " + format_fixed(a.second, 4) + " at step " +
                    std::to_string(a.first) + " to " + format_fixed(b.second, 4) + " at step " + std::to_string(b.first) +
                    " (not predicted)");
  }
  for (const auto& n : log.notes) notes.push_back(n);
  std::string missing;
  for (const auto& f : log.missing) missing += (missing.empty() ? "" : ", ") + f;
  if (!missing.empty()) notes.push_back("not in the log: " + missing);
  nlohmann::json loss = nlohmann::json::array();
  for (const auto& [step, value] : log.loss) loss.push_back({step, value});
  return {{"rows", rows},
          {"notes", notes},
          {"differences", differences},
          {"run", {{"path", log.path}, {"format", log.format}, {"missing", log.missing}, {"loss", loss}}}};
}

std::string compare_report(const nlohmann::json& plan, const nlohmann::json& measured, bool force) {
  return compare_table(compare_json(plan, measured, force));
}

std::string compare_table(const nlohmann::json& c) {
  std::ostringstream out;
  out << std::left << std::setw(40) << "figure" << std::right << std::setw(20) << "predicted" << std::setw(20)
      << "measured" << std::setw(12) << "error %" << "\n";
  for (const auto& r : c["rows"]) {
    const std::string unit = r["unit"];
    out << std::left << std::setw(40) << r["figure"].get<std::string>() << std::right << std::setw(20)
        << format_value(r["predicted"].get<double>(), unit) << std::setw(20)
        << (r["measured"].is_number() ? format_value(r["measured"].get<double>(), unit) : std::string("missing"))
        << std::setw(12)
        << (r.contains("missing") ? std::string("-")
            : r["error_pct"].is_null() ? std::string("n/a")
                                       : format_fixed(r["error_pct"].get<double>(), 1))
        << "\n";
  }
  if (c["rows"].empty()) out << "(no figure is in both files)\n";
  for (const auto& n : c["notes"]) out << "note: " << n.get<std::string>() << "\n";
  return out.str();
}

}  // namespace ftplan
