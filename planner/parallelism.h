// How a job is laid out over its GPUs: one plain description every layer reads (memory, time, the
// search, its explanation, the simulator's graph builder, ftexec), in the spirit of torchtitan's
// ParallelDims (torchtitan/distributed/parallel_dims.py) and Calculon's execution spec.
//
// A rank's coordinates, innermost first (torchtitan's mesh order pp, dp_replicate, dp_shard, cp, tp):
//   tp            tensor parallel: every block linear split Megatron-style (q/k/v, gate/up by output
//                 columns, o/down by input rows), the embedding and head by vocabulary; with
//                 sequence_parallel the norms and residual stream split by tokens between them
//   cp            context parallel: the sequence split into cp chunks; attention exchanges K and V
//                 (ring: passed around the ring, overlapped with attention; all_gather: gathered)
//   dp_shard      ranks a ZeRO stage or FSDP shards the model states over (with cp: over dp_shard x cp,
//                 as torchtitan's dp_shard_cp mesh)
//   dp_replicate  replicas: DDP, or HSDP's replica groups (gradients all-reduced across them)
//   pp            pipeline stages, `virtual_stages` model chunks each (interleaved 1F1B), over the job's
//                 grad_accum micro-batches
//   ep            expert parallel (mixture-of-experts models): ep ranks borrowed from the sharded
//                 data-parallel ones (dp_shard x cp, as torchtitan's dp2ep) split every MoE block's experts, num_experts / ep whole experts each, the tokens dispatched to them and
//                 combined back by all-to-all in forward and backward; what the layout shards it shards the
//                 experts over the rest (dp_shard x cp / ep)
// plus offload of optimizer states (ZeRO-Offload) and of parameters (ZeRO-Infinity's param offload).
//
// The thirteen strategy names are presets over it (`preset`); a description equal to a preset is
// named by it (`name`), any other by its canonical `--parallel` string, e.g. "tp=8,pp=2,dp_shard=4".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ftplan {

enum class Strategy;   // training_setup.h: the thirteen preset names
enum class Attention;  // training_setup.h
struct TrainingSetup;
struct ModelSpec;

// Who shards the model states over dp_shard: nobody (replicas), DeepSpeed ZeRO (a stage), PyTorch FSDP.
enum class Sharding { none, zero, fsdp };
// Pipeline schedules: naive model parallel (one micro-batch through all stages at a time), GPipe
// (all forwards, then all backwards), 1F1B (PipeDream-flush), interleaved 1F1B (Narayanan et al. 2021).
enum class PipelineSchedule { naive, gpipe, one_f_one_b, interleaved_1f1b };
enum class ContextParallel { ring, all_gather };

struct Parallelism {
  int64_t dp_replicate = 1;
  int64_t dp_shard = 1;
  Sharding sharding = Sharding::none;
  int zero_stage = 0;                // what dp_shard shards: 1 optimizer states, 2 + gradients, 3 + parameters
  bool reshard_after_forward = true; // stage 3: false keeps parameters gathered from forward through
                                     // backward (FSDP SHARD_GRAD_OP, fully_shard(reshard_after_forward=False))
  int64_t tp = 1;
  bool sequence_parallel = false;
  int64_t cp = 1;
  ContextParallel cp_mode = ContextParallel::ring;
  int64_t pp = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t virtual_stages = 1;        // model chunks per stage (interleaved 1F1B), e.g. 2
  int64_t ep = 1;                    // expert parallel (mixture-of-experts models only): ranks per expert group, e.g. 8
  bool offload_optimizer = false;    // optimizer states and master weights in host memory, Adam on the CPU
  bool offload_params = false;       // parameters in host memory, brought up unit by unit

  int64_t gpus() const { return dp_replicate * dp_shard * cp * tp * pp; }
  int64_t dp() const { return dp_replicate * dp_shard; }
  // The ranks model states are sharded over (ZeRO/FSDP shard over dp_shard x cp) and the ranks
  // gradients are averaged over (every data-parallel and context-parallel rank).
  int64_t shard_group() const { return sharding == Sharding::none ? 1 : dp_shard * cp; }
  int64_t grad_group() const { return dp_replicate * dp_shard * cp; }
  bool shards_optimizer() const { return sharding != Sharding::none && zero_stage >= 1; }
  bool shards_gradients() const { return sharding != Sharding::none && zero_stage >= 2; }
  bool shards_params() const { return sharding != Sharding::none && zero_stage >= 3; }
  // Parameters gathered for compute (in the compute dtype): stage 3 gathers them unit by unit.
  bool gathers_params() const { return shards_params(); }
  bool pipelined() const { return pp > 1 || schedule == PipelineSchedule::naive; }
  bool operator==(const Parallelism& o) const;
  bool operator!=(const Parallelism& o) const { return !(*this == o); }
};

// The layout a preset means on `num_gpus` GPUs with `gpus_per_node` per node: single uses one GPU;
// ddp replicates; zero1/2/3 shard with DeepSpeed's stages; fsdp shards fully; fsdp_shard_grad_op keeps
// parameters gathered between forward and backward; fsdp_hybrid shards inside a node and replicates
// across nodes; *_offload add ZeRO-Offload (zero3_offload: parameters too); mp, pipeline and
// pipeline_1f1b put one stage on each GPU.
Parallelism preset(Strategy strategy, int64_t num_gpus, int64_t gpus_per_node);

// The preset a description equals (structure only: fsdp_hybrid is any HSDP layout), or none.
std::optional<Strategy> preset_of(const Parallelism& p);

// The preset's name, or the canonical --parallel string of a composition.
std::string name(const Parallelism& p);
// "tp=8,pp=2,dp_shard=4,shard=fsdp": every degree above 1 and every flag away from its default.
std::string to_string(const Parallelism& p);
std::string to_string(PipelineSchedule s);  // "naive", "gpipe", "1f1b", "interleaved_1f1b"
std::string to_string(ContextParallel c);   // "ring", "all_gather"
std::string sharding_name(const Parallelism& p);  // "none", "zero1".."zero3", "fsdp", "fsdp_shard_grad_op"

// Parses "tp=8,pp=2,dp_shard=4" (keys: dp_replicate, dp_shard, shard=zero1|zero2|zero3|fsdp|
// fsdp_shard_grad_op, tp, sp (sequence parallel, 0|1), cp, cp_mode=ring|all_gather, pp,
// schedule=naive|gpipe|1f1b|interleaved_1f1b, virtual_stages (alias vpp), ep, offload=none|optimizer|
// optimizer+params). dp_shard > 1 without shard= shards as `default_sharding` ("fsdp" or "zero3": the
// framework's); cp without cp_mode= exchanges as `default_cp_mode` (the framework's); tp > 1 without
// sp= runs sequence parallelism when `default_sequence_parallel` (the framework's default); virtual_stages
// > 1 implies the interleaved schedule. InputError naming `field` and
// the key on anything else.
Parallelism parse_parallelism(const std::string& text, const std::string& field,
                              const std::string& default_sharding = "fsdp",
                              ContextParallel default_cp_mode = ContextParallel::ring,
                              bool default_sequence_parallel = false);

// What the model and the job allow; every problem names its operands, e.g.
// "tp(8) * pp(2) * dp_shard(4) = 64 != gpus(32)". Empty when the layout is valid.
std::vector<std::string> parallelism_problems(const Parallelism& p, const ModelSpec& model, const TrainingSetup& setup,
                                              int64_t num_gpus, Attention attention);

// {"dp_replicate", "dp_shard", "sharding", "zero_stage", "reshard_after_forward", "tp",
//  "sequence_parallel", "cp", "cp_mode", "pp", "schedule", "virtual_stages", "ep",
//  "offload_optimizer", "offload_params", "gpus"}
nlohmann::json parallelism_json(const Parallelism& p);

// Ranks are numbered tp fastest, then cp, dp_shard, dp_replicate, pp. A process group of one
// dimension (or of several adjacent ones) is `size` ranks `stride` apart.
struct GroupPlacement {
  int64_t size = 1;
  int64_t stride = 1;
};
GroupPlacement tp_group(const Parallelism& p);
GroupPlacement cp_group(const Parallelism& p);
GroupPlacement shard_group(const Parallelism& p);      // dp_shard x cp (contiguous: stride tp)
GroupPlacement replicate_group(const Parallelism& p);  // dp_replicate
GroupPlacement grad_group(const Parallelism& p);       // dp_replicate x dp_shard x cp
GroupPlacement pp_group(const Parallelism& p);
GroupPlacement ep_group(const Parallelism& p);         // ep ranks of dp_shard x cp (contiguous: stride tp)

}  // namespace ftplan
