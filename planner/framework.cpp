#include "planner/framework.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/format.h"
#include "planner/json_fields.h"

namespace ftplan {
namespace {

using Json = nlohmann::json;
using Setter = std::function<void(FrameworkProfile&, const Json&, const std::string&)>;

double number_in(const Json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi)
    fail_input(name + ": expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return v.get<double>();
}
bool boolean(const Json& v, const std::string& name) {
  if (!v.is_boolean()) fail_input(name + ": expected true or false, got " + v.dump());
  return v.get<bool>();
}
std::string text(const Json& v, const std::string& name) {
  if (!v.is_string()) fail_input(name + ": expected a string, got " + v.dump());
  return v.get<std::string>();
}
HostCopies host_copies(const Json& v, const std::string& name) {
  const std::string s = text(v, name);
  if (s == "none") return HostCopies::none;
  if (s == "per_rank") return HostCopies::per_rank;
  if (s == "rank0") return HostCopies::rank0;
  fail_input(name + ": '" + s + "' is not none, per_rank or rank0");
}

constexpr double kMaxBytes = 1e12;

// Every leaf of a profile: its path and where it lands. A profile must give each one, with a source.
const std::vector<std::pair<std::string, Setter>>& leaves() {
  using P = FrameworkProfile;
  static const std::vector<std::pair<std::string, Setter>> all = {
      {"defaults.precision", [](P& p, const Json& v, const std::string& n) { p.precision = parse_precision(text(v, n), n); }},
      {"defaults.loss", [](P& p, const Json& v, const std::string& n) { p.loss = parse_loss(text(v, n), n); }},
      {"defaults.attention", [](P& p, const Json& v, const std::string& n) { p.attention = parse_attention(text(v, n), n); }},
      {"defaults.fsdp_version", [](P& p, const Json& v, const std::string& n) { p.fsdp_version = int64_t(number_in(v, n, 1, 2)); }},
      {"defaults.packing", [](P& p, const Json& v, const std::string& n) { p.packing = boolean(v, n); }},
      {"defaults.double_quant", [](P& p, const Json& v, const std::string& n) { p.double_quant = boolean(v, n); }},
      {"activations.gqa_kv_repeated", [](P& p, const Json& v, const std::string& n) { p.gqa_kv_repeated = boolean(v, n); }},
      {"activations.fused_norm_mlp_kernels",
       [](P& p, const Json& v, const std::string& n) { p.fused_norm_mlp_kernels = boolean(v, n); }},
      {"activations.sp_keeps_gathered_input",
       [](P& p, const Json& v, const std::string& n) { p.sp_keeps_gathered_input = boolean(v, n); }},
      {"activations.autocast_weight_copies",
       [](P& p, const Json& v, const std::string& n) { p.autocast_weight_copies = boolean(v, n); }},
      {"activations.padded_batches_pass_mask",
       [](P& p, const Json& v, const std::string& n) { p.padded_batches_pass_mask = boolean(v, n); }},
      {"activations.selective_mode",
       [](P& p, const Json& v, const std::string& n) {
         p.selective_mode = text(v, n);
         if (p.selective_mode != "attention-core" && p.selective_mode != "every-second-matmul")
           fail_input(n + ": '" + p.selective_mode + "' is not attention-core or every-second-matmul");
       }},
      {"qlora.quantize_lm_head", [](P& p, const Json& v, const std::string& n) { p.quantize_lm_head = boolean(v, n); }},
      {"qlora.quantized_matmul_saves_input",
       [](P& p, const Json& v, const std::string& n) { p.quantized_matmul_saves_input = boolean(v, n); }},
      {"qlora.quant_state_sharded",
       [](P& p, const Json& v, const std::string& n) { p.quant_state_sharded = boolean(v, n); }},
      {"qlora.fp32_upcast_unquantized",
       [](P& p, const Json& v, const std::string& n) { p.fp32_upcast_unquantized = boolean(v, n); }},
      {"qlora.dequant_weights_alive",
       [](P& p, const Json& v, const std::string& n) { p.dequant_weights_alive = number_in(v, n, 0, 1000); }},
      {"fsdp.lora_separate_units", [](P& p, const Json& v, const std::string& n) { p.fsdp_lora_separate_units = boolean(v, n); }},
      {"fsdp.no_sync_unsharded_grads",
       [](P& p, const Json& v, const std::string& n) { p.fsdp_no_sync_unsharded_grads = boolean(v, n); }},
      {"zero.bucket_is_hidden_squared",
       [](P& p, const Json& v, const std::string& n) { p.zero_bucket_is_hidden_squared = boolean(v, n); }},
      {"zero.reduce_bucket_elements",
       [](P& p, const Json& v, const std::string& n) { p.zero_reduce_bucket_elements = number_in(v, n, 1, 1e12); }},
      {"zero.prefetch_bucket_elements",
       [](P& p, const Json& v, const std::string& n) { p.zero_prefetch_bucket_elements = number_in(v, n, 0, 1e12); }},
      {"zero.overlap_comm_double_buffer",
       [](P& p, const Json& v, const std::string& n) { p.zero_overlap_comm_double_buffer = boolean(v, n); }},
      {"zero.stage3_contiguous_gradients_buffer",
       [](P& p, const Json& v, const std::string& n) { p.zero3_contiguous_gradients_buffer = boolean(v, n); }},
      {"optimizer.implementation",
       [](P& p, const Json& v, const std::string& n) {
         const std::string impl = text(v, n);
         if (impl != "foreach" && impl != "fused") fail_input(n + ": '" + impl + "' is not foreach or fused");
         p.optimizer_foreach = impl == "foreach";
       }},
      {"optimizer.grads_freed_between_steps",
       [](P& p, const Json& v, const std::string& n) { p.grads_freed_between_steps = boolean(v, n); }},
      {"optimizer.step_transient_bytes_per_param",
       [](P& p, const Json& v, const std::string& n) { p.optimizer_step_transient_bytes_per_param = number_in(v, n, 0, 64); }},
      {"loading.host_copies", [](P& p, const Json& v, const std::string& n) { p.load_host_copies = host_copies(v, n); }},
      {"loading.unties_embeddings", [](P& p, const Json& v, const std::string& n) { p.unties_embeddings = boolean(v, n); }},
      {"loading.quantize_transient_bytes_per_element",
       [](P& p, const Json& v, const std::string& n) { p.quantize_transient_bytes_per_element = number_in(v, n, 0, 1024); }},
      {"runtime.step_reserved_keeps_load_cache",
       [](P& p, const Json& v, const std::string& n) { p.step_reserved_keeps_load_cache = boolean(v, n); }},
      {"loading.amp_frozen_weight_bytes",
       [](P& p, const Json& v, const std::string& n) { p.amp_frozen_weight_bytes = number_in(v, n, 2, 4); }},
      {"saving.host_copies", [](P& p, const Json& v, const std::string& n) { p.save_host_copies = host_copies(v, n); }},
      {"saving.full_state_dict_holds_frozen",
       [](P& p, const Json& v, const std::string& n) { p.full_state_dict_holds_frozen = boolean(v, n); }},
      {"saving.sharded_state_dict_offload_to_cpu",
       [](P& p, const Json& v, const std::string& n) { p.sharded_state_dict_offload_to_cpu = boolean(v, n); }},
      {"saving.gathers_units_on_gpu",
       [](P& p, const Json& v, const std::string& n) { p.save_gathers_units_on_gpu = boolean(v, n); }},
      {"runtime.cuda_context_bytes",
       [](P& p, const Json& v, const std::string& n) { p.cuda_context_bytes = int64_t(number_in(v, n, 0, kMaxBytes)); }},
      {"runtime.cublas_workspace_bytes",
       [](P& p, const Json& v, const std::string& n) { p.cublas_workspace_bytes = int64_t(number_in(v, n, 0, kMaxBytes)); }},
      {"runtime.nccl_bytes_per_gpu",
       [](P& p, const Json& v, const std::string& n) { p.nccl_bytes_per_gpu = int64_t(number_in(v, n, 0, kMaxBytes)); }},
      {"runtime.host_process_bytes_per_rank",
       [](P& p, const Json& v, const std::string& n) { p.host_process_bytes_per_rank = int64_t(number_in(v, n, 0, kMaxBytes)); }},
      {"runtime.reserved_over_allocated",
       [](P& p, const Json& v, const std::string& n) { p.reserved_over_allocated = number_in(v, n, 1, 2); }},
      {"runtime.reserved_over_allocated_at_oom",
       [](P& p, const Json& v, const std::string& n) { p.reserved_over_allocated_at_oom = number_in(v, n, 1, 2); }},
      {"runtime.allocator_replay", [](P& p, const Json& v, const std::string& n) { p.allocator_replay = boolean(v, n); }},
      {"knobs.activation_offload",
       [](P& p, const Json& v, const std::string& n) { p.offers_activation_offload = boolean(v, n); }},
      {"knobs.optimizer_in_backward",
       [](P& p, const Json& v, const std::string& n) { p.offers_optimizer_in_backward = boolean(v, n); }},
      {"knobs.optimizer_in_backward_allows_accumulation",
       [](P& p, const Json& v, const std::string& n) { p.optimizer_in_backward_allows_accumulation = boolean(v, n); }},
      {"knobs.selective_checkpointing",
       [](P& p, const Json& v, const std::string& n) { p.offers_selective_checkpointing = boolean(v, n); }},
      {"knobs.compile", [](P& p, const Json& v, const std::string& n) { p.offers_compile = boolean(v, n); }},
      {"compute.eager_norm_bytes_per_hidden",
       [](P& p, const Json& v, const std::string& n) { p.eager_norm_bytes_per_hidden = number_in(v, n, 0, 1000); }},
      {"compute.eager_rope_bytes_per_element",
       [](P& p, const Json& v, const std::string& n) { p.eager_rope_bytes_per_element = number_in(v, n, 0, 1000); }},
      {"compute.eager_mlp_act_bytes_per_intermediate",
       [](P& p, const Json& v, const std::string& n) { p.eager_mlp_act_bytes_per_intermediate = number_in(v, n, 0, 1000); }},
      {"parallelism.default_sharding",
       [](P& p, const Json& v, const std::string& n) {
         p.default_sharding = text(v, n);
         if (p.default_sharding != "fsdp" && p.default_sharding != "zero3") fail_input(n + ": '" + p.default_sharding + "' is not fsdp or zero3");
       }},
      {"parallelism.tensor_parallel", [](P& p, const Json& v, const std::string& n) { p.offers_tensor_parallel = boolean(v, n); }},
      {"parallelism.model_parallel_with_pure_replicas",
       [](P& p, const Json& v, const std::string& n) { p.model_parallel_with_pure_replicas = boolean(v, n); }},
      {"parallelism.tensor_parallel_with_lora",
       [](P& p, const Json& v, const std::string& n) { p.tensor_parallel_with_lora = boolean(v, n); }},
      {"parallelism.sequence_parallel",
       [](P& p, const Json& v, const std::string& n) {
         p.sequence_parallel = text(v, n);
         if (p.sequence_parallel != "never" && p.sequence_parallel != "optional" && p.sequence_parallel != "default" &&
             p.sequence_parallel != "always")
           fail_input(n + ": '" + p.sequence_parallel + "' is not never, optional, default (optional, on unless sp=0) or always");
       }},
      {"parallelism.context_parallel", [](P& p, const Json& v, const std::string& n) { p.offers_context_parallel = boolean(v, n); }},
      {"parallelism.cp_mode",
       [](P& p, const Json& v, const std::string& n) {
         const std::string m = text(v, n);
         if (m == "ring") p.cp_mode = ContextParallel::ring;
         else if (m == "all_gather") p.cp_mode = ContextParallel::all_gather;
         else fail_input(n + ": '" + m + "' is not ring or all_gather");
       }},
      {"parallelism.pipeline_parallel", [](P& p, const Json& v, const std::string& n) { p.offers_pipeline_parallel = boolean(v, n); }},
      {"parallelism.expert_parallel", [](P& p, const Json& v, const std::string& n) { p.offers_expert_parallel = boolean(v, n); }},
      {"parallelism.expert_parallel_overlap",
       [](P& p, const Json& v, const std::string& n) { p.expert_parallel_overlap = boolean(v, n); }},
      {"parallelism.pipeline_schedules",
       [](P& p, const Json& v, const std::string& n) {
         if (!v.is_array()) fail_input(n + ": expected a list of schedules, e.g. [\"1f1b\"]");
         p.pipeline_schedules.clear();
         for (const auto& x : v) {
           const std::string t = text(x, n);
           if (t == "gpipe") p.pipeline_schedules.push_back(PipelineSchedule::gpipe);
           else if (t == "1f1b") p.pipeline_schedules.push_back(PipelineSchedule::one_f_one_b);
           else if (t == "interleaved_1f1b") p.pipeline_schedules.push_back(PipelineSchedule::interleaved_1f1b);
           else fail_input(n + ": '" + t + "' is not gpipe, 1f1b or interleaved_1f1b");
         }
       }},
      {"knobs.fsdp_versions",
       [](P& p, const Json& v, const std::string& n) {
         if (!v.is_array() || v.empty()) fail_input(n + ": expected a list of FSDP versions, e.g. [1, 2]");
         p.fsdp_versions.clear();
         for (const auto& x : v) p.fsdp_versions.push_back(int64_t(number_in(x, n, 1, 2)));
       }},
  };
  return all;
}

const char* kLossKeys[] = {"kept_bytes_per_token_vocab", "peak_bytes_per_token_vocab", "kept_bytes_per_token_hidden",
                           "peak_bytes_per_token_hidden"};

// A leaf {"value", "source", "note"?}: its value, its source recorded under `path`.
const Json& leaf_value(FrameworkProfile& p, const Json& leaf, const std::string& path, const std::string& name) {
  if (!leaf.is_object() || !leaf.contains("value") || !leaf.contains("source"))
    fail_input(name + ": expected {\"value\": ..., \"source\": \"...\"}");
  require_known_keys(leaf, {"value", "source", "note"}, name);
  const std::string source = text(leaf.at("source"), name + ": source");
  if (source.size() < 8) fail_input(name + ": source: say where the value comes from");
  p.sources[path] = source;
  return leaf.at("value");
}

}  // namespace

FrameworkProfile framework_profile_from_json(const Json& j, const std::string& where) {
  if (!j.is_object()) fail_input(where + ": expected a JSON object");
  if (read_string_or(j, "format", "", where) != "ftplan-framework/1")
    fail_input(where + ": format: expected \"ftplan-framework/1\"");
  FrameworkProfile p;
  p.name = read_string(j, "name", where);
  p.title = read_string(j, "title", where);
  p.versions = read_string(j, "versions", where);
  // Every section's keys must be known, and every leaf present.
  std::map<std::string, std::vector<std::string>> sections;
  for (const auto& [path, setter] : leaves()) sections[path.substr(0, path.find('.'))].push_back(path.substr(path.find('.') + 1));
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "format" || k == "name" || k == "title" || k == "versions" || k == "notes" || k == "losses") continue;
    if (!sections.count(k)) fail_input(where + ": " + k + ": unknown key");
    for (auto f = it->begin(); f != it->end(); ++f) {
      const auto& keys = sections[k];
      if (std::find(keys.begin(), keys.end(), f.key()) == keys.end())
        fail_input(where + ": " + k + ": " + f.key() + ": unknown key");
    }
  }
  for (const auto& [path, setter] : leaves()) {
    const std::string section = path.substr(0, path.find('.')), key = path.substr(path.find('.') + 1);
    const std::string name = where + ": " + section + ": " + key;
    if (!j.contains(section) || !j.at(section).contains(key)) fail_input(name + ": missing");
    setter(p, leaf_value(p, j.at(section).at(key), path, name), name);
  }
  if (!j.contains("losses") || !j.at("losses").is_object() || j.at("losses").empty())
    fail_input(where + ": losses: give at least the default loss");
  for (auto it = j.at("losses").begin(); it != j.at("losses").end(); ++it) {
    const std::string lw = where + ": losses: " + it.key();
    const Loss loss = parse_loss(it.key(), lw);
    require_known_keys(*it, {"kept_bytes_per_token_vocab", "peak_bytes_per_token_vocab", "kept_bytes_per_token_hidden",
                             "peak_bytes_per_token_hidden", "compiled_kept_bytes_per_token_vocab",
                             "compiled_peak_bytes_per_token_vocab", "shifted_copy"}, lw);
    LossProfile l;
    double* fields[] = {&l.kept_bytes_per_token_vocab, &l.peak_bytes_per_token_vocab, &l.kept_bytes_per_token_hidden,
                        &l.peak_bytes_per_token_hidden};
    for (int i = 0; i < 4; ++i) {
      const std::string name = lw + ": " + kLossKeys[i];
      if (!it->contains(kLossKeys[i])) fail_input(name + ": missing");
      *fields[i] = number_in(leaf_value(p, it->at(kLossKeys[i]), "losses." + it.key() + "." + kLossKeys[i], name), name, 0, 64);
    }
    // Optional: the compiled loss (both or neither).
    const bool compiled = it->contains("compiled_kept_bytes_per_token_vocab");
    if (compiled != it->contains("compiled_peak_bytes_per_token_vocab"))
      fail_input(lw + ": give compiled_kept_bytes_per_token_vocab and compiled_peak_bytes_per_token_vocab together");
    if (compiled) {
      for (const char* k : {"compiled_kept_bytes_per_token_vocab", "compiled_peak_bytes_per_token_vocab"}) {
        const std::string name = lw + ": " + k;
        const double v = number_in(leaf_value(p, it->at(k), "losses." + it.key() + "." + k, name), name, 0, 64);
        (std::string(k) == "compiled_kept_bytes_per_token_vocab" ? l.compiled_kept_bytes_per_token_vocab
                                                                  : l.compiled_peak_bytes_per_token_vocab) = v;
      }
    }
    if (it->contains("shifted_copy"))
      l.shifted_copy = boolean(leaf_value(p, it->at("shifted_copy"), "losses." + it.key() + ".shifted_copy", lw + ": shifted_copy"),
                               lw + ": shifted_copy");
    if (l.peak_bytes_per_token_vocab < l.kept_bytes_per_token_vocab || l.peak_bytes_per_token_hidden < l.kept_bytes_per_token_hidden)
      fail_input(lw + ": a peak below what is kept");
    p.losses[loss] = l;
  }
  if (!p.losses.count(p.loss)) fail_input(where + ": defaults: loss: '" + to_string(p.loss) + "' is not in losses");
  if (std::find(p.fsdp_versions.begin(), p.fsdp_versions.end(), p.fsdp_version) == p.fsdp_versions.end())
    fail_input(where + ": defaults: fsdp_version: not in knobs.fsdp_versions");
  if (p.reserved_over_allocated_at_oom > p.reserved_over_allocated)
    fail_input(where + ": runtime: reserved_over_allocated_at_oom: " + format_fixed(p.reserved_over_allocated_at_oom, 3) +
               " is above reserved_over_allocated " + format_fixed(p.reserved_over_allocated, 3) +
               " (the allocator only releases cache when memory runs out)");
  return p;
}

namespace {

// A profile with "extends": its base's JSON with this file's leaves laid over it (one level of
// sections, losses by name), so a framework that runs on another states only where it differs.
Json resolved_profile_json(const std::string& path, int depth) {
  Json j = read_json_file(path);
  if (!j.is_object() || !j.contains("extends")) return j;
  if (depth > 4) fail_input(path + ": extends: too deep (a cycle?)");
  const std::string base_path = resolve_data_file(text(j.at("extends"), path + ": extends"), "configs/frameworks",
                                                  path + ": extends");
  Json merged = resolved_profile_json(base_path, depth + 1);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "extends") continue;
    if (it->is_object() && merged.contains(it.key()) && merged.at(it.key()).is_object() && it.key() != "losses") {
      for (auto f = it->begin(); f != it->end(); ++f) merged[it.key()][f.key()] = *f;
    } else if (it.key() == "losses" && it->is_object()) {
      for (auto f = it->begin(); f != it->end(); ++f) merged["losses"][f.key()] = *f;
    } else {
      merged[it.key()] = *it;
    }
  }
  return merged;
}

}  // namespace

ModelSpec model_as_built(ModelSpec model, const FrameworkProfile& fw) {
  if (fw.unties_embeddings) model.tie_word_embeddings = false;
  return model;
}

FrameworkProfile load_framework(const std::string& name_or_path) {
  const std::string path = resolve_data_file(name_or_path, "configs/frameworks", "--framework");
  return framework_profile_from_json(resolved_profile_json(path, 0), path);
}

const FrameworkProfile& framework_profile(const std::string& name_or_path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<FrameworkProfile>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = loaded[name_or_path];
  if (!slot) slot = std::make_unique<FrameworkProfile>(load_framework(name_or_path));
  return *slot;
}

std::vector<std::string> list_frameworks() { return list_data_names("configs/frameworks"); }

void apply_framework(TrainingSetup& s, const FrameworkProfile& p) {
  const auto given = [&](const char* key) { return s.given.count(key) > 0; };
  if (!given("precision")) s.precision = p.precision;
  if (!given("loss")) s.loss = p.loss;
  if (!given("attention")) s.attention = p.attention;
  if (!given("fsdp_version")) s.fsdp_version = p.fsdp_version;
  if (!given("packing")) s.packing = p.packing;
  if (!given("quantization.double_quant")) s.quantization.double_quant = p.double_quant;

  std::vector<std::string> problems;
  const std::string fw = "--framework " + p.name;
  // --parallel: dp_shard without shard= shards as the framework does; what it composes it must offer.
  if (!s.parallel_text.empty()) s.parallel = parse_parallelism(s.parallel_text, "--parallel (parallel)", p.default_sharding, p.cp_mode,
                                                           p.sequence_parallel == "default" || p.sequence_parallel == "always");
  if (s.parallel && s.strategy)
    problems.push_back("--parallel " + s.parallel_text + " and --strategy " + to_string(*s.strategy) +
                       ": give a composition or a preset, not both");
  if (s.parallel) {
    const Parallelism& q = *s.parallel;
    if (q.tp > 1 && !p.offers_tensor_parallel) problems.push_back("--parallel tp=" + std::to_string(q.tp) + ": " + fw + " has no tensor parallelism");
    if (q.tp > 1 && p.offers_tensor_parallel && s.method != Method::full && !p.tensor_parallel_with_lora)
      problems.push_back("--parallel tp=" + std::to_string(q.tp) + " with --method " + to_string(s.method) + ": " + fw +
                         " runs tensor parallelism for full fine-tuning only");
    if (q.sequence_parallel && p.sequence_parallel == "never") problems.push_back("--parallel sp=1: " + fw + " has no sequence parallelism");
    if (q.tp > 1 && !q.sequence_parallel && p.sequence_parallel == "always")
      problems.push_back("--parallel tp=" + std::to_string(q.tp) + " without sp=1: " + fw + " always runs sequence parallelism with tensor parallelism");
    if (q.cp > 1 && !p.offers_context_parallel) problems.push_back("--parallel cp=" + std::to_string(q.cp) + ": " + fw + " has no context parallelism");
    if ((q.tp > 1 || q.cp > 1) && q.dp_replicate > 1 && q.dp_shard == 1 && !p.model_parallel_with_pure_replicas)
      problems.push_back("--parallel tp=" + std::to_string(q.tp) + ",cp=" + std::to_string(q.cp) + ",dp_replicate=" +
                         std::to_string(q.dp_replicate) + ": " + fw +
                         " composes tensor/context parallelism with sharded data parallelism only (dp_shard > 1)");
    if (q.ep > 1 && !p.offers_expert_parallel) problems.push_back("--parallel ep=" + std::to_string(q.ep) + ": " + fw + " has no expert parallelism");
    const bool preset_pipeline = preset_of(q).has_value();  // mp, pipeline, pipeline_1f1b stay available everywhere
    if (q.pp > 1 && !preset_pipeline && !p.offers_pipeline_parallel)
      problems.push_back("--parallel pp=" + std::to_string(q.pp) + ": " + fw + " composes no pipeline parallelism");
    if (q.pp > 1 && !preset_pipeline && p.offers_pipeline_parallel &&
        std::find(p.pipeline_schedules.begin(), p.pipeline_schedules.end(), q.schedule) == p.pipeline_schedules.end())
      problems.push_back("--parallel schedule=" + to_string(q.schedule) + ": " + fw + " does not run it");
  }
  if (!p.losses.count(s.loss))
    problems.push_back("--loss " + to_string(s.loss) + ": " + fw + " does not offer it (it offers " + [&] {
                         std::string l;
                         for (const auto& [k, v] : p.losses) l += (l.empty() ? "" : ", ") + to_string(k);
                         return l;
                       }() + ")");
  if (s.activation_offload && !p.offers_activation_offload)
    problems.push_back("--activation-offload: " + fw + " has no activation offloading");
  if (s.optimizer_in_backward && !p.offers_optimizer_in_backward)
    problems.push_back("--optimizer-in-backward: " + fw + " has no optimizer step in backward");
  if (s.optimizer_in_backward && p.offers_optimizer_in_backward && !p.optimizer_in_backward_allows_accumulation &&
      s.grad_accum > 1)
    problems.push_back("--optimizer-in-backward with --grad-accum " + std::to_string(s.grad_accum) + ": " + fw +
                       " refuses it (the gradients are freed as they are used)");
  if (s.optimizer_in_backward && s.strategy && *s.strategy != Strategy::single)
    problems.push_back("--optimizer-in-backward with --strategy " + to_string(*s.strategy) + ": modelled on one GPU only");
  if (s.checkpointing && *s.checkpointing == Checkpointing::selective && !p.offers_selective_checkpointing)
    problems.push_back("--checkpointing selective: " + fw + " has no selective activation checkpointing");
  if (s.compile && !p.offers_compile) problems.push_back("--compile: " + fw + " does not compile the model");
  if (std::find(p.fsdp_versions.begin(), p.fsdp_versions.end(), s.fsdp_version) == p.fsdp_versions.end())
    problems.push_back("--fsdp-version " + std::to_string(s.fsdp_version) + ": " + fw + " runs FSDP " +
                       std::to_string(p.fsdp_versions.front()));
  if (!problems.empty()) {
    std::string msg;
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    fail_input(msg);
  }
}

}  // namespace ftplan
