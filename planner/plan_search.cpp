#include "planner/plan_search.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "planner/errors.h"
#include "planner/format.h"
#include "planner/framework.h"

namespace ftplan {
namespace {

// Simpler layouts first: among plans within kTieFraction of each other the simpler one wins
// (fewer moving parts, fewer ways to fail): the presets in this order, then compositions by how many
// dimensions they combine.
constexpr double kTieFraction = 0.005;
int complexity(Strategy s) {
  switch (s) {
    case Strategy::single: return 0;
    case Strategy::ddp: return 1;
    case Strategy::zero1: return 2;
    case Strategy::zero2: return 3;
    case Strategy::fsdp: return 4;
    case Strategy::zero3: return 5;
    case Strategy::fsdp_shard_grad_op: return 6;
    case Strategy::fsdp_hybrid: return 7;
    case Strategy::pipeline_1f1b: return 8;
    case Strategy::pipeline_gpipe: return 9;
    case Strategy::mp: return 10;
    case Strategy::zero2_offload: return 11;
    case Strategy::zero3_offload: return 12;
  }
  return 13;
}
int complexity(const Parallelism& p) {
  if (const auto s = preset_of(p)) return complexity(*s);
  int dims = (p.tp > 1) + (p.cp > 1) + (p.pp > 1) + (p.dp() > 1) + (p.ep > 1);
  return 13 + dims * 4 + (p.sequence_parallel ? 1 : 0) + (p.virtual_stages > 1 ? 1 : 0) + (p.offload_optimizer ? 2 : 0);
}

bool ties(double a, double b) { return std::fabs(a - b) <= kTieFraction * std::min(a, b); }

std::string ratio(double x) { return format_fixed(x, x < 10 ? 2 : 1) + "x"; }

// Seconds per million tokens spent in each part of the step: the basis of every explanation.
struct PerToken {
  double compute, comm, bubble, optimizer;
};
PerToken per_million_tokens(const RankedCandidate& c) {
  const double k = 1e6 / c.step.tokens_per_step;
  const bool pipelined = c.candidate.parallel.pp > 1 && c.candidate.parallel.schedule != PipelineSchedule::naive;
  return {c.step.compute_s * k, c.step.exposed_comm_s * k, pipelined ? c.step.bubble_s * k : 0, c.step.optimizer_s * k};
}

// The degrees and flags in which two layouts differ, loser's first: "tp 1 vs 2, cp 1 vs 2, dp_shard 32 vs 8".
std::string degree_differences(const Parallelism& loser, const Parallelism& winner) {
  std::vector<std::string> parts;
  auto degree = [&](const char* what, int64_t l, int64_t w) {
    if (l != w) parts.push_back(std::string(what) + " " + std::to_string(l) + " vs " + std::to_string(w));
  };
  auto text = [&](const char* what, const std::string& l, const std::string& w) {
    if (l != w) parts.push_back(std::string(what) + " " + l + " vs " + w);
  };
  degree("tp", loser.tp, winner.tp);
  text("sp", loser.sequence_parallel ? "on" : "off", winner.sequence_parallel ? "on" : "off");
  degree("cp", loser.cp, winner.cp);
  degree("pp", loser.pp, winner.pp);
  if (loser.pp > 1 && winner.pp > 1) text("schedule", to_string(loser.schedule), to_string(winner.schedule));
  degree("virtual_stages", loser.virtual_stages, winner.virtual_stages);
  degree("dp_shard", loser.dp_shard, winner.dp_shard);
  degree("dp_replicate", loser.dp_replicate, winner.dp_replicate);
  degree("ep", loser.ep, winner.ep);
  text("sharding", sharding_name(loser), sharding_name(winner));
  text("offload", loser.offload_params ? "optimizer+params" : loser.offload_optimizer ? "optimizer" : "none",
       winner.offload_params ? "optimizer+params" : winner.offload_optimizer ? "optimizer" : "none");
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

// Why `loser` is slower (or dearer) than `winner`, in one clause naming the largest difference.
std::string explain_difference(const RankedCandidate& winner, const RankedCandidate& loser, int64_t job_gpus) {
  const PerToken w = per_million_tokens(winner), l = per_million_tokens(loser);
  const std::array<std::pair<double, const char*>, 4> parts{{{l.compute - w.compute, "compute"},
                                                             {l.comm - w.comm, "exposed communication"},
                                                             {l.bubble - w.bubble, "pipeline bubble"},
                                                             {l.optimizer - w.optimizer, "optimizer step"}}};
  auto biggest = *std::max_element(parts.begin(), parts.end(),
                                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::ostringstream s;
  const Parallelism& lp = loser.candidate.parallel;
  const bool offloads = lp.offload_optimizer || lp.offload_params;
  if (std::string(biggest.second) == "compute") {
    if (lp.pp > 1 && lp.schedule == PipelineSchedule::naive)
      s << "naive model parallel keeps one GPU busy at a time";
    else if (lp.gpus() == 1 && job_gpus > 1)
      s << "it uses 1 of the " << job_gpus << " GPUs";
    else if (loser.candidate.checkpointing == Checkpointing::full && winner.candidate.checkpointing == Checkpointing::none)
      s << "full checkpointing recomputes the forward pass";
    else if (loser.candidate.checkpointing != winner.candidate.checkpointing)
      s << "more compute per token: checkpointing " << to_string(loser.candidate.checkpointing) << " recomputes more than "
        << to_string(winner.candidate.checkpointing);
    else
      s << "more compute per token (micro-batch " << loser.candidate.micro_batch << " vs " << winner.candidate.micro_batch << ")";
  } else if (std::string(biggest.second) == "exposed communication") {
    s << "communication it cannot hide: " << format_fixed(l.comm, 2) << " s vs " << format_fixed(w.comm, 2)
      << " s per million tokens";
    if (lp.shards_params() && lp.reshard_after_forward && lp.pp == 1) s << " (parameters all-gathered twice per micro-batch)";
    if (lp.tp > 1) s << " (tp=" << lp.tp << ": activations all-reduced in every block)";
    if (lp.ep > 1) s << " (ep=" << lp.ep << ": tokens dispatched and combined by all-to-all in every MoE block)";
    if (offloads) s << " (host copies over PCIe)";
  } else if (std::string(biggest.second) == "pipeline bubble") {
    s << "the pipeline bubble idles " << format_fixed(loser.step.bubble_fraction * 100, 0) << "% of each GPU";
  } else {
    s << "the optimizer step takes " << format_fixed(l.optimizer, 2) << " s vs " << format_fixed(w.optimizer, 2)
      << " s per million tokens";
    if (lp.offload_optimizer) s << " (Adam on the CPU)";
  }
  // The degrees that made the difference (what the layouts differ in).
  const std::string degrees = degree_differences(lp, winner.candidate.parallel);
  if (!degrees.empty()) s << " [" << degrees << "]";
  return s.str();
}

std::string describe(const RankedCandidate& c) {
  std::ostringstream s;
  s << c.candidate.name << " (micro-batch " << c.candidate.micro_batch << ", checkpointing "
    << to_string(c.candidate.checkpointing) << (c.candidate.activation_offload ? ", activation offload" : "") << ")";
  return s.str();
}

// Why the winner uses the knobs that trade time for memory: what its strategy does without them.
std::string explain_knobs(const PlanResult& result, const RankedCandidate& win) {
  const Candidate& w = win.candidate;
  auto best_without = [&](auto excluded) -> const RankedCandidate* {
    for (const auto& c : result.candidates)  // best first
      if (c.candidate.parallel == w.parallel && !excluded(c.candidate)) return &c;
    return nullptr;
  };
  std::vector<std::string> parts;
  auto say = [&](const std::string& knob, const RankedCandidate* alt) {
    if (!alt)
      parts.push_back(knob + ": without it nothing fits with " + w.name);
    else if (ties(alt->score, win.score))
      parts.push_back(knob + ": no cost here (within 0.5% of " + describe(*alt) + ")");
    else
      parts.push_back(knob + ": " + ratio(alt->score / win.score) + " better than the best without it, " + describe(*alt));
  };
  if (w.checkpointing != Checkpointing::none)
    say("checkpointing " + to_string(w.checkpointing),
        best_without([](const Candidate& c) { return c.checkpointing != Checkpointing::none; }));
  if (w.activation_offload)
    say("activation offload", best_without([](const Candidate& c) { return c.activation_offload; }));
  if (parts.empty()) return "no memory-saving knob needed: checkpointing none, activations on the GPU";
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out;
}

}  // namespace

bool ranks_before(const RankedCandidate& a, const RankedCandidate& b) {
  if (ties(a.score, b.score) && a.candidate.parallel != b.candidate.parallel)
    return complexity(a.candidate.parallel) < complexity(b.candidate.parallel);
  return a.score < b.score;
}

Objective parse_objective(const std::string& s, const std::string& field) {
  if (s == "time") return Objective::time;
  if (s == "cost") return Objective::cost;
  fail_input(field + ": '" + s + "' is not one of time, cost");
}

std::string to_string(Objective o) { return o == Objective::time ? "time" : "cost"; }

std::vector<Parallelism> composition_layouts(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup) {
  const FrameworkProfile& fw = framework_profile(setup.framework);
  const int64_t n = setup.num_gpus;
  std::vector<Parallelism> out;
  if (n < 2) return out;
  const Attention attention = setup.attention.value_or(Attention::fused);
  const bool tp_ok = fw.offers_tensor_parallel && (setup.method == Method::full || fw.tensor_parallel_with_lora);
  const bool ep_ok = fw.offers_expert_parallel && model.moe.active();
  auto powers = [](int64_t limit) {
    std::vector<int64_t> v;
    for (int64_t d = 1; d <= limit; d *= 2) v.push_back(d);
    return v;
  };
  // Tensor parallelism stays inside a node (its collectives are on every block's critical path).
  const std::vector<int64_t> tps = tp_ok ? powers(std::min(n, hw.gpus_per_node)) : std::vector<int64_t>{1};
  const std::vector<int64_t> cps = fw.offers_context_parallel && attention == Attention::fused ? powers(n) : std::vector<int64_t>{1};
  std::vector<bool> sps{false};
  if (fw.sequence_parallel == "always") sps = {true};
  if (fw.sequence_parallel == "optional" || fw.sequence_parallel == "default") sps = {true, false};
  // How each layout's data-parallel degree shards: the framework's sharded data parallelism (or
  // replicas), and hybrid sharding inside a node where the framework shards with FSDP.
  std::vector<std::string> shardings = {"none"};
  if (fw.default_sharding == "fsdp") shardings.insert(shardings.end(), {"fsdp", "fsdp_shard_grad_op", "hsdp"});
  else shardings.insert(shardings.end(), {"zero1", "zero2", "zero3"});
  for (int64_t tp : tps) {
    if (n % tp) continue;
    for (int64_t cp : cps) {
      if ((n / tp) % cp) continue;
      const int64_t rest = n / (tp * cp);
      std::vector<int64_t> pps{1};
      if (fw.offers_pipeline_parallel)
        for (int64_t pp = 2; pp <= std::min(rest, model.num_layers); ++pp)
          if (rest % pp == 0) pps.push_back(pp);
      for (int64_t pp : pps) {
        const int64_t dp = rest / pp;
        std::vector<std::pair<PipelineSchedule, int64_t>> schedules{{PipelineSchedule::one_f_one_b, 1}};
        if (pp > 1) {
          schedules.clear();
          for (PipelineSchedule sc : fw.pipeline_schedules) {
            if (sc != PipelineSchedule::interleaved_1f1b) schedules.push_back({sc, 1});
            else
              for (int64_t v : {2, 4})
                if (pp * v <= model.num_layers) schedules.push_back({sc, v});
          }
        }
        // Sequence parallelism applies to tensor parallelism only: without tp, one option (none).
        for (bool sp : tp == 1 ? std::vector<bool>{false} : sps) {
          for (const auto& [schedule, v] : schedules)
            for (const std::string& sharding : shardings) {
              Parallelism p;
              p.tp = tp, p.cp = cp, p.pp = pp, p.sequence_parallel = sp && tp > 1;
              p.cp_mode = fw.cp_mode;  // how the framework exchanges K and V
              p.schedule = pp > 1 ? schedule : PipelineSchedule::one_f_one_b;
              p.virtual_stages = v;
              if (sharding == "none") {
                p.dp_replicate = dp;
              } else if (sharding == "hsdp") {
                // Shard over the ranks of one node, replicate across nodes.
                const int64_t per_node = std::max<int64_t>(1, hw.gpus_per_node / (tp * cp));
                if (dp <= per_node || dp % per_node) continue;
                p.dp_shard = per_node, p.dp_replicate = dp / per_node;
                p.sharding = Sharding::fsdp, p.zero_stage = 3;
              } else {
                if (dp < 2) continue;
                p.dp_shard = dp;
                p.sharding = sharding == "fsdp" || sharding == "fsdp_shard_grad_op" ? Sharding::fsdp : Sharding::zero;
                p.zero_stage = sharding == "zero1" ? 1 : sharding == "zero2" ? 2 : 3;
                p.reshard_after_forward = sharding != "fsdp_shard_grad_op";
              }
              // Expert parallelism for a mixture of experts: ep (powers of two) from the data-parallel ranks.
              if (ep_ok && tp == 1 && pp == 1) {
                const int64_t pool = p.dp_shard * cp;
                for (int64_t ep = 2; ep <= pool; ep *= 2) {
                  Parallelism q = p;
                  q.ep = ep;
                  if (parallelism_problems(q, model, setup, n, attention).empty()) out.push_back(q);
                }
              }
              if (tp == 1 && cp == 1 && pp == 1) continue;  // data parallelism alone: the presets
              if ((tp > 1 || cp > 1) && p.dp_replicate > 1 && p.dp_shard == 1 && !fw.model_parallel_with_pure_replicas) continue;
              if (preset_of(p)) continue;                   // pipelines alone: the presets too
              if (!parallelism_problems(p, model, setup, n, attention).empty()) continue;
              out.push_back(p);
            }
        }
      }
    }
  }
  return out;
}

SearchSpace search_space(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup, bool compositions) {
  SearchSpace space;
  if (setup.parallel) {
    space.layouts = {layout_candidate(*setup.parallel)};
  } else {
    const std::vector<Strategy> presets = setup.strategy ? std::vector<Strategy>{*setup.strategy} : applicable_strategies(model, hw, setup);
    for (Strategy s : presets) space.layouts.push_back(preset_candidate(s, setup.num_gpus, hw));
    if (!setup.strategy && compositions)
      for (const Parallelism& p : composition_layouts(model, hw, setup)) space.layouts.push_back(layout_candidate(p));
  }
  if (setup.micro_batch) {
    space.micro_batches = {*setup.micro_batch};
  } else {
    for (int64_t b = 1; b <= 64; b *= 2) space.micro_batches.push_back(b);
  }
  const FrameworkProfile& fw = framework_profile(setup.framework);
  if (setup.checkpointing) {
    space.checkpointing = {*setup.checkpointing};
  } else {
    space.checkpointing = {Checkpointing::none, Checkpointing::full};
    if (fw.offers_selective_checkpointing) space.checkpointing.push_back(Checkpointing::selective);
  }
  // Activation offloading trades PCIe time for memory where the framework offers it (with full
  // checkpointing); the user's choice stays fixed.
  space.activation_offload = {setup.activation_offload};
  if (!setup.given.count("activation_offload") && fw.offers_activation_offload) space.activation_offload = {false, true};
  space.attention = {setup.attention.value_or(Attention::fused)};
  return space;
}

double gpu_hour_price_usd(const HardwareSpec& hw, const TrainingSetup& setup) {
  return setup.price_per_gpu_hour.value_or(hw.price_usd_per_gpu_hour);
}

RankedCandidate evaluate_candidate(const PlanContext& ctx, const Candidate& c, Objective objective, bool explain,
                                   const StepOptions& options) {
  const TrainingSetup& setup = *ctx.memory.setup;
  const HardwareSpec& hw = *ctx.memory.hw;
  RankedCandidate r;
  r.candidate = c;
  r.memory = estimate_memory(ctx.memory, c, ctx.num_gpus, explain);
  r.step = estimate_step(ctx, c, options);
  r.gpus_used = r.memory.gpus_used;
  const double usd_per_s = r.gpus_used * gpu_hour_price_usd(hw, setup) / 3600.0;
  r.cost_usd_per_million_tokens = 1e6 / r.step.tokens_per_s * usd_per_s;
  const double tokens = static_cast<double>(job_tokens(setup));
  r.has_job = tokens > 0;
  if (r.has_job) {
    // Whole optimizer steps: the last partial step still runs.
    const double steps = std::ceil(tokens / r.step.tokens_per_step);
    r.job_time_s = steps * r.step.step_time_s;
    r.gpu_hours = r.job_time_s * r.gpus_used / 3600.0;
    r.cost_usd = r.job_time_s * usd_per_s;
  }
  const double seconds_per_token = 1.0 / r.step.tokens_per_s;
  r.score = objective == Objective::time ? (r.has_job ? r.job_time_s : seconds_per_token)
                                         : (r.has_job ? r.cost_usd : r.cost_usd_per_million_tokens);
  return r;
}

PlanResult plan_job(const ModelSpec& model, const HardwareSpec& hw, const TrainingSetup& setup, Objective objective,
                    const StepOptions& options, const SearchOptions& search) {
  PlanResult result;
  result.objective = objective;
  const SearchSpace space = search_space(model, hw, setup, search.compositions);
  // One context per tensor/context-parallel cut: every layout of that cut shares its bytes.
  std::map<ShardShape, PlanContext> contexts;
  const auto nets = std::make_shared<PlanContext::GroupNets>();  // shared by every shape's context
  auto context_for = [&](const Parallelism& p) -> const PlanContext& {
    const ShardShape shape = shard_shape(p);
    auto it = contexts.find(shape);
    if (it == contexts.end()) it = contexts.emplace(shape, prepare_plan(model, hw, setup, setup.num_gpus, shape, nets)).first;
    return it->second;
  };
  auto better = [](const RankedCandidate& a, const RankedCandidate& b) { return a.score < b.score; };

  std::vector<StrategyOutcome> compositions;
  for (const Candidate& layout : space.layouts) {
    const PlanContext& ctx = context_for(layout.parallel);
    const bool composed = !preset_of(layout.parallel) && !setup.parallel;
    StrategyOutcome outcome;
    outcome.name = layout.name;
    outcome.parallel = layout.parallel;
    bool have_smallest = false;
    for (Checkpointing ck : space.checkpointing)
      for (bool offload : space.activation_offload)
      for (Attention at : space.attention)
        for (int64_t b : space.micro_batches) {
          if (offload && ck != Checkpointing::full) continue;  // offloading moves the checkpointed inputs
          Candidate c = layout;
          c.micro_batch = b, c.checkpointing = ck, c.attention = at, c.activation_offload = offload;
          RankedCandidate r = evaluate_candidate(ctx, c, objective, false, options);
          ++result.evaluated;
          if (r.memory.fits) {
            result.candidates.push_back(r);
            if (!outcome.feasible || better(r, outcome.best)) outcome.best = r;
            outcome.feasible = true;
          } else {
            if (!outcome.feasible && (!have_smallest || r.memory.per_gpu.total < outcome.best.memory.per_gpu.total)) {
              outcome.best = r;
              have_smallest = true;
            }
            // Memory grows with the micro-batch: a composition stops at the first that does not fit.
            if (composed) break;
          }
        }
    // Re-evaluate the kept candidate with its explanation.
    outcome.best = evaluate_candidate(ctx, outcome.best.candidate, objective, true, options);
    (composed ? compositions : result.strategies).push_back(outcome);
  }
  // The compositions: the best few feasible ones are reported beside the presets (all of them stay
  // in the ranked candidates).
  std::vector<StrategyOutcome*> feasible;
  for (auto& o : compositions)
    if (o.feasible) feasible.push_back(&o);
  std::sort(feasible.begin(), feasible.end(), [](const StrategyOutcome* a, const StrategyOutcome* b) { return a->best.score < b->best.score; });
  result.compositions_considered = static_cast<int64_t>(compositions.size());
  for (size_t i = 0; i < feasible.size() && i < search.compositions_reported; ++i) result.strategies.push_back(*feasible[i]);
  if (feasible.empty() && !compositions.empty()) {  // none fits: the one closest to fitting
    auto smallest = std::min_element(compositions.begin(), compositions.end(), [](const auto& a, const auto& b) {
      return a.best.memory.per_gpu.total < b.best.memory.per_gpu.total;
    });
    result.strategies.push_back(*smallest);
  }
  sort_by_rank(result.candidates);

  // The seeds' rules of thumb: fits one GPU -> DDP (one GPU -> single); else FSDP/ZeRO-3; naive MP
  // always runs, slowly.
  bool fits_one = false;
  for (const auto& o : result.strategies)
    if (o.parallel.gpus() == 1 && o.feasible) fits_one = true;
  if (!fits_one && setup.num_gpus > 1 && !setup.strategy && !setup.parallel) {
    TrainingSetup one = setup;
    one.num_gpus = 1;
    const PlanContext ctx1 = prepare_plan(model, hw, one, 1);
    for (Checkpointing ck : {Checkpointing::none, Checkpointing::full})
      fits_one = fits_one || estimate_memory(ctx1.memory, preset_candidate(Strategy::single, 1, hw, 1, ck, space.attention[0]), 1, false).fits;
  }

  result.fits_one_gpu = fits_one;
  explain_plan(result, setup.num_gpus);
  return result;
}

void explain_plan(PlanResult& result, int64_t N) {
  const Objective objective = result.objective;
  const bool fits_one = result.fits_one_gpu;
  if (result.candidates.empty()) {
    result.reason = "no strategy fits: every candidate runs out of memory (smallest needs shown per strategy)";
  } else {
    result.recommended = result.candidates.front();
    const RankedCandidate& win = *result.recommended;
    const RankedCandidate* runner = nullptr;
    for (const auto& c : result.candidates)
      if (c.candidate.parallel != win.candidate.parallel) {
        runner = &c;
        break;
      }
    std::ostringstream why;
    why << describe(win) << " is the " << (objective == Objective::time ? "fastest" : "cheapest") << " plan";
    if (runner && ties(runner->score, win.score)) {
      why << "; it ties with " << describe(*runner) << " (within " << format_fixed(kTieFraction * 100, 1)
          << "%), and the simpler strategy is preferred";
      // The first layout that does not tie: what the winner's degrees buy.
      for (const auto& c : result.candidates)
        if (c.candidate.parallel != win.candidate.parallel && !ties(c.score, win.score) &&
            c.candidate.parallel != runner->candidate.parallel) {
          why << "; it beats the next, " << describe(c) << ", by " << ratio(c.score / win.score) << " because "
              << explain_difference(win, c, N);
          break;
        }
    } else if (runner)
      why << "; it beats " << describe(*runner) << " by " << ratio(runner->score / win.score) << " because "
          << explain_difference(win, *runner, N);
    else
      why << "; it is the only strategy that fits";
    result.reason = why.str();
    result.knobs = explain_knobs(result, win);
  }
  for (auto& o : result.strategies) {
    if (!o.feasible) {
      o.verdict = o.best.memory.reason + " (at micro-batch " + std::to_string(o.best.candidate.micro_batch) +
                  ", checkpointing " + to_string(o.best.candidate.checkpointing) +
                  (o.best.candidate.activation_offload ? ", activation offload" : "") + ")";
    } else if (result.recommended && o.parallel == result.recommended->candidate.parallel) {
      o.verdict = "recommended";
    } else if (result.recommended && ties(o.best.score, result.recommended->score)) {
      o.verdict = "ties with " + result.recommended->candidate.name + " (within " +
                  format_fixed(kTieFraction * 100, 1) + "%); the simpler strategy is preferred";
    } else if (result.recommended) {
      o.verdict = ratio(o.best.score / result.recommended->score) + (objective == Objective::time ? " slower: " : " dearer: ") +
                  explain_difference(*result.recommended, o.best, N);
    }
  }

  std::string rule, rule_name;
  if (N <= 1) {
    rule_name = fits_one ? "single" : "zero3_offload";
    rule = fits_one ? "fits one GPU: train on it" : "does not fit one GPU: offload or rent more GPUs";
  } else {
    rule_name = fits_one ? "ddp" : "fsdp";
    rule = fits_one ? "fits one GPU -> DDP" : "does not fit one GPU -> FSDP/ZeRO-3";
  }
  std::ostringstream r;
  r << "seeds' rule of thumb: " << rule << "; naive MP always runs but slowly. ";
  if (!result.recommended) {
    r << "Here nothing fits at all.";
  } else {
    const Parallelism& wp = result.recommended->candidate.parallel;
    const std::string w = result.recommended->candidate.name;
    const bool agrees = w == rule_name || (rule_name == "fsdp" && wp.shards_params() && wp.reshard_after_forward);
    if (agrees) {
      r << "The numbers agree (" << w << ").";
    } else {
      const StrategyOutcome* ruled = nullptr;
      for (const auto& o : result.strategies)
        if (o.name == rule_name) ruled = &o;
      r << "The numbers disagree: " << w << " wins";
      if (ruled && ruled->feasible)
        r << "; " << rule_name << " is " << ruled->verdict;
      else if (ruled)
        r << "; " << rule_name << ": " << ruled->verdict;
      r << ".";
    }
  }
  result.rule_of_thumb = r.str();
}

}  // namespace ftplan
