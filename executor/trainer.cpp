#include "executor/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>

#include "executor/lora.h"
#include "executor/memory_meter.h"
#include "executor/run_job.h"
#include "executor/torch_compat.h"
#include "planner/compute_model.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"

namespace ftexec {
namespace fs = std::filesystem;

// ---- AdamW -------------------------------------------------------------------------------------

bool hf_decays(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (name.find("bias") != std::string::npos) return false;
  if (name.find("layernorm") != std::string::npos || name.find("rmsnorm") != std::string::npos) return false;
  return !ends_with("norm.weight");  // model.norm.weight: a LlamaRMSNorm
}

DecayRanges decay_ranges_of(const std::string& name, int64_t numel) {
  return hf_decays(name) ? DecayRanges{{0, numel}} : DecayRanges{};
}

std::vector<DecayRanges> hf_decay_groups(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors) {
  std::vector<DecayRanges> out;
  for (size_t i = 0; i < tensors.size(); ++i) out.push_back(decay_ranges_of(names.at(i), tensors[i].numel()));
  return out;
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options, bool fp32_master, std::vector<DecayRanges> decay)
    : options_(options) {
  at::NoGradGuard no_grad;
  if (!decay.empty() && decay.size() != params.size())
    throw std::logic_error("AdamW: decay ranges for " + std::to_string(decay.size()) + " of " +
                           std::to_string(params.size()) + " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    Slot s;
    s.param = p;
    if (!decay.empty()) {
      s.decay = decay[i];
      s.decay_all = s.decay.size() == 1 && s.decay[0].first == 0 && s.decay[0].second == p.numel();
    }
    if (fp32_master && p.scalar_type() != at::kFloat) s.master = p.detach().to(at::kFloat);
    const at::Tensor& ref = s.master.defined() ? s.master : p;
    s.m = at::zeros_like(ref);
    s.v = at::zeros_like(ref);
    slots_.push_back(std::move(s));
  }
}

void AdamW::step() {
  at::NoGradGuard no_grad;
  ++t_;
  const auto& o = options_;
  const double bc1 = 1.0 - std::pow(o.beta1, double(t_));
  const double bc2 = 1.0 - std::pow(o.beta2, double(t_));
  for (auto& s : slots_) {
    const at::Tensor& grad = s.param.grad();
    if (!grad.defined()) continue;
    at::Tensor p = s.master.defined() ? s.master : s.param;
    const at::Tensor g = s.master.defined() ? grad.to(at::kFloat) : grad;
    if (o.weight_decay != 0.0) {
      if (s.decay_all) {
        p.mul_(1.0 - o.lr * o.weight_decay);
      } else {
        at::Tensor flat = p.view({-1});
        for (const auto& [offset, count] : s.decay) flat.narrow(0, offset, count).mul_(1.0 - o.lr * o.weight_decay);
      }
    }
    s.m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
    s.v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    const at::Tensor denom = (s.v.sqrt() / std::sqrt(bc2)).add_(o.eps);
    p.addcdiv_(s.m, denom, -o.lr / bc1);
    if (s.master.defined()) s.param.copy_(s.master);
  }
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : slots_) {
    bytes += s.m.nbytes() + s.v.nbytes();
    if (s.master.defined()) bytes += s.master.nbytes();
  }
  return bytes;
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::named_state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    out.emplace_back("exp_avg." + std::to_string(i), slots_[i].m);
    out.emplace_back("exp_avg_sq." + std::to_string(i), slots_[i].v);
    if (slots_[i].master.defined()) out.emplace_back("master." + std::to_string(i), slots_[i].master);
  }
  return out;
}

// ---- Trainer -----------------------------------------------------------------------------------

std::vector<std::string> trainable_names(LlamaModel& model, ftplan::Method method) {
  std::vector<std::string> names;
  const bool full = method == ftplan::Method::full;
  if (full)
    for (auto& [name, p] : llama_named_parameters(model)) names.push_back(name);
  else
    for (auto& [name, p] : lora_named_parameters(model)) names.push_back(name);
  return names;
}

std::vector<at::Tensor> set_trainable(LlamaModel& model, ftplan::Method method) {
  std::vector<at::Tensor> trainable;
  const bool full = method == ftplan::Method::full;
  for (auto& [name, p] : llama_named_parameters(model)) {
    at::Tensor t = p;
    t.set_requires_grad(full);
    if (full) trainable.push_back(t);
  }
  for (auto& [name, p] : lora_named_parameters(model)) {
    at::Tensor t = p;
    t.set_requires_grad(!full);
    if (!full) trainable.push_back(t);
  }
  if (trainable.empty()) ftplan::fail_input("method lora: the model has no adapters attached (nothing to train)");
  return trainable;
}

std::pair<at::Tensor, at::Tensor> batch_tensors(const TokenBatch& b, const at::Device& device) {
  auto opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor ids = at::from_blob(const_cast<int64_t*>(b.input_ids.data()), {b.batch, b.seq_len}, opts).to(device, false, true);
  at::Tensor labels = at::from_blob(const_cast<int64_t*>(b.labels.data()), {b.batch, b.seq_len}, opts).to(device, false, true);
  return {ids, labels};
}

Trainer::Trainer(LlamaModel& model, ftplan::Method method, ftplan::Precision precision, AdamWOptions adamw,
                 int64_t grad_accum, double max_grad_norm)
    : model_(model),
      trainable_(set_trainable(model, method)),
      optimizer_(trainable_, adamw, precision == ftplan::Precision::mixed,
                 hf_decay_groups(trainable_names(model, method), trainable_)),
      grad_accum_(grad_accum),
      max_grad_norm_(max_grad_norm) {}

double Trainer::forward_backward(const TokenBatch& batch, double loss_scale) {
  auto [ids, labels] = batch_tensors(batch, model_.options.device);
  at::Tensor loss = llama_loss(model_, ids, labels);
  const double value = loss.item<double>();
  if (loss_scale != 1.0) loss = loss * loss_scale;
  loss.backward();
  return value;
}

void Trainer::zero_grad() {
  at::NoGradGuard no_grad;
  for (const auto& p : trainable_)
    if (p.grad().defined()) p.grad().zero_();
}

double Trainer::step(const std::function<TokenBatch()>& next) {
  double loss = 0.0;
  for (int64_t i = 0; i < grad_accum_; ++i) loss += forward_backward(next(), 1.0 / double(grad_accum_));
  {
    // Clip the global gradient norm (torch.nn.utils.clip_grad_norm_ with max_norm).
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> norms;
    for (const auto& p : trainable_)
      if (p.grad().defined()) norms.push_back(at::linalg_vector_norm(p.grad(), 2, c10::nullopt, false, at::kFloat));
    if (!norms.empty()) {
      last_grad_norm_ = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
      if (max_grad_norm_ > 0 && last_grad_norm_ > max_grad_norm_) {
        const double coef = max_grad_norm_ / (last_grad_norm_ + 1e-6);
        for (const auto& p : trainable_)
          if (p.grad().defined()) p.grad().mul_(coef);
      }
    }
  }
  optimizer_.step();
  zero_grad();
  return loss / double(grad_accum_);
}

int64_t Trainer::weight_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, p] : llama_named_parameters(model_)) bytes += p.nbytes();
  for (const auto& [name, p] : lora_named_parameters(model_)) bytes += p.nbytes();
  return bytes + llama_nf4_bytes(model_);
}

int64_t Trainer::gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : trainable_)
    if (p.grad().defined()) bytes += p.grad().nbytes();
  return bytes;
}

// ---- run_job -----------------------------------------------------------------------------------
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

}  // namespace

nlohmann::json run_job(const ExecJob& job) {
  const auto& s = job.setup;
  const bool cuda = job.device.rfind("cuda", 0) == 0;
  if ((s.strategy && *s.strategy != ftplan::Strategy::single) || (s.parallel && s.parallel->gpus() > 1))
    ftplan::fail_input("strategy " + (s.parallel ? ftplan::name(*s.parallel) : ftplan::to_string(*s.strategy)) +
                       " runs on several ranks: `ftexec run --nproc N`, torchrun, srun or mpirun (executor/dist_run.h)");
  if (cuda && !at::hasCUDA())
    ftplan::fail_input("--device " + job.device + ": this ftexec was built against a libtorch without CUDA (" +
                       compat::torch_version() + ") or no GPU is visible");
  cpu_meter_install();
  cpu_meter_set_limit(job.cpu_memory_limit_bytes);
  at::set_num_threads(job.threads > 0 ? int(job.threads) : int(std::max(1u, std::thread::hardware_concurrency())));

  nlohmann::json notes = nlohmann::json::array();
  ModelOptions mo;
  mo.dtype = s.precision == ftplan::Precision::fp32 ? at::kFloat : at::kBFloat16;
  mo.device = at::Device(job.device);
  mo.checkpointing = s.checkpointing == ftplan::Checkpointing::full;
  mo.use_sdpa = s.attention == ftplan::Attention::fused && compat::kHasSdpa;
  if (s.attention == ftplan::Attention::fused && !compat::kHasSdpa)
    notes.push_back(std::string("attention fused requested, but libtorch ") + compat::torch_version() +
                    " has no SDPA: ran eager attention");

  // A plan that cannot fit the device is bad input, reported before anything runs.
  if (job.plan && job.plan->contains("predicted")) {
    const auto& pred = (*job.plan)["predicted"];
    const int64_t need = pred.value("memory_per_gpu_bytes", nlohmann::json::object()).value("total", int64_t(0));
    int64_t have = job.cpu_memory_limit_bytes;
    if (cuda) have = compat::cuda_memory_stats(mo.device.index() < 0 ? 0 : mo.device.index()).device_total_bytes;
    if (have > 0 && need > have)
      ftplan::fail_input("the plan needs " + std::to_string(need / double(1 << 30)) + " GiB per device; " + job.device +
                         " has " + std::to_string(have / double(1 << 30)) + " GiB");
  }

  const int64_t micro_batch = s.micro_batch_or(1);
  const int64_t tokens_per_step = micro_batch * s.seq_len * s.grad_accum;
  std::vector<double> losses, step_times;
  int64_t peak_bytes = 0, static_bytes = 0, weights = 0, gradients = 0, optimizer = 0;
  MemoryReading after;
  compat::cuda_synchronize();
  const int64_t baseline_bytes = cuda ? 0 : memory_read(job.device).current_bytes;  // tensors not ours (CPU)
  try {
    LlamaModel model = llama_create(job.model, mo, static_cast<uint64_t>(s.seed), job.load_weights.empty());
    if (!job.load_weights.empty()) llama_load_weights(model, job.load_weights);
    if (s.method == ftplan::Method::qlora) llama_quantize_nf4(model);
    if (s.method != ftplan::Method::full) lora_attach(model, s.lora, static_cast<uint64_t>(s.seed));
    Trainer trainer(model, s.method, s.precision, AdamWOptions{s.learning_rate, job.adam_beta1, job.adam_beta2, job.adam_eps, job.weight_decay},
                    s.grad_accum, job.max_grad_norm);
    auto data = open_data_source(s.data, job.model.vocab_size, static_cast<uint64_t>(s.seed));
    auto next = [&] { return data->next(micro_batch, s.seq_len); };
    const bool bar = job.progress && ::isatty(STDOUT_FILENO);

    compat::cuda_synchronize();
    memory_reset_peak(job.device);
    for (int64_t step = 0; step < s.steps; ++step) {
      compat::cuda_synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      const double loss = trainer.step(next);
      compat::cuda_synchronize();
      const double dt = seconds_since(t0);
      if (!std::isfinite(loss)) throw RuntimeFailure("loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1));
      losses.push_back(loss);
      if (step >= job.warmup_steps) step_times.push_back(dt);
      if (bar) print_progress(step + 1, s.steps, loss, dt);
    }
    after = memory_read(job.device);
    static_bytes = after.current_bytes - baseline_bytes;
    weights = trainer.weight_bytes();
    gradients = trainer.gradient_bytes();
    optimizer = trainer.optimizer_bytes();
    // CUDA: what the caching allocator held at its peak plus what lives outside it (context,
    // cuBLAS workspace): the figure the planner's total (with overhead) predicts.
    peak_bytes = cuda ? after.reserved_peak_bytes + std::max<int64_t>(0, after.device_used_bytes - after.reserved_peak_bytes)
                      : after.peak_bytes - baseline_bytes;

    if (!job.save_dir.empty()) {
      if (s.method != ftplan::Method::full) {  // LoRA and QLoRA: the adapter
        lora_save_peft(model, s.lora, job.save_dir, s.model);
      } else {
        llama_save_weights(model, job.save_dir);
        ftplan::write_file_atomically((fs::path(job.save_dir) / "config.json").string(), read_text(job.model_config_path));
      }
    }
  } catch (const ftplan::InputError&) {
    throw;
  } catch (const RuntimeFailure&) {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    throw RuntimeFailure(std::string("out of memory on ") + job.device + ": " + e.what_without_backtrace());
  } catch (const c10::Error& e) {
    throw RuntimeFailure(std::string("libtorch error: ") + e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    throw RuntimeFailure("out of memory on the host (std::bad_alloc)");
  }

  const double step_time = median(step_times);
  const auto flops = ftplan::flops_per_token(job.model, s);
  const double flops_per_step = flops.model * double(tokens_per_step);
  nlohmann::json mfu = nullptr, peak_flops = nullptr;
  try {
    const auto hw = ftplan::load_hardware(cuda ? s.gpu : "cpu");
    const double peak = ftplan::peak_flops(hw, s.precision);
    if (peak > 0 && step_time > 0) {
      peak_flops = peak;
      mfu = flops_per_step / step_time / peak;
    }
  } catch (const ftplan::InputError& e) {
    notes.push_back(std::string("no MFU: ") + e.what());
  }

  nlohmann::json candidate = {{"strategy", "single"},
                              {"micro_batch", micro_batch},
                              {"checkpointing", ftplan::to_string(*s.checkpointing)},
                              {"attention", mo.use_sdpa ? "fused" : "eager"},
                              {"gpus", 1}};
  nlohmann::json rank = {{"rank", 0},
                         {"peak_memory_bytes", peak_bytes},
                         {"static_bytes", static_bytes},
                         {"components",
                          {{"weights", weights},
                           {"gradients", gradients},
                           {"optimizer", optimizer},
                           {"activations", std::max<int64_t>(0, after.peak_bytes - baseline_bytes - static_bytes)}}}};
  if (cuda) {
    rank["cuda"] = {{"peak_allocated_bytes", after.peak_bytes},
                    {"peak_reserved_bytes", after.reserved_peak_bytes},
                    {"device_used_bytes", after.device_used_bytes},
                    {"device_total_bytes", after.device_total_bytes},
                    {"alloc_retries", after.alloc_retries}};
  }
  nlohmann::json out = {{"format", "ftexec-measured/1"},
                        {"framework", "ftexec"},
                        {"device", job.device},
                        {"torch_version", compat::torch_version()},
                        {"job", ftplan::training_setup_to_json(s)},
          {"settings", exec_settings_json(job)},
                        {"candidate", candidate},
                        {"steps", s.steps},
                        {"warmup_steps", job.warmup_steps},
                        {"threads", at::get_num_threads()},
                        {"loss", losses},
                        {"step_time_s", step_time},
                        {"step_times_s", step_times},
                        {"tokens_per_step", tokens_per_step},
                        {"tokens_per_s", step_time > 0 ? tokens_per_step / step_time : 0.0},
                        {"flops_per_step", flops_per_step},
                        {"peak_flops", peak_flops},
                        {"mfu", mfu},
                        {"ranks", nlohmann::json::array({rank})},
                        {"notes", notes}};
  return out;
}

}  // namespace ftexec
