#include "executor/dist_run.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <ATen/Parallel.h>

#include "executor/checkpoint.h"
#include "executor/comm.h"
#include "executor/lora.h"
#include "executor/memory_meter.h"
#include "executor/run_job.h"
#include "executor/safetensors.h"
#include "executor/save_folder.h"
#include "executor/strategy.h"
#include "executor/torch_compat.h"
#include "planner/compute_model.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"

namespace ftexec {
namespace fs = std::filesystem;
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- fault injection ---------------------------------------------------------------------------
void maybe_inject_fault(const std::string& spec, int rank, int64_t step) {
  if (spec.empty()) return;
  std::stringstream all(spec);
  std::string one;
  while (std::getline(all, one, ',')) {
    int r = -1;
    long long s = -1;
    char what[16] = {0};
    if (std::sscanf(one.c_str(), "%d:%lld:%15s", &r, &s, what) != 3)
      ftplan::fail_input("--fault-inject \"" + one + "\": expected RANK:STEP:kill|hang|exit|throw");
    if (r != rank || s != step) continue;
    const std::string w = what;
    std::cerr << "ftexec: rank " << rank << ": injected fault \"" << w << "\" at step " << step << std::endl;
    if (w == "kill") ::raise(SIGKILL);
    if (w == "exit") std::_Exit(7);
    if (w == "throw") throw RuntimeFailure("rank " + std::to_string(rank) + ": injected failure at step " + std::to_string(step));
    if (w == "hang")
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    ftplan::fail_input("--fault-inject: unknown fault \"" + w + "\" (kill, hang, exit, throw)");
  }
}

// ---- checkpoints -------------------------------------------------------------------------------
std::string hex_of(const at::Tensor& bytes) {
  static const char* d = "0123456789abcdef";
  const at::Tensor b = bytes.contiguous();
  const uint8_t* p = b.data_ptr<uint8_t>();
  std::string s;
  for (int64_t i = 0; i < b.numel(); ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}

at::Tensor bytes_of_hex(const std::string& s) {
  at::Tensor t = at::empty({int64_t(s.size() / 2)}, at::kByte);
  uint8_t* p = t.data_ptr<uint8_t>();
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < s.size(); i += 2) p[i / 2] = uint8_t(v(s[i]) << 4 | v(s[i + 1]));
  return t;
}

struct Position {
  int64_t step = 0;            // optimizer steps done
  int64_t micro_batches = 0;   // drawn from the data source
};

// Ends every rank with the same AgreedInputError when any rank found a problem on its own (its
// checkpoint files, say), and returns when none did. Each rank checks first and only then reaches
// this one collective, so a bad shard on rank 1 never leaves rank 0 waiting in a later collective;
// the message of the lowest failing rank is broadcast so that every rank reports that one.
void agree_or_fail(Comm& comm, const std::string& problem) {
  const int r = comm.rank(), n = comm.world();
  const double first = comm.all_reduce_scalar(problem.empty() ? 0.0 : double(n - r), /*max=*/true);
  if (first <= 0) return;
  const int bad = n - static_cast<int>(first);
  const double length = comm.all_reduce_scalar(r == bad ? double(problem.size()) : 0.0);
  at::Tensor text = at::zeros({std::max<int64_t>(1, static_cast<int64_t>(length))}, at::kByte);
  if (r == bad) std::memcpy(text.data_ptr<uint8_t>(), problem.data(), problem.size());
  comm.broadcast(text, bad);
  throw AgreedInputError(std::string(reinterpret_cast<const char*>(text.data_ptr<uint8_t>()), size_t(length)));
}

std::string rank_file(int r, const char* ext) { return "rank-" + std::to_string(r) + ext; }

// Writes this rank's files of the checkpoint after pos.step steps; rank 0 commits it (manifest,
// latest) once every rank's files are in place and checksummed, then rotates (--keep-last).
void save_checkpoint(const std::string& dir, const Position& pos, DistStrategy& strategy, Comm& comm,
                     const std::string& model, const nlohmann::json& layout, int64_t keep_last) {
  const std::string sub = "step-" + std::to_string(pos.step);
  const fs::path path = fs::path(dir) / sub;
  const int r = comm.rank();
  const std::string where = "rank " + std::to_string(r) + ": checkpoint " + path.string() + ": ";
  // A folder of this step can only be left over from a run that stopped while writing it (a fresh
  // run refuses a DIR with complete checkpoints, a resumed one continues after the newest): rank 0
  // clears it before anyone writes, so no stale file or manifest mixes in.
  if (r == 0) {
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) throw RuntimeFailure(where + "cannot clear the folder (" + ec.message() + ")");
  }
  comm.barrier();
  std::map<std::string, FileDigest> mine;
  try {
    fs::create_directories(path);
    at::NoGradGuard no_grad;
    if (!strategy.checkpoint_replicated() || r == 0) {
      std::vector<at::Tensor> keep;
      std::vector<SafetensorsEntry> entries;
      for (auto& [name, t] : strategy.checkpoint_tensors()) {
        keep.push_back(t.detach().contiguous().cpu());
        entries.push_back(safetensors_entry(name, keep.back()));
      }
      write_safetensors((path / rank_file(r, ".safetensors")).string(), entries);
    }
    auto gen = at::globalContext().defaultGenerator(at::kCPU);
    at::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    const nlohmann::json state = {{"step", pos.step},
                                  {"micro_batches", pos.micro_batches},
                                  {"optimizer_steps", strategy.optimizer_steps()},
                                  {"rng_cpu", hex_of(rng)}};
    write_file_durably((path / rank_file(r, ".json")).string(), state.dump(1) + "\n");
    // Checksums of the files as they are on disk, computed by the rank that wrote them.
    for (const char* ext : {".safetensors", ".json"})
      if (fs::exists(path / rank_file(r, ext))) mine[rank_file(r, ext)] = file_digest((path / rank_file(r, ext)).string());
  } catch (const std::exception& e) {
    throw RuntimeFailure(where + e.what());
  }
  nlohmann::json digests = nlohmann::json::object();
  for (const auto& [name, d] : mine) digests[name] = {d.bytes, d.crc32};
  comm.store_set("checkpoint/" + sub + "/" + std::to_string(r), digests.dump());
  comm.barrier();  // every rank's files are in place and their digests in the store
  if (r == 0) {
    std::map<std::string, FileDigest> files;
    for (int k = 0; k < comm.world(); ++k) {
      const auto j = nlohmann::json::parse(comm.store_get("checkpoint/" + sub + "/" + std::to_string(k)));
      for (auto it = j.begin(); it != j.end(); ++it)
        files[it.key()] = {(*it)[0].get<int64_t>(), (*it)[1].get<uint32_t>()};
    }
    try {
      // The commit point: written last, atomically; then latest names it.
      const auto manifest = checkpoint_manifest(pos.step, comm.world(), model, layout, files);
      write_file_durably((path / "manifest.json").string(), manifest.dump(1) + "\n");
      write_file_durably((fs::path(dir) / "latest").string(), sub + "\n");
    } catch (const std::exception& e) {
      throw RuntimeFailure(where + e.what());
    }
    std::vector<std::string> failed;
    checkpoint_rotate(dir, keep_last, &failed);
    for (const auto& f : failed) std::cerr << "ftexec: --keep-last: could not remove " << f << "\n";
  }
  comm.barrier();
}

// Chooses the checkpoint, verifies it against this run and loads this rank's part of it. Every
// problem found on any rank becomes the same AgreedInputError on every rank before the first
// collective that depends on the loaded state (after_load's all-gathers).
Position load_checkpoint(const std::string& dir, DistStrategy& strategy, Comm& comm, const nlohmann::json& layout) {
  const int r = comm.rank();
  const int owner = strategy.checkpoint_replicated() ? 0 : r;
  Position pos;
  CheckpointChoice choice;
  std::string problem;
  try {
    choice = checkpoint_choose(dir);
    const std::string& path = choice.folder.path;
    const std::string manifest_path = (fs::path(path) / "manifest.json").string();
    const auto manifest = ftplan::read_json_file(manifest_path);
    const auto differences = checkpoint_layout_differences(manifest, choice.folder.step, comm.world(), layout);
    if (!differences.empty()) {
      std::string msg;
      for (const auto& d : differences) msg += (msg.empty() ? "" : "; ") + d;
      ftplan::fail_input("--resume: " + manifest_path + " does not match this run: " + msg);
    }
    // Every file this rank reads, checked before it is parsed.
    for (const std::string& file : {rank_file(owner, ".safetensors"), rank_file(r, ".json")}) {
      const std::string p = checkpoint_file_problem(manifest, path, file);
      if (!p.empty()) ftplan::fail_input("--resume: " + p);
    }
    const auto state = ftplan::read_json_file((fs::path(path) / rank_file(r, ".json")).string());
    SafetensorsFile file((fs::path(path) / rank_file(owner, ".safetensors")).string());
    at::NoGradGuard no_grad;
    for (auto& [name, t] : strategy.checkpoint_tensors()) {
      const SafetensorsEntry* e = file.find(name);
      if (!e) ftplan::fail_input(file.path() + ": no tensor \"" + name + "\"");
      at::Tensor src = tensor_view_of(*e);
      if (src.sizes() != t.sizes())
        ftplan::fail_input(file.path() + ": \"" + name + "\" has shape " + shape_to_string(src.sizes()) + ", expected " +
                           shape_to_string(t.sizes()));
      at::Tensor(t).copy_(src);
    }
    strategy.set_optimizer_steps(state.at("optimizer_steps").get<int64_t>());
    auto gen = at::globalContext().defaultGenerator(at::kCPU);
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(bytes_of_hex(state.at("rng_cpu").get<std::string>()));
    }
    pos = {state.at("step").get<int64_t>(), state.at("micro_batches").get<int64_t>()};
  } catch (const std::exception& e) {  // InputErrors; a JSON field of the wrong type; a LibTorch error
    problem = e.what();
    if (problem.rfind("--resume", 0) != 0) problem = "--resume: " + problem;
  }
  agree_or_fail(comm, problem);
  // Every rank chose on its own; on a file system shared between nodes they must have seen the same.
  const double newest = comm.all_reduce_scalar(double(choice.folder.step), true);
  const double oldest = -comm.all_reduce_scalar(-double(choice.folder.step), true);
  if (newest != oldest)
    throw AgreedInputError("--resume: the ranks found different newest complete checkpoints in " + dir + " (step-" +
                           std::to_string(int64_t(oldest)) + " to step-" + std::to_string(int64_t(newest)) +
                           "): every rank must see the same --checkpoint-dir");
  if (r == 0 && !choice.note.empty()) std::cerr << "ftexec: --resume: " << choice.note << std::endl;
  strategy.after_load();
  return pos;
}

// What decides what each rank's checkpoint files hold and how a resumed run continues from them:
// compared field by field on --resume (executor/checkpoint.h).
nlohmann::json checkpoint_layout(const ExecJob& job, const std::string& strategy_name, const ftplan::Parallelism& p) {
  const auto& s = job.setup;
  nlohmann::json layout = {{"strategy", strategy_name},
                           {"method", ftplan::to_string(s.method)},
                           {"precision", ftplan::to_string(s.precision)},
                           {"micro_batch", s.micro_batch_or(1)},
                           {"grad_accum", s.grad_accum},
                           {"seed", s.seed},                      // the frozen weights and the data
                           {"load_weights", job.load_weights},    // the frozen weights
                           {"model_config_crc32", crc32_hex(ftplan::read_json_file(job.model_config_path).dump())}};
  if (s.method != ftplan::Method::full)
    layout["lora"] = {{"rank", s.lora.rank}, {"alpha", s.lora.alpha}, {"targets", s.lora.targets}};
  // HSDP: which ranks hold the same shard.
  if (p.shards_params() && p.dp_replicate > 1) layout["shard_group_size"] = p.dp_shard;
  return layout;
}

nlohmann::json comm_json(const CommStats& s, double steps, bool calls) {
  nlohmann::json j = nlohmann::json::object();
  for (CommOp op : {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather, CommOp::send}) {
    const auto& c = s.ops[static_cast<int>(op)];
    j[comm_op_name(op)] = calls ? nlohmann::json(double(c.calls) / steps) : nlohmann::json(c.wire_bytes / steps);
  }
  return j;
}

// Every communicator's counters together: the world's and, on a device mesh, each group's.
CommStats total_stats(const Comm& world, const DistStrategy* strategy) {
  CommStats t = world.stats();
  if (!strategy) return t;
  for (const auto& [name, g] : strategy->group_stats()) {
    if (name == "world") continue;
    for (int i = 0; i < kCommOps; ++i) {
      t.ops[i].calls += g.ops[i].calls;
      t.ops[i].wire_bytes += g.ops[i].wire_bytes;
      t.ops[i].padding_bytes += g.ops[i].padding_bytes;
    }
    t.time_s += g.time_s;
  }
  return t;
}

// Payload bytes by process group (the planner's dimensions): a mesh's groups, or, without one, the
// world communicator as the one group the layout has ("pp" for a pipeline, "dp" otherwise).
nlohmann::json group_bytes_json(const CommStats& world, const std::vector<std::pair<std::string, CommStats>>& groups,
                                bool pipelined, double steps) {
  nlohmann::json j = nlohmann::json::object();
  if (groups.empty()) {
    j[pipelined ? "pp" : "dp"] = world.payload_bytes() / steps;
    return j;
  }
  for (const auto& [name, g] : groups)
    if (name != "world") j[name] = g.payload_bytes() / steps;
  return j;
}

void print_progress(int64_t step, int64_t steps, double loss, double step_s) {
  const int width = 30;
  const int filled = static_cast<int>(width * step / steps);
  std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.3f s/step", std::string(filled, '#').c_str(),
              std::string(width - filled, ' ').c_str(), static_cast<long long>(step), static_cast<long long>(steps),
              loss, step_s);
  if (step == steps) std::printf("\n");
  std::fflush(stdout);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// ---- --save ------------------------------------------------------------------------------------
// What --save writes: the adapter as PEFT saves it (LoRA and QLoRA: adapter_model.safetensors with
// names base_model.model.<name>, adapter_config.json) or the full weights as Hugging Face saves them
// (model.safetensors, config.json), in the parameters' dtype. The file's layout (every name, dtype
// and shape) is read from the whole model before a strategy shards or splits it.
struct SavePlan {
  bool adapter = false;
  std::string prefix;  // a multimodal wrapper's prefix of its decoder's names (checkpoint_name), else ""
  std::vector<SafetensorsWriter::Tensor> layout;
  std::vector<std::pair<std::string, at::Tensor>> buffers;  // written by rank 0 from its own copy
  std::string saved_name(const std::string& model_name) const {
    return adapter ? "base_model.model." + prefix + model_name : prefix + model_name;
  }
};

SavePlan save_plan(const LlamaModel& model, ftplan::Method method) {
  SavePlan plan;
  plan.adapter = method != ftplan::Method::full;
  plan.prefix = model.spec.text_checkpoint_prefix;
  // (Stacked expert tensors as one tensor per expert, the names a Hugging Face checkpoint holds; the adapters'
  // names are PEFT's, prefixed already.)
  for (const auto& [name, t] : checkpoint_tensors(plan.adapter ? lora_named_parameters(model) : llama_named_parameters(model)))
    plan.layout.push_back({plan.adapter ? name : plan.prefix + name, safetensors_dtype_of(t.scalar_type()), t.sizes().vec()});
  // The buffers (DeepSeek-V3's e_score_correction_bias): never trained or sharded, whole on every rank; rank 0
  // writes its own.
  if (!plan.adapter)
    for (const auto& [name, t] : llama_named_buffers(model)) {
      plan.layout.push_back({plan.prefix + name, safetensors_dtype_of(t.scalar_type()), t.sizes().vec()});
      plan.buffers.emplace_back(name, t);
    }
  return plan;
}

// Every rank calls it together; rank 0 writes the files as the strategy hands it each unit
// (DistStrategy::gather_trainable) and returns what it wrote, the others null.
nlohmann::json save_trained(const ExecJob& job, const SavePlan& plan, DistStrategy& strategy, Comm& comm) {
  const int r = comm.rank();
  const std::string where = "rank " + std::to_string(r) + ": --save " + job.save_dir + ": ";
  const std::string weights = plan.adapter ? "adapter_model.safetensors" : "model.safetensors";
  std::unique_ptr<SaveFolder> folder;
  std::unique_ptr<SafetensorsWriter> writer;
  std::string problem;
  if (r == 0) {
    try {
      folder = std::make_unique<SaveFolder>(job.save_dir);
      writer = std::make_unique<SafetensorsWriter>(folder->file(weights), plan.layout);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  // Every rank learns whether rank 0 can write before any unit is gathered for it.
  if (comm.all_reduce_scalar(problem.empty() ? 0.0 : 1.0, /*max=*/true) > 0)
    throw RuntimeFailure(r == 0 ? "rank 0: " + problem : where + "rank 0 could not start writing");
  int64_t tensors = 0;
  try {
    strategy.gather_trainable([&](const std::vector<std::pair<std::string, at::Tensor>>& unit) {
      for (const auto& [name, t] : checkpoint_tensors(unit)) {
        const at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
        writer->write(plan.saved_name(name), safetensors_dtype_of(cpu.scalar_type()), cpu.data_ptr(), cpu.nbytes());
        ++tensors;
      }
    });
    if (r != 0) return nullptr;
    for (const auto& [name, t] : plan.buffers) {
      const at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
      writer->write(plan.saved_name(name), safetensors_dtype_of(cpu.scalar_type()), cpu.data_ptr(), cpu.nbytes());
      ++tensors;
    }
    writer->finish();
    const std::string config = plan.adapter ? "adapter_config.json" : "config.json";
    write_file_durably(folder->file(config), plan.adapter ? peft_adapter_config(job.setup.lora, job.setup.model)
                                                          : read_text(job.model_config_path));
    folder->commit();
    return {{"dir", job.save_dir},
            {"format", plan.adapter ? "peft" : "hf-safetensors"},
            {"files", folder->files()},
            {"tensors", tensors},
            {"weights_bytes", writer->file_bytes()}};
  } catch (const RuntimeFailure&) {
    throw;
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeFailure(where + e.what());
  }
}

}  // namespace

nlohmann::json run_rank(const ExecJob& job, const DistEnv& env, const DistOptions& o) {
  const auto& s = job.setup;
  // The layout every strategy class reads (InputError naming the operands when it does not fit the world).
  const ftplan::Parallelism layout = exec_parallelism(job, env.world, o.shard_group_size);
  const std::string strategy_name = s.strategy && !s.parallel ? ftplan::to_string(*s.strategy) : ftplan::name(layout);
  const bool cuda = job.device.rfind("cuda", 0) == 0;
  // CUDA: one GPU per local rank and NCCL; ranks beyond the visible GPUs share them round robin
  // (NCCL itself refuses two ranks of one communicator on one GPU: "Duplicate GPU detected"). One
  // process uses the device it was given.
  const std::string device =
      cuda && env.world > 1 ? "cuda:" + std::to_string(env.local_rank % std::max(1, compat::cuda_device_count())) : job.device;
  const std::string backend = resolve_backend(o.backend, cuda);
  if (cuda && !at::hasCUDA())
    ftplan::fail_input("--device " + job.device + ": this ftexec was built against a libtorch without CUDA (" +
                       compat::torch_version() + ") or no GPU is visible");
  if (cuda && backend == "gloo" && env.world > 1)
    ftplan::fail_input("--backend gloo with --device cuda: the ring collectives use send/recv, which Gloo runs on CPU "
                       "tensors only; use --backend nccl");
  cpu_meter_install();
  cpu_meter_set_limit(job.cpu_memory_limit_bytes);
  set_rank_threads(job.threads, env);

  ModelOptions mo;
  mo.dtype = s.precision == ftplan::Precision::fp32 ? at::kFloat : at::kBFloat16;
  mo.device = at::Device(device);
  mo.checkpointing = s.checkpointing == ftplan::Checkpointing::full;
  mo.use_sdpa = s.attention == ftplan::Attention::fused && compat::kHasSdpa;
  mo.moe_aux_loss = s.moe.aux_loss;
  nlohmann::json notes = nlohmann::json::array();
  if (layout.cp > 1)
    notes.push_back("context parallelism (cp " + std::to_string(layout.cp) + ", cp_mode all_gather): each rank holds a contiguous " +
                    "1/cp of every sequence; attention over K and V all-gathered over the cp group, gathered again in backward " +
                    "and their gradients reduce-scattered (executor/context_parallel.h), not the SDPA kernel");
  else if (s.attention == ftplan::Attention::fused && !compat::kHasSdpa)
    notes.push_back(std::string("attention fused requested, but libtorch ") + compat::torch_version() +
                    " has no SDPA: ran eager attention");
  if (layout.shards_params() && layout.dp_replicate > 1)
    notes.push_back("shard groups of " + std::to_string(layout.dp_shard) + " ranks (dp_shard), gradient shards all-reduced across " +
                    std::to_string(layout.dp_replicate) + " replica groups (dp_replicate) once per step");

  // A plan that cannot fit the device is bad input, reported before anything runs.
  if (job.plan && job.plan->contains("predicted")) {
    const auto& pred = (*job.plan)["predicted"];
    int64_t need = 0;
    if (pred.is_object() && pred.contains("memory_per_gpu_bytes") && pred["memory_per_gpu_bytes"].is_object() &&
        pred["memory_per_gpu_bytes"].contains("total")) {
      const auto& total = pred["memory_per_gpu_bytes"]["total"];
      if (!total.is_number() || !std::isfinite(total.get<double>()) || total.get<double>() < 0 || total.get<double>() > 9e18)
        ftplan::fail_input("plan: predicted.memory_per_gpu_bytes.total: " + total.dump() + " is not a byte count");
      need = static_cast<int64_t>(total.get<double>());
    }
    int64_t have = job.cpu_memory_limit_bytes;
    if (cuda) have = compat::cuda_memory_stats(mo.device.index() < 0 ? 0 : mo.device.index()).device_total_bytes;
    if (have > 0 && need > have)
      ftplan::fail_input("the plan needs " + std::to_string(need / double(1 << 30)) + " GiB per device; " + device +
                         " has " + std::to_string(have / double(1 << 30)) + " GiB");
  }

  std::unique_ptr<Comm> comm = Comm::connect(comm_options(env, o.timeout_s, backend));
  const int rank = comm->rank();

  const int64_t micro_batch = s.micro_batch_or(1);
  std::vector<double> losses, step_times, comm_times;
  int64_t dp = 1;
  StateBytes parts;
  CommStats comm_stats;
  std::vector<std::pair<std::string, CommStats>> group_stats;
  MemoryReading after;
  Position pos;
  int64_t first_step = 0, save_extra_bytes = 0;
  double moe_capacity_factor = 0;  // a mixture of experts: the padding its batched GEMMs ran (executor/moe.h)
  nlohmann::json saved = nullptr;
  compat::cuda_synchronize();
  const int64_t baseline_bytes = cuda ? 0 : memory_read(device).current_bytes;  // tensors not ours (CPU)
  try {
    LlamaModel model = llama_create(job.model, mo, static_cast<uint64_t>(s.seed), job.load_weights.empty());
    if (!job.load_weights.empty()) llama_load_weights(model, job.load_weights);
    if (s.method == ftplan::Method::qlora) llama_quantize_nf4(model);
    if (s.method != ftplan::Method::full) lora_attach(model, s.lora, static_cast<uint64_t>(s.seed));
    const SavePlan save = job.save_dir.empty() ? SavePlan{} : save_plan(model, s.method);
    StrategyOptions so;
    so.parallel = layout;
    so.method = s.method;
    so.precision = s.precision;
    so.adamw = AdamWOptions{s.learning_rate, job.adam_beta1, job.adam_beta2, job.adam_eps, job.weight_decay};
    so.grad_accum = s.grad_accum;
    so.max_grad_norm = job.max_grad_norm;
    so.ddp_bucket_bytes = static_cast<int64_t>(o.ddp_bucket_mb * double(1 << 20));
    so.ddp_first_bucket_bytes = std::min<int64_t>(so.ddp_bucket_bytes, so.ddp_first_bucket_bytes);
    so.zero_bucket_elements = static_cast<int64_t>(o.zero_bucket_elements);
    std::unique_ptr<DistStrategy> strategy = make_dist_strategy(model, *comm, so);
    dp = strategy->data_parallel_size();

    auto data = open_data_source(s.data, job.model.vocab_size, static_cast<uint64_t>(s.seed));
    const nlohmann::json ck_layout = o.checkpoint_dir.empty() ? nlohmann::json() : checkpoint_layout(job, strategy_name, layout);
    if (o.resume) {
      pos = load_checkpoint(o.checkpoint_dir, *strategy, *comm, ck_layout);
      for (int64_t i = 0; i < pos.micro_batches; ++i) data->next(micro_batch, s.seq_len);
      first_step = pos.step;
    } else if (!o.checkpoint_dir.empty()) {
      std::string problem;
      try {
        checkpoint_preflight(o.checkpoint_dir, false);
      } catch (const ftplan::InputError& e) {
        problem = e.what();
      }
      agree_or_fail(*comm, problem);
    }
    const bool bar = job.progress && rank == 0 && ::isatty(STDOUT_FILENO);
    comm->reset_stats();
    strategy->reset_group_stats();
    compat::cuda_synchronize();
    memory_reset_peak(device);
    const int64_t per_step = dp * s.grad_accum;  // micro-batches in one global batch
    const int64_t dp_rank = strategy->data_parallel_rank(rank);
    for (int64_t step = pos.step; step < s.steps; ++step) {
      comm->set_step(step + 1);
      maybe_inject_fault(o.fault_inject, rank, step + 1);
      std::vector<TokenBatch> mine;
      for (int64_t i = 0; i < per_step; ++i) {
        TokenBatch b = data->next(micro_batch, s.seq_len);
        if (i / s.grad_accum == dp_rank) mine.push_back(std::move(b));
      }
      pos.micro_batches += per_step;
      const double comm_before = total_stats(*comm, strategy.get()).time_s;
      compat::cuda_synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      const double loss = strategy->step(mine);
      compat::cuda_synchronize();
      const double dt = seconds_since(t0);
      if (!std::isfinite(loss)) throw RuntimeFailure("rank " + std::to_string(rank) + ": loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1));
      losses.push_back(loss);
      if (step - first_step >= job.warmup_steps) {
        step_times.push_back(dt);
        comm_times.push_back(total_stats(*comm, strategy.get()).time_s - comm_before);
      }
      if (bar) print_progress(step + 1, s.steps, loss, dt);
      pos.step = step + 1;
      // (The checkpoint's barriers count as control traffic, outside the per-step figures.)
      if (!o.checkpoint_dir.empty() && (o.checkpoint_every > 0 ? pos.step % o.checkpoint_every == 0 : pos.step == s.steps))
        save_checkpoint(o.checkpoint_dir, pos, *strategy, *comm, s.model, ck_layout, o.keep_last);
    }
    comm_stats = total_stats(*comm, strategy.get());
    group_stats = strategy->group_stats();
    moe_capacity_factor = model.moe_aux.max_capacity_factor;
    compat::cuda_synchronize();
    after = memory_read(device);
    parts = strategy->state_bytes();
    if (!job.save_dir.empty()) {
      // Measured apart from the run: what the save holds beyond the rank's states (one unit).
      memory_reset_peak(device);
      saved = save_trained(job, save, *strategy, *comm);
      compat::cuda_synchronize();
      const MemoryReading during = memory_read(device);
      save_extra_bytes = std::max<int64_t>(0, during.peak_bytes - after.current_bytes);
    }
  } catch (const ftplan::InputError&) {
    throw;
  } catch (const RuntimeFailure& e) {
    comm->report_failure(e.what());
    (void)comm.release();  // never run c10d's destructors after a failure: they may wait on a dead peer
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    const std::string msg = "rank " + std::to_string(rank) + ": out of memory on " + device + ": " + e.what_without_backtrace();
    comm->report_failure(msg);
    (void)comm.release();
    throw RuntimeFailure(msg);
  } catch (const c10::Error& e) {
    const std::string msg = "rank " + std::to_string(rank) + ": libtorch error: " + e.what_without_backtrace();
    comm->report_failure(msg);
    (void)comm.release();
    throw RuntimeFailure(msg);
  } catch (const std::bad_alloc&) {
    const std::string msg = "rank " + std::to_string(rank) + ": out of memory on the host (std::bad_alloc)";
    comm->report_failure(msg);
    (void)comm.release();
    throw RuntimeFailure(msg);
  }

  // ---- measurement, the same for one process and for N ranks ----
  const double steps_run = std::max<double>(1.0, double(losses.size()));
  const double step_time = median(step_times);
  double comm_time = 0;
  for (double c : comm_times) comm_time += c;
  comm_time = comm_times.empty() ? 0 : comm_time / double(comm_times.size());
  double mean_step = 0;
  for (double t : step_times) mean_step += t;
  mean_step = step_times.empty() ? 0 : mean_step / double(step_times.size());
  double padding = 0;
  for (CommOp op : {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather, CommOp::send})
    padding += comm_stats.ops[static_cast<int>(op)].padding_bytes;
  // Memory: the bytes of this run's tensors (CPU: the counting allocator, less what existed before;
  // CUDA: the caching allocator's allocations). The peak per device is what the planner's total
  // predicts: on CUDA what the allocator reserved at its peak plus what lives outside it (context,
  // cuBLAS workspace, NCCL buffers).
  const int64_t static_bytes = after.current_bytes - baseline_bytes;
  const int64_t peak_allocated = after.peak_bytes - baseline_bytes;
  const int64_t peak_bytes =
      cuda ? after.reserved_peak_bytes + std::max<int64_t>(0, after.device_used_bytes - after.reserved_peak_bytes) : peak_allocated;
  nlohmann::json mine = {
      {"rank", rank},
      {"peak_memory_bytes", peak_bytes},
      {"static_bytes", static_bytes},
      {"host_memory_bytes", after.host_current_bytes},  // offloaded states (the host pool starts empty)
      {"host_peak_memory_bytes", after.host_peak_bytes},
      {"components",
       {{"weights", parts.weights},
        {"gradients", parts.gradients},
        {"optimizer", parts.optimizer},
        {"buffers", parts.buffers},
        {"host", parts.host},
        {"activations", std::max<int64_t>(0, peak_allocated - static_bytes)}}},
      {"comm_bytes", comm_json(comm_stats, steps_run, false)},
      {"comm_calls", comm_json(comm_stats, steps_run, true)},
      {"comm_padding_bytes", padding / steps_run},
      {"comm_control_bytes", comm_stats.ops[static_cast<int>(CommOp::control)].wire_bytes / steps_run},
      {"comm_bytes_per_step", comm_stats.payload_bytes() / steps_run},
      {"comm_bytes_per_group", group_bytes_json(comm_stats, group_stats, layout.pipelined(), steps_run)},
      {"comm_time_s", comm_time},
      {"compute_time_s", std::max(0.0, mean_step - comm_time)},
      {"step_time_s", step_time},
      {"threads", at::get_num_threads()}};
  if (cuda) {
    mine["cuda"] = {{"peak_allocated_bytes", after.peak_bytes},
                    {"peak_reserved_bytes", after.reserved_peak_bytes},
                    {"device_used_bytes", after.device_used_bytes},
                    {"device_total_bytes", after.device_total_bytes},
                    {"alloc_retries", after.alloc_retries}};
  }
  if (!job.save_dir.empty()) mine["save_peak_extra_bytes"] = save_extra_bytes;
  if (job.model.moe.active()) mine["moe_capacity_factor"] = moe_capacity_factor;
  comm->store_set("result/" + std::to_string(rank), mine.dump());
  comm->barrier();
  if (rank != 0) return nullptr;

  nlohmann::json ranks = nlohmann::json::array();
  double comm_max = 0, step_max = 0;
  nlohmann::json group_max = nlohmann::json::object();  // per process group, the largest over ranks
  for (int r = 0; r < comm->world(); ++r) {
    nlohmann::json j = r == 0 ? mine : nlohmann::json::parse(comm->store_get("result/" + std::to_string(r)));
    comm_max = std::max(comm_max, j["comm_bytes_per_step"].get<double>());
    for (const auto& [g, b] : j["comm_bytes_per_group"].items())
      group_max[g] = std::max(group_max.value(g, 0.0), b.get<double>());
    step_max = std::max(step_max, j["step_time_s"].get<double>());
    ranks.push_back(j);
  }
  const int world = comm->world();
  const int64_t tokens_per_step = micro_batch * s.seq_len * s.grad_accum * dp;
  const auto flops = ftplan::flops_per_token(job.model, s);
  const double flops_per_step = flops.model * double(tokens_per_step);
  // MFU against the peak of the device that ran: the plan's GPU (or --gpu) on CUDA, hwdb/cpu.json's
  // on the CPU; every rank's peak counts (the planner's MFU is per GPU).
  nlohmann::json mfu = nullptr, peak_flops = nullptr;
  const bool gpu_named = job.plan.has_value() || s.given.count("gpu") > 0;
  if (cuda && !gpu_named) {
    notes.push_back("no MFU: a CUDA run needs the GPU's peak (give --gpu, or a plan)");
  } else {
    try {
      const auto hw = ftplan::load_hardware(cuda ? s.gpu : "cpu");
      const double peak = ftplan::peak_flops(hw, s.precision);
      if (peak > 0 && step_max > 0) {
        peak_flops = peak;
        mfu = flops_per_step / step_max / (peak * world);
      }
    } catch (const ftplan::InputError& e) {
      notes.push_back(std::string("no MFU: ") + e.what());
    }
  }
  if (world > 1)
    notes.push_back("ranks started by " + env.source + "; collectives over " + backend +
                    " (reduce-scatter and all-gather as rings of send/recv); comm bytes by the planner's formula "
                    "(planner/collectives.h), loss and gradient-norm reductions counted apart as control");
  ftplan::TrainingSetup setup = s;
  setup.num_gpus = world;
  nlohmann::json candidate = {{"strategy", strategy_name},
                              {"parallel", ftplan::parallelism_json(layout)},
                              {"micro_batch", micro_batch},
                              {"checkpointing", ftplan::to_string(*s.checkpointing)},
                              {"attention", mo.use_sdpa ? "fused" : "eager"},
                              {"gpus", world}};
  nlohmann::json out = {{"format", "ftexec-measured/1"},
                        {"framework", "ftexec"},
                        {"device", cuda && world > 1 ? std::string("cuda (one GPU per rank)") : device},
                        {"torch_version", compat::torch_version()},
                        {"job", ftplan::training_setup_to_json(setup)},
                        {"settings", exec_settings_json(job)},
                        {"candidate", candidate},
                        {"world_size", world},
                        {"data_parallel_size", dp},
                        {"steps", s.steps},
                        {"first_step", first_step},
                        {"warmup_steps", job.warmup_steps},
                        {"threads", at::get_num_threads()},
                        {"loss", losses},
                        {"step_time_s", step_max},
                        {"step_times_s", step_times},
                        {"tokens_per_step", tokens_per_step},
                        {"tokens_per_s", step_max > 0 ? tokens_per_step / step_max : 0.0},
                        {"flops_per_step", flops_per_step},
                        {"peak_flops", peak_flops},
                        {"mfu", mfu},
                        {"comm_bytes_per_step", comm_max},
                        {"comm_bytes_per_group", group_max},
                        {"ranks", ranks},
                        {"notes", notes}};
  if (!saved.is_null()) out["saved"] = saved;
  return out;
}

nlohmann::json run_job(const ExecJob& job) { return run_rank(job, DistEnv{}, DistOptions{}); }

}  // namespace ftexec
