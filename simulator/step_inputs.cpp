#include "simulator/step_inputs.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "planner/errors.h"

namespace ftplan::sim {

bool is_pipeline(const Parallelism& p) { return p.pp > 1; }

void set_preset(StepInputs& inputs, Strategy strategy, int num_gpus) {
  inputs.parallel = preset(strategy, num_gpus, 8);
  inputs.name = to_string(strategy);
  inputs.num_gpus = num_gpus;
}

int pipeline_chunks(const Parallelism& p) {
  return p.schedule == PipelineSchedule::interleaved_1f1b ? static_cast<int>(std::max<int64_t>(1, p.virtual_stages)) : 1;
}

std::vector<int> stage_layer_bounds(const StepInputs& inputs) {
  const int stages = inputs.num_gpus * pipeline_chunks(inputs.parallel);
  const int layers = static_cast<int>(inputs.layers.size());
  std::vector<int> bounds{0};
  if (!inputs.stage_layer_counts.empty()) {
    for (int count : inputs.stage_layer_counts) bounds.push_back(bounds.back() + count);
    return bounds;
  }
  for (int s = 1; s <= stages; ++s) bounds.push_back(static_cast<int>(int64_t{layers} * s / stages));
  return bounds;
}

namespace {

bool bad_number(double x) { return !std::isfinite(x) || x < 0.0; }

}  // namespace

void validate_step_inputs(const StepInputs& in) {
  std::vector<std::string> problems;
  auto add = [&](const std::string& p) { problems.push_back(p); };
  const std::string strategy = in.name;
  const Parallelism& par = in.parallel;
  const int layers = static_cast<int>(in.layers.size());

  if (in.num_gpus < 1) add("num_gpus(" + std::to_string(in.num_gpus) + ") must be >= 1");
  if (in.micro_batches < 1) add("micro_batches(" + std::to_string(in.micro_batches) + ") must be >= 1");
  if (layers < 1) add("layers is empty (need at least one unit)");
  if (par.gpus() == 1 && in.num_gpus != 1)
    add(strategy + " needs num_gpus(" + std::to_string(in.num_gpus) + ") == 1");
  if (is_pipeline(par) && in.num_gpus != par.pp)
    add(strategy + " needs num_gpus(" + std::to_string(in.num_gpus) + ") == pp(" + std::to_string(par.pp) + ")");
  const int virtual_stages = in.num_gpus * pipeline_chunks(par);
  if (is_pipeline(par) && virtual_stages > layers)
    add(strategy + " needs num_gpus(" + std::to_string(in.num_gpus) + ") * chunks(" + std::to_string(pipeline_chunks(par)) +
        ") <= layers(" + std::to_string(layers) + ")");
  if (par.schedule == PipelineSchedule::interleaved_1f1b && in.micro_batches % std::max(1, in.num_gpus) != 0)
    add(strategy + " needs micro_batches(" + std::to_string(in.micro_batches) + ") divisible by num_gpus(" +
        std::to_string(in.num_gpus) + ") (Megatron's interleaved schedule)");
  if (!in.stage_layer_counts.empty()) {
    int sum = 0;
    bool positive = true;
    for (int c : in.stage_layer_counts) {
      sum += c;
      positive = positive && c >= 1;
    }
    if (static_cast<int>(in.stage_layer_counts.size()) != virtual_stages || sum != layers || !positive)
      add("stage_layer_counts must have num_gpus(" + std::to_string(in.num_gpus) + ") * chunks(" +
          std::to_string(pipeline_chunks(par)) + ") entries >= 1 summing to layers(" + std::to_string(layers) + ")");
  }
  if (!in.static_bytes_by_rank.empty() &&
      static_cast<int>(in.static_bytes_by_rank.size()) != in.num_gpus)
    add("static_bytes_by_rank has " + std::to_string(in.static_bytes_by_rank.size()) +
        " entries, num_gpus is " + std::to_string(in.num_gpus));
  if (in.static_bytes_per_rank < 0) add("static_bytes_per_rank must be >= 0");
  if (in.logits_bytes < 0) add("logits_bytes must be >= 0");
  if (bad_number(in.optimizer_step_s)) add("optimizer_step_s must be finite and >= 0");
  if (in.bucket_bytes < 1 || in.first_bucket_bytes < 1)
    add("bucket_bytes and first_bucket_bytes must be >= 1");
  if (in.fsdp_prefetch_depth < 0) add("fsdp_prefetch_depth must be >= 0");
  for (int i = 0; i < layers; ++i) {
    const LayerCost& l = in.layers[i];
    const std::string where = "layers[" + std::to_string(i) + "]";
    if (bad_number(l.forward_s) || bad_number(l.backward_input_s) || bad_number(l.backward_weight_s) ||
        bad_number(l.tp_forward_comm_s) || bad_number(l.tp_backward_comm_s) || bad_number(l.attention_forward_s) ||
        bad_number(l.cp_forward_comm_s) || bad_number(l.cp_backward_comm_s))
      add(where + ": durations must be finite and >= 0");
    if (l.attention_forward_s > l.forward_s || 2 * l.attention_forward_s > l.backward_input_s)
      add(where + ": attention_forward_s must fit in forward_s and, twice, in backward_input_s");
    if (l.param_bytes < 0 || l.grad_bytes < 0 || l.saved_activation_bytes < 0 || l.checkpoint_bytes < 0 ||
        l.all_to_all_bytes < 0)
      add(where + ": byte counts must be >= 0");
  }

  // The cost functions each strategy calls.
  auto need = [&](bool needed, const std::function<double(int64_t)>& f, const char* name) {
    if (needed && !f) add(strategy + " needs " + name);
  };
  const bool sharded = par.sharding != Sharding::none;
  need(!sharded && par.grad_group() > 1, in.all_reduce_s, "all_reduce_s");  // DDP, and PP x DDP
  need(sharded, in.reduce_scatter_s, "reduce_scatter_s");
  need(sharded, in.all_gather_s, "all_gather_s");
  need(sharded && par.dp_replicate > 1, in.replica_all_reduce_s, "replica_all_reduce_s");
  need(is_pipeline(par) && in.num_gpus > 1, in.p2p_s, "p2p_s");
  need(par.offload_optimizer, in.host_copy_s, "host_copy_s");
  bool a2a = false;
  for (const LayerCost& l : in.layers) a2a = a2a || l.all_to_all_bytes > 0;
  need(a2a, in.all_to_all_s, "all_to_all_s");
  if (a2a && is_pipeline(par)) add("all-to-all (expert parallelism) inside pipeline stages is not simulated");

  if (problems.empty()) return;
  std::ostringstream message;
  message << "step inputs (" << strategy << "): ";
  for (size_t i = 0; i < problems.size(); ++i) message << (i ? "; " : "") << problems[i];
  fail_input(message.str());
}

}  // namespace ftplan::sim
