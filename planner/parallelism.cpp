#include "planner/parallelism.h"

#include <algorithm>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "planner/errors.h"
#include "planner/model_spec.h"
#include "planner/training_setup.h"

namespace ftplan {

bool Parallelism::operator==(const Parallelism& o) const {
  return dp_replicate == o.dp_replicate && dp_shard == o.dp_shard && sharding == o.sharding &&
         zero_stage == o.zero_stage && reshard_after_forward == o.reshard_after_forward && tp == o.tp &&
         sequence_parallel == o.sequence_parallel && cp == o.cp && cp_mode == o.cp_mode && pp == o.pp &&
         schedule == o.schedule && virtual_stages == o.virtual_stages && ep == o.ep &&
         offload_optimizer == o.offload_optimizer && offload_params == o.offload_params;
}

Parallelism preset(Strategy s, int64_t n, int64_t gpus_per_node) {
  n = std::max<int64_t>(1, n);
  Parallelism p;
  auto shard = [&](Sharding by, int stage) {
    p.dp_shard = n;
    p.sharding = by;
    p.zero_stage = stage;
  };
  switch (s) {
    case Strategy::single: break;
    case Strategy::ddp: p.dp_replicate = n; break;
    case Strategy::zero1: shard(Sharding::zero, 1); break;
    case Strategy::zero2: shard(Sharding::zero, 2); break;
    case Strategy::zero3: shard(Sharding::zero, 3); break;
    case Strategy::fsdp: shard(Sharding::fsdp, 3); break;
    case Strategy::fsdp_shard_grad_op:
      shard(Sharding::fsdp, 3);
      p.reshard_after_forward = false;
      break;
    case Strategy::fsdp_hybrid: {  // shard inside a node, replicate across nodes (HYBRID_SHARD)
      const int64_t g = std::max<int64_t>(1, std::min(n, gpus_per_node));
      shard(Sharding::fsdp, 3);
      p.dp_shard = g;
      p.dp_replicate = std::max<int64_t>(1, n / g);
      break;
    }
    case Strategy::zero2_offload:
      shard(Sharding::zero, 2);
      p.offload_optimizer = true;
      break;
    case Strategy::zero3_offload:
      shard(Sharding::zero, 3);
      p.offload_optimizer = p.offload_params = true;
      break;
    case Strategy::mp:
      p.pp = n;
      p.schedule = PipelineSchedule::naive;
      break;
    case Strategy::pipeline_gpipe:
      p.pp = n;
      p.schedule = PipelineSchedule::gpipe;
      break;
    case Strategy::pipeline_1f1b:
      p.pp = n;
      p.schedule = PipelineSchedule::one_f_one_b;
      break;
  }
  return p;
}

std::optional<Strategy> preset_of(const Parallelism& p) {
  if (p.tp != 1 || p.cp != 1 || p.ep != 1 || p.sequence_parallel || p.virtual_stages != 1 ||
      p.cp_mode != ContextParallel::ring)
    return std::nullopt;
  const bool naive = p.schedule == PipelineSchedule::naive;
  if (p.pp > 1) {
    if (p.dp() != 1 || p.sharding != Sharding::none || p.offload_optimizer || p.offload_params) return std::nullopt;
    if (naive) return Strategy::mp;
    if (p.schedule == PipelineSchedule::gpipe) return Strategy::pipeline_gpipe;
    if (p.schedule == PipelineSchedule::one_f_one_b) return Strategy::pipeline_1f1b;
    return std::nullopt;
  }
  if (naive) return std::nullopt;
  if (p.sharding == Sharding::none) {
    if (p.dp_shard != 1 || p.offload_optimizer || p.offload_params) return std::nullopt;
    return p.dp_replicate > 1 ? Strategy::ddp : Strategy::single;
  }
  if (p.sharding == Sharding::zero) {
    if (p.dp_replicate != 1 || !p.reshard_after_forward) return std::nullopt;
    if (p.zero_stage == 2 && p.offload_optimizer && !p.offload_params) return Strategy::zero2_offload;
    if (p.zero_stage == 3 && p.offload_optimizer && p.offload_params) return Strategy::zero3_offload;
    if (p.offload_optimizer || p.offload_params || p.dp_shard < 2) return std::nullopt;
    return p.zero_stage == 1 ? Strategy::zero1 : p.zero_stage == 2 ? Strategy::zero2 : Strategy::zero3;
  }
  // FSDP.
  if (p.zero_stage != 3 || p.offload_optimizer || p.offload_params || p.dp_shard < 2) return std::nullopt;
  if (!p.reshard_after_forward) return p.dp_replicate == 1 ? std::optional(Strategy::fsdp_shard_grad_op) : std::nullopt;
  return p.dp_replicate > 1 ? Strategy::fsdp_hybrid : Strategy::fsdp;
}

std::string to_string(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::naive: return "naive";
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved_1f1b: return "interleaved_1f1b";
  }
  return "?";
}

std::string to_string(ContextParallel c) { return c == ContextParallel::ring ? "ring" : "all_gather"; }

std::string sharding_name(const Parallelism& p) {
  switch (p.sharding) {
    case Sharding::none: return "none";
    case Sharding::zero: return "zero" + std::to_string(p.zero_stage);
    case Sharding::fsdp: return p.reshard_after_forward ? "fsdp" : "fsdp_shard_grad_op";
  }
  return "?";
}

std::string to_string(const Parallelism& p) {
  std::vector<std::string> parts;
  auto degree = [&](const char* key, int64_t v) {
    if (v != 1) parts.push_back(std::string(key) + "=" + std::to_string(v));
  };
  degree("tp", p.tp);
  if (p.sequence_parallel) parts.push_back("sp=1");
  degree("cp", p.cp);
  if (p.cp > 1 && p.cp_mode != ContextParallel::ring) parts.push_back("cp_mode=" + to_string(p.cp_mode));
  degree("pp", p.pp);
  if (p.pp > 1 || p.schedule == PipelineSchedule::naive)
    if (p.schedule != PipelineSchedule::one_f_one_b) parts.push_back("schedule=" + to_string(p.schedule));
  degree("virtual_stages", p.virtual_stages);
  degree("dp_replicate", p.dp_replicate);
  degree("dp_shard", p.dp_shard);
  if (p.sharding != Sharding::none) parts.push_back("shard=" + sharding_name(p));
  degree("ep", p.ep);
  if (p.offload_optimizer || p.offload_params)
    parts.push_back(std::string("offload=") + (p.offload_params ? "optimizer+params" : "optimizer"));
  if (parts.empty()) return "tp=1";
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
  return out;
}

std::string name(const Parallelism& p) {
  const auto s = preset_of(p);
  return s ? to_string(*s) : to_string(p);
}

namespace {

int64_t parse_degree(const std::string& value, const std::string& where) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (...) {
    used = 0;
  }
  if (used != value.size() || value.empty()) fail_input(where + ": '" + value + "' is not a whole number");
  if (v < 1 || v > 1048576) fail_input(where + ": " + value + " is out of range [1, 1048576]");
  return v;
}

bool parse_flag(const std::string& value, const std::string& where) {
  if (value == "1" || value == "true" || value == "on") return true;
  if (value == "0" || value == "false" || value == "off") return false;
  fail_input(where + ": '" + value + "' is not 0 or 1");
}

void set_sharding(Parallelism& p, const std::string& v, const std::string& where) {
  p.reshard_after_forward = true;
  if (v == "none") p.sharding = Sharding::none, p.zero_stage = 0;
  else if (v == "zero1") p.sharding = Sharding::zero, p.zero_stage = 1;
  else if (v == "zero2") p.sharding = Sharding::zero, p.zero_stage = 2;
  else if (v == "zero3") p.sharding = Sharding::zero, p.zero_stage = 3;
  else if (v == "fsdp") p.sharding = Sharding::fsdp, p.zero_stage = 3;
  else if (v == "fsdp_shard_grad_op") p.sharding = Sharding::fsdp, p.zero_stage = 3, p.reshard_after_forward = false;
  else fail_input(where + ": '" + v + "' is not one of none, zero1, zero2, zero3, fsdp, fsdp_shard_grad_op");
}

}  // namespace

Parallelism parse_parallelism(const std::string& text, const std::string& field, const std::string& default_sharding,
                              ContextParallel default_cp_mode, bool default_sequence_parallel) {
  Parallelism p;
  p.cp_mode = default_cp_mode;
  bool sharding_given = false, schedule_given = false;
  std::set<std::string> seen;
  std::stringstream in(text);
  std::string item;
  int items = 0;
  while (std::getline(in, item, ',')) {
    ++items;
    const auto eq = item.find('=');
    if (eq == std::string::npos)
      fail_input(field + ": '" + item + "' is not key=value (e.g. tp=8,pp=2,dp_shard=4)");
    auto trim = [](std::string t) {
      const auto b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
      return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
    };
    const std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    const std::string where = field + ": " + key;
    if (!seen.insert(key == "vpp" ? "virtual_stages" : key == "sequence_parallel" ? "sp" : key).second)
      fail_input(where + ": given twice");
    if (key == "tp") p.tp = parse_degree(value, where);
    else if (key == "cp") p.cp = parse_degree(value, where);
    else if (key == "pp") p.pp = parse_degree(value, where);
    else if (key == "dp_replicate") p.dp_replicate = parse_degree(value, where);
    else if (key == "dp_shard") p.dp_shard = parse_degree(value, where);
    else if (key == "ep") p.ep = parse_degree(value, where);
    else if (key == "virtual_stages" || key == "vpp") p.virtual_stages = parse_degree(value, where);
    else if (key == "sp" || key == "sequence_parallel") p.sequence_parallel = parse_flag(value, where);
    else if (key == "shard") set_sharding(p, value, where), sharding_given = true;
    else if (key == "cp_mode") {
      if (value == "ring") p.cp_mode = ContextParallel::ring;
      else if (value == "all_gather") p.cp_mode = ContextParallel::all_gather;
      else fail_input(where + ": '" + value + "' is not one of ring, all_gather");
    } else if (key == "schedule") {
      schedule_given = true;
      if (value == "naive") p.schedule = PipelineSchedule::naive;
      else if (value == "gpipe") p.schedule = PipelineSchedule::gpipe;
      else if (value == "1f1b") p.schedule = PipelineSchedule::one_f_one_b;
      else if (value == "interleaved_1f1b") p.schedule = PipelineSchedule::interleaved_1f1b;
      else fail_input(where + ": '" + value + "' is not one of naive, gpipe, 1f1b, interleaved_1f1b");
    } else if (key == "offload") {
      if (value == "none") p.offload_optimizer = p.offload_params = false;
      else if (value == "optimizer") p.offload_optimizer = true, p.offload_params = false;
      else if (value == "optimizer+params" || value == "all") p.offload_optimizer = p.offload_params = true;
      else fail_input(where + ": '" + value + "' is not one of none, optimizer, optimizer+params");
    } else {
      fail_input(where + ": unknown key (dp_replicate, dp_shard, shard, tp, sp, cp, cp_mode, pp, schedule, "
                         "virtual_stages, ep, offload)");
    }
  }
  if (items == 0) fail_input(field + ": empty (e.g. tp=8,pp=2,dp_shard=4)");
  // Sharded data parallelism by the framework's default implementation when no shard= is given.
  if (!sharding_given && (p.dp_shard > 1 || p.offload_optimizer)) set_sharding(p, default_sharding, field + ": shard");
  if (p.offload_params && p.sharding != Sharding::none && p.zero_stage < 3 && !sharding_given)
    set_sharding(p, default_sharding == "fsdp" ? "fsdp" : "zero3", field + ": shard");
  if (p.virtual_stages > 1 && !schedule_given) p.schedule = PipelineSchedule::interleaved_1f1b;
  if (p.tp > 1 && !seen.count("sp")) p.sequence_parallel = default_sequence_parallel;
  return p;
}

std::vector<std::string> parallelism_problems(const Parallelism& p, const ModelSpec& model, const TrainingSetup& setup,
                                              int64_t num_gpus, Attention attention) {
  std::vector<std::string> out;
  auto s = [](int64_t v) { return std::to_string(v); };
  // The GPU count: every degree multiplies; a layout of one GPU may run on a job of several (it uses one).
  if (p.gpus() != num_gpus && !(p.gpus() == 1 && num_gpus >= 1)) {
    std::string product;
    auto term = [&](const char* key, int64_t v) {
      if (v != 1 || (std::string(key) == "dp_shard" && product.empty()))
        product += (product.empty() ? "" : " * ") + std::string(key) + "(" + s(v) + ")";
    };
    term("tp", p.tp);
    term("cp", p.cp);
    term("pp", p.pp);
    term("dp_replicate", p.dp_replicate);
    term("dp_shard", p.dp_shard);
    out.push_back(product + " = " + s(p.gpus()) + " != gpus(" + s(num_gpus) + ")");
  }
  if (p.sharding == Sharding::none && p.dp_shard > 1)
    out.push_back("dp_shard(" + s(p.dp_shard) + ") needs a sharding (shard=zero1|zero2|zero3|fsdp|fsdp_shard_grad_op)");
  if (p.sharding == Sharding::zero && p.dp_replicate > 1)
    out.push_back("dp_replicate(" + s(p.dp_replicate) + ") with shard=" + sharding_name(p) +
                  ": DeepSpeed ZeRO shards over every data-parallel rank; use shard=fsdp for hybrid sharding");
  if (p.sharding != Sharding::none && (p.zero_stage < 1 || p.zero_stage > 3))
    out.push_back("zero_stage(" + s(p.zero_stage) + ") must be 1, 2 or 3");
  if (!p.reshard_after_forward && p.zero_stage != 3)
    out.push_back("reshard_after_forward=false needs stage 3 sharding");
  if (p.offload_optimizer && p.sharding == Sharding::none)
    out.push_back("offload=optimizer needs a sharding (ZeRO-Offload: shard=zero2 or zero3; FSDP CPUOffload: shard=fsdp)");
  if (p.offload_params && !p.shards_params())
    out.push_back("offload=optimizer+params needs shard=zero3 or fsdp (parameters are offloaded shard by shard)");
  if (p.offload_params && !p.offload_optimizer) out.push_back("offloaded parameters need offloaded optimizer states");
  // Tensor parallelism splits heads, KV heads (or replicates them, as Megatron does), the MLP and the vocabulary.
  if (p.tp > 1) {
    if (model.num_heads % p.tp != 0)
      out.push_back("tp(" + s(p.tp) + ") does not divide num_attention_heads(" + s(model.num_heads) + ")");
    else if (model.num_kv_heads % p.tp != 0 && p.tp % model.num_kv_heads != 0)
      out.push_back("tp(" + s(p.tp) + ") neither divides nor is a multiple of num_key_value_heads(" + s(model.num_kv_heads) + ")");
    if (model.intermediate_size % p.tp != 0)
      out.push_back("tp(" + s(p.tp) + ") does not divide intermediate_size(" + s(model.intermediate_size) + ")");
  }
  if (p.sequence_parallel && p.tp == 1) out.push_back("sp=1 (sequence parallelism) needs tp > 1");
  if (p.sequence_parallel && (setup.seq_len * setup.micro_batch_or(1)) % p.tp != 0)
    out.push_back("sp=1: tokens per micro-batch (" + s(setup.seq_len * setup.micro_batch_or(1)) + ") do not divide by tp(" + s(p.tp) + ")");
  if (p.cp > 1) {
    if (setup.seq_len % (2 * p.cp) != 0)
      out.push_back("cp(" + s(p.cp) + ") cannot split seq_len(" + s(setup.seq_len) + "): it must divide by 2*cp(" +
                    s(2 * p.cp) + ") (load-balanced chunks, torch.distributed.tensor.experimental.context_parallel)");
    if (attention == Attention::eager)
      out.push_back("cp(" + s(p.cp) + ") with attention eager: context parallelism runs on the fused (flash/SDPA) kernels");
  }
  if (p.pp > model.num_layers)
    out.push_back("pp(" + s(p.pp) + ") > num_hidden_layers(" + s(model.num_layers) + "): a stage needs a layer");
  if (p.schedule == PipelineSchedule::naive && p.pp < 2 && p.gpus() > 1)
    out.push_back("schedule=naive needs pp >= 2");
  if (p.virtual_stages > 1 && p.schedule != PipelineSchedule::interleaved_1f1b)
    out.push_back("virtual_stages(" + s(p.virtual_stages) + ") needs schedule=interleaved_1f1b");
  if (p.schedule == PipelineSchedule::interleaved_1f1b) {
    if (p.pp < 2) out.push_back("schedule=interleaved_1f1b needs pp >= 2");
    if (p.virtual_stages < 2) out.push_back("schedule=interleaved_1f1b needs virtual_stages >= 2");
    if (p.pp * p.virtual_stages > model.num_layers)
      out.push_back("pp(" + s(p.pp) + ") * virtual_stages(" + s(p.virtual_stages) + ") > num_hidden_layers(" +
                    s(model.num_layers) + ")");
    if (p.pp > 1 && setup.grad_accum % p.pp != 0)
      out.push_back("schedule=interleaved_1f1b: grad_accum(" + s(setup.grad_accum) + ") micro-batches must divide by pp(" +
                    s(p.pp) + ") (Megatron-LM's interleaved schedule)");
  }
  if (p.pp > 1 && p.sharding == Sharding::zero && p.zero_stage >= 2)
    out.push_back("pp(" + s(p.pp) + ") with shard=" + sharding_name(p) +
                  ": DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only (deepspeed/runtime/pipe/engine.py: "
                  "\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\"); use shard=fsdp");
  if (p.pp > 1 && (p.offload_optimizer || p.offload_params)) out.push_back("offload with pp > 1 is not modelled");
  // Expert parallelism borrows its ranks from the sharded data-parallel ones (torchtitan/distributed/parallel_dims.py:
  // ep % cp == 0 and dp_shard * cp % ep == 0): each ep group splits every MoE block's experts.
  if (p.ep > 1) {
    if (!model.moe.active()) {
      out.push_back("ep(" + s(p.ep) + "): " + model.name + " has no experts (expert parallelism needs a mixture-of-experts model)");
    } else {
      if (model.moe.num_experts % p.ep != 0)
        out.push_back("ep(" + s(p.ep) + ") does not divide num_experts(" + s(model.moe.num_experts) + ") of " + model.name);
      const int64_t pool = p.dp_shard * p.cp;
      const std::string pool_text = "dp_shard(" + s(p.dp_shard) + ") * cp(" + s(p.cp) + ")";
      if (pool % p.ep != 0 || p.ep % p.cp != 0)
        out.push_back("ep(" + s(p.ep) + ") must divide " + pool_text + " = " + s(pool) + " and be a multiple of cp(" + s(p.cp) +
                      "): expert parallelism borrows its ranks from the data-parallel ones (torchtitan/distributed/parallel_dims.py)");
      if (p.pp > 1) out.push_back("ep(" + s(p.ep) + ") with pp(" + s(p.pp) + "): expert parallelism inside pipeline stages is not modelled");
      if (p.offload_optimizer || p.offload_params) out.push_back("ep(" + s(p.ep) + ") with offload: not modelled");
    }
  }
  // Experts and latent attention are not split by tensor parallelism here (ETP, MLA under TP: not modelled).
  if (p.tp > 1 && (model.moe.active() || model.mla.active()))
    out.push_back("tp(" + s(p.tp) + ") on " + model.name + ": tensor parallelism of " +
                  (model.moe.active() ? "experts" : "latent attention") + " is not modelled (use ep and dp_shard)");
  return out;
}

nlohmann::json parallelism_json(const Parallelism& p) {
  return {{"dp_replicate", p.dp_replicate},
          {"dp_shard", p.dp_shard},
          {"sharding", sharding_name(p)},
          {"zero_stage", p.sharding == Sharding::none ? 0 : p.zero_stage},
          {"reshard_after_forward", p.reshard_after_forward},
          {"tp", p.tp},
          {"sequence_parallel", p.sequence_parallel},
          {"cp", p.cp},
          {"cp_mode", to_string(p.cp_mode)},
          {"pp", p.pp},
          {"schedule", to_string(p.schedule)},
          {"virtual_stages", p.virtual_stages},
          {"ep", p.ep},
          {"offload_optimizer", p.offload_optimizer},
          {"offload_params", p.offload_params},
          {"gpus", p.gpus()}};
}

GroupPlacement tp_group(const Parallelism& p) { return {p.tp, 1}; }
GroupPlacement cp_group(const Parallelism& p) { return {p.cp, p.tp}; }
GroupPlacement shard_group(const Parallelism& p) { return {p.dp_shard * p.cp, p.tp}; }
GroupPlacement replicate_group(const Parallelism& p) { return {p.dp_replicate, p.tp * p.cp * p.dp_shard}; }
GroupPlacement grad_group(const Parallelism& p) { return {p.dp_replicate * p.dp_shard * p.cp, p.tp}; }
GroupPlacement pp_group(const Parallelism& p) { return {p.pp, p.tp * p.cp * p.dp_shard * p.dp_replicate}; }
GroupPlacement ep_group(const Parallelism& p) { return {p.ep, p.tp}; }

}  // namespace ftplan
