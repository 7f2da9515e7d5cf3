#include "planner/job_fields.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "planner/errors.h"
#include "planner/model_family.h"

namespace ftplan {
namespace {

using Apply = void (*)(TrainingSetup&, const FieldSpec&, const nlohmann::json&, const std::string&);

struct Row {
  FieldSpec spec;
  Apply apply;
};

constexpr unsigned kJob = kInJobFile | kFtplanFlag | kFtexecFlag;  // everywhere
constexpr unsigned kJobPlan = kInJobFile | kFtplanFlag;            // the planner's inputs
constexpr unsigned kJobExec = kInJobFile | kFtexecFlag;            // carried to ftexec through a plan
constexpr double kMaxTokens = 16777216;                            // 2^24 tokens per sample

Row integer(const char* key, const char* flag, double lo, double hi, const char* unit, const char* help, unsigned places,
            Apply apply = nullptr) {
  return {{key, flag, FieldType::integer, lo, hi, false, false, unit, "", help, places}, apply};
}
Row number(const char* key, const char* flag, double lo, double hi, bool lo_open, bool hi_open, const char* unit,
           const char* help, unsigned places, Apply apply = nullptr) {
  return {{key, flag, FieldType::number, lo, hi, lo_open, hi_open, unit, "", help, places}, apply};
}
Row text(FieldType type, const char* key, const char* flag, const char* choices, const char* help, unsigned places,
         Apply apply = nullptr) {
  return {{key, flag, type, 0, 0, false, false, "", choices, help, places}, apply};
}

const std::vector<Row>& rows() {
  using T = TrainingSetup;
  using F = FieldSpec;
  using J = nlohmann::json;
  using S = std::string;
  static const std::vector<Row> table = {
      // The job: the same keys in job files and plans, the same flags in ftplan and ftexec.
      text(FieldType::text, "model", "--model", "", "Model: short name (llama-3-8b) or path of a Hugging Face config.json",
           kJob, [](T& s, const F& f, const J& v, const S& n) { s.model = field_text(f, v, n); }),
      text(FieldType::text, "framework", "--framework", "",
           "Framework whose behaviour is predicted: a profile in configs/frameworks/ (hf, deepspeed, fsdp, "
           "lightning, torchtune, torchtitan, ftexec, ...)", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.framework = field_text(f, v, n); }),
      text(FieldType::text, "gpu", "--gpu", "", "GPU id from hwdb/ (a100-80gb-sxm, h100-sxm, rtx-3090, ...)", kJob,
           [](T& s, const F& f, const J& v, const S& n) { s.gpu = field_text(f, v, n); }),
      integer("gpus", "--gpus", 1, 1048576, "GPUs", "Number of GPUs in the job", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.num_gpus = field_int(f, v, n); }),
      text(FieldType::choice, "method", "--method", "full|lora|qlora", "Fine-tuning method", kJob,
           [](T& s, const F& f, const J& v, const S& n) { s.method = parse_method(field_text(f, v, n), n); }),
      integer("lora.rank", "--lora-rank", 1, 65536, "", "LoRA rank r", kJob,
              [](T& s, const F& f, const J& v, const S& n) { s.lora.rank = field_int(f, v, n); }),
      number("lora.alpha", "--lora-alpha", 0, 1e6, true, false, "", "LoRA alpha: the update is scaled by alpha / r "
             "(default 8, PEFT's LoraConfig lora_alpha)", kJob, [](T& s, const F& f, const J& v, const S& n) { s.lora.alpha = field_number(f, v, n); }),
      number("lora.dropout", "--lora-dropout", 0, 1, false, true, "probability", "LoRA dropout on the adapter's input",
             kJob, [](T& s, const F& f, const J& v, const S& n) { s.lora.dropout = field_number(f, v, n); }),
      text(FieldType::list, "lora.targets", "--lora-targets", "",
           "Adapted block linears: q_proj,v_proj | all-linear | a comma list", kJob,
           [](T& s, const F&, const J& v, const S& n) {
             std::string list;
             if (v.is_string()) {
               list = v.get<std::string>();
             } else if (v.is_array()) {
               for (const auto& x : v) {
                 if (!x.is_string()) fail_input(n + ": expected module names, got " + x.dump());
                 list += (list.empty() ? "" : ",") + x.get<std::string>();
               }
             } else {
               fail_input(n + ": expected a list or \"all-linear\", got " + v.dump());
             }
             s.lora.targets = parse_lora_targets(list, n);
             s.lora.all_linear = list == "all-linear" || list == "all";
           }),
      text(FieldType::choice, "precision", "--precision", "mixed|mixed-fp32-grads|amp|bf16|fp32",
           "Precision convention of weights, gradients and optimizer states (default: the framework's)", kJob,
           [](T& s, const F& f, const J& v, const S& n) { s.precision = parse_precision(field_text(f, v, n), n); }),
      text(FieldType::choice, "optimizer", "--optimizer", "adamw|adamw8bit|sgd", "Optimizer", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.optimizer = parse_optimizer(field_text(f, v, n), n); }),
      text(FieldType::boolean, "paged_optimizer", "--paged-optimizer", "",
           "Optimizer states paged to host memory (bitsandbytes)", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.paged_optimizer = field_bool(f, v, n); }),
      integer("seq_len", "--seq-len", 1, kMaxTokens, "tokens", "Sequence length", kJob,
              [](T& s, const F& f, const J& v, const S& n) { s.seq_len = field_int(f, v, n); }),
      integer("micro_batch", "--micro-batch", 1, 1048576, "samples per GPU", "Samples per GPU per micro-batch "
              "(default: searched)", kJob, [](T& s, const F& f, const J& v, const S& n) { s.micro_batch = field_int(f, v, n); }),
      integer("grad_accum", "--grad-accum", 1, 1048576, "micro-batches",
              "Micro-batches per optimizer step (pipelines: their micro-batches)", kJob,
              [](T& s, const F& f, const J& v, const S& n) { s.grad_accum = field_int(f, v, n); }),
      text(FieldType::choice, "checkpointing", "--checkpointing", "none|full|selective",
           "Activation checkpointing; selective recomputes the attention core (default: searched)",
           kJob, [](T& s, const F& f, const J& v, const S& n) { s.checkpointing = parse_checkpointing(field_text(f, v, n), n); }),
      text(FieldType::choice, "attention", "--attention", "fused|eager", "Attention: fused (SDPA/flash) or eager", kJob,
           [](T& s, const F& f, const J& v, const S& n) { s.attention = parse_attention(field_text(f, v, n), n); }),
      text(FieldType::choice, "strategy", "--strategy", "single|mp|pipeline|pipeline_1f1b|ddp|zero1|zero2|zero3|fsdp|"
           "fsdp_shard_grad_op|fsdp_hybrid|zero2_offload|zero3_offload", "Fix the strategy (default: searched)", kJob,
           [](T& s, const F& f, const J& v, const S& n) { s.strategy = parse_strategy(field_text(f, v, n), n); }),
      text(FieldType::text, "parallel", "--parallel", "",
           "Fix a composition: degrees tp, sp, cp, pp, dp_replicate, dp_shard (+ shard=zero1|zero2|zero3|fsdp|"
           "fsdp_shard_grad_op, schedule=gpipe|1f1b|interleaved_1f1b, virtual_stages, cp_mode=ring|all_gather, "
           "offload=optimizer|optimizer+params), e.g. \"tp=8,pp=2,dp_shard=4\" (default: searched)", kJob,
           [](T& s, const F& f, const J& v, const S& n) {
             s.parallel_text = field_text(f, v, n);
             s.parallel = parse_parallelism(s.parallel_text, n);  // re-read by apply_framework
           }),
      integer("nodes", "--nodes", 1, 65536, "nodes", "Nodes in the job (gpus = nodes x gpus-per-node)", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.nodes = field_int(f, v, n); }),
      integer("gpus_per_node", "--gpus-per-node", 1, 1024, "GPUs",
              "GPUs per node (default: the hwdb entry's; at most its topology's)", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.gpus_per_node = field_int(f, v, n); }),
      integer("fsdp_version", "--fsdp-version", 1, 2, "", "PyTorch FSDP 1 (FlatParameter) or 2 (fully_shard) "
              "(default: the framework's)", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.fsdp_version = field_int(f, v, n); }),
      text(FieldType::choice, "loss", "--loss", "full|chunked|fused-linear",
           "How the loss is computed: full logits, chunked over tokens, fused with the head (default: the framework's)",
           kJobPlan, [](T& s, const F& f, const J& v, const S& n) { s.loss = parse_loss(field_text(f, v, n), n); }),
      text(FieldType::choice, "state_dict", "--state-dict", "full|sharded|local",
           "How checkpoints save an FSDP model (accelerate's fsdp_state_dict_type): full (gathered to rank 0), "
           "sharded (each rank its chunk of every parameter), local (each rank its flat shard) (default: the "
           "framework's own save)",
           kJobPlan, [](T& s, const F& f, const J& v, const S& n) { s.state_dict = parse_state_dict(field_text(f, v, n), n); }),
      text(FieldType::boolean, "quantization.double_quant", "--double-quant", "",
           "QLoRA: bitsandbytes double quantisation of the absmaxes (default: the framework's)", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.quantization.double_quant = field_bool(f, v, n); }),
      number("moe.imbalance_factor", "--moe-imbalance-factor", 1, 1e6, false, false, "x balanced",
             "Mixture of experts, dropless routing: the busiest expert-parallel rank receives this many times the "
             "balanced tokens (default 1.0: balanced; at most num_experts / top_k)", kJobPlan,
             [](T& s, const F& f, const J& v, const S& n) { s.moe.imbalance_factor = field_number(f, v, n); }),
      number("moe.capacity_factor", "--moe-capacity-factor", 0, 1e6, true, false, "x balanced",
             "Mixture of experts: capacity-limited routing instead of dropless, each expert padded to this many times "
             "its balanced tokens (GShard, DeepSpeed-MoE; default: dropless)", kJob,
             [](T& s, const F& f, const J& v, const S& n) { s.moe.capacity_factor = field_number(f, v, n); }),
      text(FieldType::boolean, "moe.aux_loss", "--moe-aux-loss", "",
           "Mixture of experts: the load-balancing loss over every layer's router logits (default: the config's "
           "output_router_logits, as transformers does)", kJob,
           [](T& s, const F& f, const J& v, const S& n) { s.moe.aux_loss = field_bool(f, v, n); }),
      text(FieldType::boolean, "activation_offload", "--activation-offload", "",
           "Activations kept in host memory between forward and backward (torchtune)", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.activation_offload = field_bool(f, v, n); }),
      text(FieldType::boolean, "optimizer_in_backward", "--optimizer-in-backward", "",
           "Each parameter updated as soon as its gradient is ready, then the gradient freed (torchtune)", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.optimizer_in_backward = field_bool(f, v, n); }),
      text(FieldType::boolean, "compile", "--compile", "", "torch.compile (where the framework offers it)", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.compile = field_bool(f, v, n); }),
      text(FieldType::boolean, "packing", "--packing", "",
           "Rows packed to seq-len (else each batch is padded to its longest row; default: the framework's)", kJobPlan,
           [](T& s, const F& f, const J& v, const S& n) { s.packing = field_bool(f, v, n); }),
      number("host_memory_gib", "--host-memory-gib", 0, 1048576, true, false, "GiB",
             "Host memory per node (default: the hwdb entry's)", kJobPlan,
             [](T& s, const F& f, const J& v, const S& n) { s.host_memory_gib = field_number(f, v, n); }),
      text(FieldType::text, "pcie_slot", "--pcie-slot", "",
           "PCIe slot the GPUs sit in, GENxLANES (e.g. 3x8 for PCIe 3.0 x8: a consumer board splitting 16 lanes between "
           "two cards); the link trains at the lower generation and lanes of card and slot, and scales host copies and a "
           "PCIe-only card's GPU-to-GPU links (default: the card's own, in hwdb)",
           kJobPlan, [](T& s, const F& f, const J& v, const S& n) {
             s.pcie_slot = field_text(f, v, n);
             parse_pcie_slot(*s.pcie_slot, n);  // refused here, where the field is named
           }),
      number("price_per_gpu_hour", "--price-per-gpu-hour", 0, 1e6, true, false, "USD per GPU-hour",
             "Rental price per GPU-hour (default: the hwdb entry's dated on-demand price; in ftplan sweep it "
             "applies to every GPU type)", kJobPlan,
             [](T& s, const F& f, const J& v, const S& n) { s.price_per_gpu_hour = field_number(f, v, n); }),
      number("efficiency", "--efficiency", 1e-4, 1, false, false, "fraction of peak FLOP/s",
             "Achieved fraction of the GPU's peak (default: from hwdb)", kJobPlan,
             [](T& s, const F& f, const J& v, const S& n) { s.efficiency = field_number(f, v, n); }),
      integer("epochs", "--epochs", 1, 1048576, "epochs", "Passes over the dataset", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.epochs = field_int(f, v, n); }),
      number("headroom_fraction", "--headroom", 0, 0.9, false, false, "fraction of GPU memory",
             "GPU memory kept free: a plan fits when it needs at most (1 - headroom) of it", kJobPlan,
             [](T& s, const F& f, const J& v, const S& n) { s.headroom_fraction = field_number(f, v, n); }),
      integer("dataset.rows", "--dataset-rows", 1, 1099511627776.0, "rows", "Rows in the dataset", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.dataset.rows = field_int(f, v, n); }),
      integer("dataset.mean_tokens_per_row", "--mean-tokens-per-row", 1, kMaxTokens, "tokens",
              "Mean tokens per row (default: the sequence length)", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.dataset.mean_tokens_per_row = field_int(f, v, n); }),
      integer("dataset.max_tokens_per_row", "--max-tokens-per-row", 1, kMaxTokens, "tokens",
              "The longest row: padded batches are planned for it (default: the sequence length)", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.dataset.max_tokens_per_row = field_int(f, v, n); }),
      integer("dataset.tokens", "--dataset-tokens", 1, 1125899906842624.0, "tokens",
              "Tokens in the dataset (instead of rows)", kJobPlan,
              [](T& s, const F& f, const J& v, const S& n) { s.dataset.tokens = field_int(f, v, n); }),
      text(FieldType::ignored, "dataset.description", "", "", "What the dataset is (free text)", kInJobFile),
      integer("steps", "--steps", 1, 1073741824, "optimizer steps", "Optimizer steps ftexec runs", kJobExec,
              [](T& s, const F& f, const J& v, const S& n) { s.steps = field_int(f, v, n); }),
      number("learning_rate", "--lr", 0, 10, true, false, "", "AdamW learning rate", kJobExec,
             [](T& s, const F& f, const J& v, const S& n) { s.learning_rate = field_number(f, v, n); }),
      integer("seed", "--seed", 0, 4611686018427387904.0, "", "Seed of the initial weights, adapters and synthetic data",
              kJobExec, [](T& s, const F& f, const J& v, const S& n) { s.seed = field_int(f, v, n); }),
      text(FieldType::text, "data", "--data", "", "synthetic | PATH.jsonl (input_ids per line) | PATH.bin (uint32 tokens)",
           kJobExec, [](T& s, const F& f, const J& v, const S& n) { s.data = field_text(f, v, n); }),
      text(FieldType::text, "device", "--device", "", "cpu | cuda | cuda:N", kJobExec,
           [](T& s, const F& f, const J& v, const S& n) {
             const std::string d = field_text(f, v, n);
             const bool cuda_n = d.rfind("cuda:", 0) == 0 && d.size() > 5 &&
                                 d.find_first_not_of("0123456789", 5) == std::string::npos && d.size() <= 8;
             if (d != "cpu" && d != "cuda" && !cuda_n) fail_input(n + ": '" + d + "' is not cpu, cuda or cuda:N");
             s.device = d;
           }),
      text(FieldType::ignored, "description", "", "", "What the job is (free text)", kInJobFile),
      text(FieldType::ignored, "published", "", "", "Reference measurements of the job (ignored by the estimate)",
           kInJobFile),

      // ftexec's run settings (flags only).
      integer("", "--warmup", 0, 1048576, "steps", "Steps left out of the timings", kFtexecFlag),
      integer("", "--threads", 0, 256, "threads", "Intra-op threads (0: all cores)", kFtexecFlag),
      number("", "--max-grad-norm", 0, 1e6, false, false, "", "Gradient clipping by global norm (0: off)", kFtexecFlag),
      number("", "--weight-decay", 0, 10, false, false, "",
             "AdamW decoupled weight decay, on all but biases and norm weights (HF Trainer's groups)", kFtexecFlag),
      number("", "--adam-beta1", 0, 1, false, true, "", "AdamW beta1 (HF TrainingArguments' adam_beta1)", kFtexecFlag),
      number("", "--adam-beta2", 0, 1, false, true, "", "AdamW beta2 (HF TrainingArguments' adam_beta2)", kFtexecFlag),
      number("", "--adam-eps", 0, 1, true, false, "", "AdamW epsilon (HF TrainingArguments' adam_epsilon)", kFtexecFlag),
      number("", "--cpu-memory-limit-gib", 0, 1048576, false, false, "GiB",
             "Fail CPU tensor allocations beyond this (0: no limit)", kFtexecFlag),
      integer("", "--nproc", 0, 256, "ranks", "Start N local ranks (0: none; under torchrun/srun/mpirun leave it out)",
              kFtexecFlag),
      number("", "--timeout-s", 0, 604800, true, false, "s", "Collective and rendezvous timeout", kFtexecFlag),
      integer("", "--checkpoint-every", 0, 1073741824, "steps",
              "Steps between checkpoints (0: one at the end, with --checkpoint-dir)", kFtexecFlag),
      integer("", "--keep-last", 1, 1073741824, "checkpoints",
              "Keep the newest N complete checkpoints, remove older ones (default: all)", kFtexecFlag),
      number("", "--bucket-mb", 0, 65536, true, false, "MiB", "DDP gradient bucket size", kFtexecFlag),
      number("", "--zero-bucket-elements", 1, 1099511627776.0, false, false, "elements", "ZeRO-1/2 reduce bucket",
             kFtexecFlag),
      integer("", "--shard-group-size", 0, 1048576, "ranks",
              "fsdp_hybrid: ranks per shard group (0: gpus_per_node of the --gpu hwdb entry)", kFtexecFlag),

      // ftplan check and sweep: the limits a plan is judged against.
      number("", "--max-hours", 0, 1e9, true, false, "hours", "Longest acceptable job", kCheckFlag | kSweepFlag),
      number("", "--max-cost", 0, 1e15, true, false, "USD", "Highest acceptable job cost", kCheckFlag | kSweepFlag),
      number("", "--max-memory-fraction", 0, 1, true, false, "fraction of GPU memory",
             "Largest acceptable share of GPU memory", kCheckFlag),
      number("", "--max-host-memory-fraction", 0, 1, true, false, "fraction of host memory",
             "Largest acceptable share of each node's host memory", kCheckFlag),
  };
  return table;
}

const Row& row_where(bool by_key, const std::string& name) {
  for (const Row& r : rows())
    if (name == (by_key ? r.spec.key : r.spec.flag) && !name.empty()) return r;
  throw std::logic_error("job_fields: no field " + name);
}

// Whole numbers in full ("1048576"), others as %g ("1e-04", "0.9").
std::string number_text(double v) {
  if (std::floor(v) == v && std::fabs(v) < 9007199254740992.0) return std::to_string(static_cast<int64_t>(v));
  std::ostringstream out;
  out << v;
  return out.str();
}

[[noreturn]] void fail_range(const FieldSpec& f, const std::string& name, const std::string& value) {
  fail_input(name + ": " + value + " is out of range " + field_range_text(f));
}

}  // namespace

const std::vector<FieldSpec>& field_table() {
  static const std::vector<FieldSpec> specs = [] {
    std::vector<FieldSpec> v;
    for (const Row& r : rows()) v.push_back(r.spec);
    return v;
  }();
  return specs;
}

const FieldSpec& field_by_key(const std::string& key) { return row_where(true, key).spec; }
const FieldSpec& field_by_flag(const std::string& flag) { return row_where(false, flag).spec; }

std::string field_range_text(const FieldSpec& f) {
  if (f.type == FieldType::choice) return f.choices;
  if (f.type != FieldType::integer && f.type != FieldType::number) return "";
  std::string r = std::string(f.min_open ? "(" : "[") + number_text(f.min) + ", " + number_text(f.max) +
                  (f.max_open ? ")" : "]");
  if (*f.unit) r += std::string(" ") + f.unit;
  return r;
}

int64_t field_int(const FieldSpec& f, const nlohmann::json& v, const std::string& name) {
  double x = 0;
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    fail_range(f, name, v.dump());
  } else if (v.is_number_integer()) {
    x = static_cast<double>(v.get<int64_t>());
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>()) {
    x = v.get<double>();
  } else {
    fail_input(name + ": expected a whole number, got " + v.dump());
  }
  if (x < f.min || x > f.max) fail_range(f, name, v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(x);
}

double field_number(const FieldSpec& f, const nlohmann::json& v, const std::string& name) {
  if (!v.is_number()) fail_input(name + ": expected a number, got " + v.dump());
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail_input(name + ": " + v.dump() + " is not a finite number");
  const bool low = f.min_open ? x <= f.min : x < f.min;
  const bool high = f.max_open ? x >= f.max : x > f.max;
  if (low || high) fail_range(f, name, number_text(x));
  return x;
}

std::string field_text(const FieldSpec&, const nlohmann::json& v, const std::string& name) {
  if (!v.is_string()) fail_input(name + ": expected a string, got " + v.dump());
  std::string s = v.get<std::string>();
  if (s.empty()) fail_input(name + ": empty");
  return s;
}

bool field_bool(const FieldSpec&, const nlohmann::json& v, const std::string& name) {
  if (!v.is_boolean()) fail_input(name + ": expected true or false, got " + v.dump());
  return v.get<bool>();
}

nlohmann::json field_value_from_text(const FieldSpec& f, const std::string& text, const std::string& name) {
  switch (f.type) {
    case FieldType::integer:
    case FieldType::number: {
      if (text.empty()) fail_input(name + ": empty");
      const char* begin = text.data();
      const char* end = begin + text.size();
      int64_t i = 0;
      const auto [ptr, ec] = std::from_chars(begin + (text[0] == '+' ? 1 : 0), end, i);
      if (ec == std::errc() && ptr == end) return i;
      // Not a plain integer: a decimal number, read whole (no trailing characters), finite.
      errno = 0;
      char* stop = nullptr;
      const double x = std::strtod(begin, &stop);
      if (stop != end || text.find_first_of("nNiIxX") != std::string::npos)
        fail_input(name + ": '" + text + "' is not a number");
      if (errno == ERANGE || !std::isfinite(x))
        fail_input(name + ": '" + text + "' is out of range " + field_range_text(f));
      return x;
    }
    case FieldType::boolean:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      fail_input(name + ": '" + text + "' is not true or false");
    default:
      return text;
  }
}

void apply_job_field(TrainingSetup& setup, const FieldSpec& f, const nlohmann::json& value, const std::string& name) {
  const Row& r = row_where(true, f.key);
  if (r.apply) r.apply(setup, f, value, name);
  setup.given.insert(f.key);
}

void apply_model(TrainingSetup& s, const ModelSpec& model) {
  if (s.lora.all_linear) {
    // PEFT's all-linear: every nn.Linear of the blocks (not bare parameters such as gpt-oss's fused experts).
    s.lora.targets.clear();
    for (const auto& lin : model_linears(model))
      if (lin.module && std::find(s.lora.targets.begin(), s.lora.targets.end(), lin.name) == s.lora.targets.end())
        s.lora.targets.push_back(lin.name);
  } else if (!s.given.count("lora.targets") && !model.default_lora_targets.empty()) {
    s.lora.targets = model.default_lora_targets;
  }
  if (model.quantized.active()) {
    if (s.method == Method::lora) s.method = Method::qlora;
    if (model.quantized.method == "bitsandbytes" && model.quantized.bits == 4)
      s.quantization.double_quant = model.quantized.double_quant;
  }
}

void validate_job(const TrainingSetup& s, const ModelSpec& model, const std::string& where) {
  std::vector<std::string> problems;
  if (s.method != Method::full) {
    const std::vector<std::string> linears = linear_names(model);
    std::string names;
    for (const auto& name : linears) names += (names.empty() ? "" : ", ") + name;
    if (!s.given.count("lora.targets") && !s.lora.all_linear && model.default_lora_targets.empty())
      problems.push_back("--lora-targets (lora.targets): model_type " + model.model_type +
                         " has no PEFT default target list (peft/utils/constants.py); give its modules (" + names +
                         ") or all-linear");
    else
      for (const auto& t : s.lora.targets)
        if (std::find(linears.begin(), linears.end(), t) == linears.end())
          problems.push_back("--lora-targets (lora.targets): '" + t + "' is not a linear of a " + model.model_type +
                             " block (" + names + ")");
  }
  if (model.moe.active()) {
    const double most = double(model.moe.num_experts) / double(model.moe.top_k);
    if (s.moe.imbalance_factor > most)
      problems.push_back("--moe-imbalance-factor (moe.imbalance_factor) " + std::to_string(s.moe.imbalance_factor) +
                         " exceeds num_experts / top_k = " + std::to_string(most) +
                         " (every token on the busiest rank's experts)");
    if (s.moe.capacity_factor && s.given.count("moe.imbalance_factor"))
      problems.push_back("--moe-capacity-factor (moe.capacity_factor) and --moe-imbalance-factor (moe.imbalance_factor): "
                         "capacity-limited routing pads every expert to its capacity; give one of them");
  } else if (s.given.count("moe.imbalance_factor") || s.moe.capacity_factor || s.moe.aux_loss.value_or(false)) {
    problems.push_back("--moe-imbalance-factor / --moe-capacity-factor / --moe-aux-loss (moe.*): " + model.name +
                       " has no experts");
  }
  if (s.method == Method::full && model.quantized.active())
    problems.push_back("--method (method) full: the base is stored quantized (quantization_config: " +
                       model.quantized.describe() + "); its weights cannot train: use lora");
  if (s.method != Method::full && s.lora.rank > model.hidden_size)
    problems.push_back("--lora-rank (lora.rank): " + std::to_string(s.lora.rank) + " exceeds hidden_size " +
                       std::to_string(model.hidden_size));
  // Tokens per micro-batch beyond 2^32 would overflow the byte counts: absurd.
  if (static_cast<double>(s.micro_batch.value_or(1)) * s.seq_len > 4294967296.0)
    problems.push_back("--micro-batch (micro_batch) " + std::to_string(s.micro_batch.value_or(1)) + " x --seq-len (seq_len) " +
                       std::to_string(s.seq_len) + " tokens per micro-batch is absurd (limit 2^32)");
  const bool pipeline = s.strategy && (*s.strategy == Strategy::mp || *s.strategy == Strategy::pipeline_gpipe ||
                                       *s.strategy == Strategy::pipeline_1f1b);
  if (pipeline && s.num_gpus > model.num_layers)
    problems.push_back("--gpus (gpus) " + std::to_string(s.num_gpus) + " > num_hidden_layers " +
                       std::to_string(model.num_layers) + ": " + to_string(*s.strategy) +
                       " needs at least one layer per stage");
  if (s.dataset.max_tokens_per_row > 0 && s.dataset.mean_tokens_per_row > s.dataset.max_tokens_per_row)
    problems.push_back("--max-tokens-per-row (dataset.max_tokens_per_row) " + std::to_string(s.dataset.max_tokens_per_row) +
                       " is below --mean-tokens-per-row (dataset.mean_tokens_per_row) " +
                       std::to_string(s.dataset.mean_tokens_per_row));
  if (s.dataset.mean_tokens_per_row > 0 && s.dataset.tokens > 0)
    problems.push_back("--mean-tokens-per-row (dataset.mean_tokens_per_row) and --dataset-tokens (dataset.tokens): "
                       "give rows with their mean length, or tokens, not both");
  if (problems.empty()) return;
  std::string msg = where.empty() ? "" : where + ": ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  fail_input(msg);
}

void apply_topology(TrainingSetup& s, HardwareSpec& hw) {
  if (s.gpus_per_node) {
    const int64_t in_topology = static_cast<int64_t>(std::count_if(
        hw.topology.vertices.begin(), hw.topology.vertices.end(), [](const TopologyVertex& v) { return v.kind == "gpu"; }));
    if (in_topology > 0 && *s.gpus_per_node > in_topology)
      fail_input("--gpus-per-node (gpus_per_node) " + std::to_string(*s.gpus_per_node) + " > the " + std::to_string(in_topology) +
                 " GPUs of " + hw.id + "'s node topology (hwdb/" + hw.id + ".json)");
    hw.gpus_per_node = *s.gpus_per_node;
    hw.nvlink_domain_size = std::min(hw.nvlink_domain_size, hw.gpus_per_node);
  }
  if (s.pcie_slot) {
    const std::string field = "--pcie-slot (pcie_slot)";
    const PcieSlot given = parse_pcie_slot(*s.pcie_slot, field);
    if (!hw.pcie_slot.stated())
      fail_input(field + ": hwdb/" + hw.id + ".json states no PCIe slot for the " + hw.name +
                 " (its host link is not PCIe)");
    // A PCIe link trains at the lower generation and the fewer lanes of the card and the slot: a 4.0 x16 card
    // in a 5.0 x8 slot runs 4.0 x8.
    const PcieSlot slot{std::min(given.generation, hw.pcie_slot.generation), std::min(given.lanes, hw.pcie_slot.lanes)};
    const double scale = slot.bandwidth_bytes_per_s() / hw.pcie_slot.bandwidth_bytes_per_s();
    // Every PCIe figure of the entry was written for the card's own interface; a narrower slot carries
    // the same fraction of it (host-staged and peer-to-peer traffic alike ride the slot's lanes).
    const auto is_pcie = [](const std::string& kind) { return kind.rfind("pcie", 0) == 0; };
    hw.pcie_host_bandwidth_bytes_per_s *= scale;
    if (is_pcie(hw.intra_node_link)) hw.intra_node_bandwidth_bytes_per_s *= scale;
    for (TopologyLink& l : hw.topology.links)
      if (is_pcie(l.kind)) l.bandwidth_bytes_per_s *= scale;
    hw.pcie_link = slot;
    hw.pcie_slot_given = given;
  }
  if (s.nodes) {
    const int64_t gpus = *s.nodes * hw.gpus_per_node;
    if (s.given.count("gpus") && s.num_gpus != gpus)
      fail_input("--gpus (gpus) " + std::to_string(s.num_gpus) + " != --nodes (nodes) " + std::to_string(*s.nodes) + " x " +
                 std::to_string(hw.gpus_per_node) + " GPUs per node = " + std::to_string(gpus));
    s.num_gpus = gpus;
  }
}

void validate_layout(const TrainingSetup& s, const ModelSpec& model, const HardwareSpec& hw, const std::string& where) {
  std::vector<std::string> problems;
  const Attention attention = s.attention.value_or(Attention::fused);
  if (s.parallel) {
    for (const auto& p : parallelism_problems(*s.parallel, model, s, s.num_gpus, attention)) problems.push_back("--parallel: " + p);
  } else if (s.strategy && *s.strategy != Strategy::single) {
    const Parallelism p = preset(*s.strategy, s.num_gpus, hw.gpus_per_node);
    if (*s.strategy == Strategy::fsdp_hybrid && s.num_gpus > hw.gpus_per_node && s.num_gpus % hw.gpus_per_node != 0)
      problems.push_back("--strategy fsdp_hybrid on --gpus " + std::to_string(s.num_gpus) + ": it shards over whole nodes of " +
                         std::to_string(hw.gpus_per_node) + " GPUs (" + hw.id + "), so gpus must be a multiple of " +
                         std::to_string(hw.gpus_per_node));
    else
      for (const auto& q : parallelism_problems(p, model, s, s.num_gpus, attention))
        problems.push_back("--strategy " + to_string(*s.strategy) + ": " + q);
  }
  if (problems.empty()) return;
  std::string msg = where.empty() ? "" : where + ": ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  fail_input(msg);
}

std::vector<std::string> exec_layout_problems(const Parallelism& p) {
  // Only what a valid layout (parallelism_problems) asks that ftexec cannot do yet.
  std::vector<std::string> out;
  auto d = [](const char* key, int64_t v) { return std::string(key) + "(" + std::to_string(v) + ")"; };
  // Context parallelism (executor/context_parallel.h): K and V all-gathered; the ring is not implemented.
  if (p.cp > 1 && p.cp_mode != ContextParallel::all_gather)
    out.push_back("cp_mode=" + to_string(p.cp_mode) + " with " + d("cp", p.cp) +
                  ": ftexec exchanges K and V by all-gather (cp_mode=all_gather), ring attention is not implemented");
  if (p.cp > 1 && p.pipelined()) out.push_back(d("cp", p.cp) + " with " + d("pp", p.pp) + ": ftexec runs no pipeline under context parallelism yet");
  if (p.pipelined()) {
    if (p.sharding != Sharding::none)
      out.push_back(d("pp", p.pp) + " with shard=" + sharding_name(p) +
                    ": ftexec replicates pipeline stages over data parallelism (dp_replicate), not sharded yet");
    if (p.schedule == PipelineSchedule::interleaved_1f1b || p.virtual_stages > 1)
      out.push_back("schedule=" + to_string(p.schedule) + " with " + d("virtual_stages", p.virtual_stages) +
                    ": ftexec runs the naive, gpipe and 1f1b schedules, not interleaved 1F1B yet");
    return out;
  }
  if (p.sharding != Sharding::none && p.offload_optimizer && p.zero_stage < 2)
    out.push_back("offload=optimizer at zero_stage 1: ftexec offloads at stage 2 (zero2_offload) or 3 (zero3_offload)");
  if (p.shards_params() && p.offload_optimizer && !p.offload_params)
    out.push_back("offload=optimizer at zero_stage 3: ftexec offloads stage 3's parameters with the optimizer states "
                  "(offload=optimizer+params)");
  return out;
}

std::vector<std::string> exec_problems(const TrainingSetup& s, const ModelSpec& model) {
  std::vector<std::string> problems;
  if (s.parallel) {
    // (Against its own GPU count: the ranks started decide the world, checked when they start.)
    const Parallelism& p = *s.parallel;
    for (const auto& q : parallelism_problems(p, model, s, p.gpus(), s.attention.value_or(Attention::eager)))
      problems.push_back("--parallel (parallel) " + to_string(p) + ": " + q);
    for (const auto& q : exec_layout_problems(p)) problems.push_back("--parallel (parallel) " + to_string(p) + ": " + q);
    // What ftexec's tensor parallelism (executor/tensor_parallel.h) splits, beyond the planner's checks.
    if (p.tp > 1) {
      const std::string f = "--parallel (parallel) " + to_string(p) + ": tp(" + std::to_string(p.tp) + ")";
      if (model.num_kv_heads % p.tp != 0)
        problems.push_back(f + " does not divide num_key_value_heads(" + std::to_string(model.num_kv_heads) +
                           "): ftexec splits KV heads and does not replicate them");
      if (model.vocab_size % p.tp != 0)
        problems.push_back(f + " does not divide vocab_size(" + std::to_string(model.vocab_size) +
                           "): the embedding and head are split by vocabulary");
      if (model.moe.active()) problems.push_back(f + ": ftexec's tensor parallelism splits dense Llama blocks, not experts");
      if (model.mla.active())
        problems.push_back(f + ": multi-head latent attention (kv_lora_rank): ftexec's tensor parallelism splits q/k/v heads, "
                           "not q_a/kv_a latents");
      if (model.qk_norm != QkNorm::none) problems.push_back(f + ": ftexec's tensor parallelism has no q/k norms");
      // The tensor-parallel block (executor/tensor_parallel.cpp) is Llama's: anything else is refused by its field.
      if (model.fused_qkv || model.fused_gate_up)
        problems.push_back(f + ": fused_qkv/fused_gate_up (" + model.model_type +
                           "'s qkv_proj, gate_up_proj): ftexec's tensor parallelism splits separate q/k/v and gate/up");
      if (model.norm_post_attention || model.norm_post_mlp || !model.norm_pre_attention || !model.norm_pre_mlp ||
          model.norm_scale_fp32 || model.norm_cast_after_scale)
        problems.push_back(f + ": the " + model.model_type + " block's norms (norm_post_attention, norm_post_mlp, "
                           "norm_scale_fp32): ftexec's tensor parallelism runs the Llama block's two RMSNorms");
      if (model.scaled_embedding || model.attn_logit_softcapping > 0 || model.final_logit_softcapping > 0 ||
          model.query_pre_attn_scalar > 0 || model.hidden_act != "silu")
        problems.push_back(f + ": " + model.model_type + "'s scaled_embedding, soft-capping, query_pre_attn_scalar or "
                           "hidden_act " + model.hidden_act + ": ftexec's tensor parallelism runs the Llama block");
      if (s.method == Method::qlora) problems.push_back(f + " with --method (method) qlora: ftexec splits dense weights only");
      if (s.method != Method::full && s.lora.dropout > 0)
        problems.push_back(f + " with --lora-dropout (lora.dropout) " + std::to_string(s.lora.dropout) +
                           ": ftexec runs LoRA dropout 0 under tensor parallelism");
      if (p.sequence_parallel && s.seq_len % (p.tp * p.cp) != 0)
        problems.push_back(f + " with sp=1: --seq-len (seq_len) " + std::to_string(s.seq_len) + " does not divide by tp" +
                           (p.cp > 1 ? " x cp(" + std::to_string(p.cp) + ")" : std::string()));
    }
    if (p.cp > 1) {
      const std::string f = "--parallel (parallel) " + to_string(p) + ": cp(" + std::to_string(p.cp) + ")";
      if (model.moe.active()) problems.push_back(f + ": ftexec's context parallelism runs dense Llama blocks, not experts");
      if (model.attn_logit_softcapping > 0)
        problems.push_back(f + ": attn_logit_softcapping " + std::to_string(model.attn_logit_softcapping) +
                           ": ftexec's context-parallel attention does not soft-cap the scores");
      if (s.method != Method::full && s.lora.dropout > 0)
        problems.push_back(f + " with --lora-dropout (lora.dropout) " + std::to_string(s.lora.dropout) +
                           ": ftexec runs LoRA dropout 0 under context parallelism");
    }
  }
  if (s.precision == Precision::mixed_fp32_grads)
    problems.push_back("--precision (precision) mixed-fp32-grads: ftexec runs fp32, bf16 and mixed");
  if (s.optimizer != Optimizer::adamw)
    problems.push_back("--optimizer (optimizer) " + to_string(s.optimizer) + ": ftexec implements adamw only");
  if (s.paged_optimizer) problems.push_back("--paged-optimizer (paged_optimizer): ftexec has no paged optimizer");
  if (s.activation_offload) problems.push_back("--activation-offload (activation_offload): ftexec keeps activations on the device");
  if (s.optimizer_in_backward)
    problems.push_back("--optimizer-in-backward (optimizer_in_backward): ftexec steps the optimizer after backward");
  if (s.checkpointing && *s.checkpointing == Checkpointing::selective)
    problems.push_back("--checkpointing (checkpointing) selective: ftexec checkpoints whole blocks (none or full)");
  if (s.compile) problems.push_back("--compile (compile): ftexec does not compile");
  const ModelFamily* family = find_model_family(model.model_type);
  const ModelFamily* wrapper = model.wrapper_type.empty() ? nullptr : find_model_family(model.wrapper_type);
  if (!family || !family->executor_runs || (wrapper && !wrapper->executor_runs))
    problems.push_back("--model (model) model_type " + (model.wrapper_type.empty() ? model.model_type : model.wrapper_type) +
                       ": ftexec trains " + executor_family_list() + " (not yet this family)");
  if (model.moe.active()) {
    if (s.method == Method::qlora)
      problems.push_back("--method (method) qlora: ftexec quantises dense block linears to NF4, not a mixture of "
                         "experts' stacked experts");
    if (s.moe.capacity_factor)
      problems.push_back("--moe-capacity-factor (moe.capacity_factor): ftexec routes dropless (every expert takes all "
                         "its tokens, padded to the busiest expert's count)");
  }
  if (model.mla.active() && s.attention == Attention::fused)
    problems.push_back("--attention (attention) fused: ftexec runs multi-head latent attention (" + model.model_type +
                       ") eager only");
  if (model.quantized.active() && model.quantized.method == "mxfp4")
    // gpt-oss's hub config: ftexec trains the dequantised model (transformers' Mxfp4Config(dequantize=True)),
    // while the planner counts this config's experts as stored in mxfp4, so the two would not describe one job.
    problems.push_back("--model (model): quantization_config mxfp4: ftexec trains gpt-oss dequantised (--load-weights "
                       "reads the mxfp4 *_blocks / *_scales and dequantises them); remove quantization_config from the "
                       "config so that the plan counts the experts as ftexec holds them");
  else if (model.quantized.active())
    problems.push_back("--model (model): quantization_config " + model.quantized.method +
                       ": ftexec quantises to NF4 itself and does not load a pre-quantized checkpoint");
  if (s.attention == Attention::fused && model.attention_sinks)  // GptOssPreTrainedModel._supports_sdpa = False
    problems.push_back("--attention (attention) fused: the attention sinks of model_type " + model.model_type +
                       " need eager attention (transformers' gpt-oss has no SDPA path); use eager");
  // Eager attention masks the sliding window and soft-caps the scores; the fused kernel is causal only.
  if (s.attention == Attention::fused && model.sliding_window > 0 && s.seq_len > model.sliding_window)
    problems.push_back("--attention (attention) fused with --seq-len (seq_len) " + std::to_string(s.seq_len) +
                       " above the model's sliding_window (" + std::to_string(model.sliding_window) +
                       "): ftexec's fused attention is causal only; use eager");
  if (s.attention == Attention::fused && model.attn_logit_softcapping > 0)
    problems.push_back("--attention (attention) fused: attn_logit_softcapping " +
                       std::to_string(model.attn_logit_softcapping) + ": ftexec's fused attention does not soft-cap; use eager");
  if (model.partial_rotary_factor != 1.0)
    problems.push_back("--model (model) " + model.name + ": partial_rotary_factor " +
                       std::to_string(model.partial_rotary_factor) + ": ftexec applies RoPE to the whole head_dim");
  if (model.max_position_embeddings > 0 && s.seq_len > model.max_position_embeddings && model.rope_scaling.type.empty())
    problems.push_back("--seq-len (seq_len) " + std::to_string(s.seq_len) + " exceeds the model's max_position_embeddings (" +
                       std::to_string(model.max_position_embeddings) + ")");
  return problems;
}

}  // namespace ftplan
