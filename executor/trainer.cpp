#include "executor/trainer.h"

#include <cmath>

#include "executor/lora.h"
#include "planner/errors.h"

namespace ftexec {

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
  for (const auto& [name, b] : llama_named_buffers(model_)) bytes += b.nbytes();  // DeepSeek-V3's score bias
  return bytes + llama_nf4_bytes(model_);
}

int64_t Trainer::gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : trainable_)
    if (p.grad().defined()) bytes += p.grad().nbytes();
  return bytes;
}

}  // namespace ftexec
