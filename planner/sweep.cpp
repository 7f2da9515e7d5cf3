#include "planner/sweep.h"

#include <map>

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "planner/format.h"
#include "planner/plan_report.h"

namespace ftplan {

std::vector<SweepRow> run_sweep(const ModelSpec& model, const std::vector<HardwareSpec>& gpus,
                                const std::vector<int64_t>& counts, const TrainingSetup& base, Objective objective,
                                bool all_candidates, const SweepLimits& limits, int64_t* evaluated) {
  std::vector<SweepRow> rows;
  auto within = [&](const RankedCandidate& c) {
    if (limits.max_hours && (!c.has_job || c.job_time_s / 3600.0 > *limits.max_hours)) return false;
    if (limits.max_cost && (!c.has_job || c.cost_usd > *limits.max_cost)) return false;
    return true;
  };
  for (const HardwareSpec& hw : gpus) {
    // One cache of process-group networks for every count and shape of this GPU type.
    const auto nets = std::make_shared<PlanContext::GroupNets>();
    for (int64_t n : counts) {
      TrainingSetup setup = base;
      setup.gpu = hw.id;
      setup.num_gpus = n;
      const SearchSpace space = search_space(model, hw, setup);
      std::map<ShardShape, PlanContext> contexts;  // one per tensor/context-parallel cut
      for (Candidate layout : space.layouts) {
        // A fixed composition keeps its model-parallel degrees and scales its data parallelism.
        const auto scaled = scaled_layout(layout.parallel, n, hw);
        if (!scaled) continue;
        // A composition is named by its degrees: the scaled ones (a preset keeps its name).
        if (!preset_of(layout.parallel)) layout.name = name(*scaled);
        layout.parallel = *scaled;
        const ShardShape shape = shard_shape(layout.parallel);
        if (!contexts.count(shape)) contexts.emplace(shape, prepare_plan(model, hw, setup, n, shape, nets));
        const PlanContext& ctx = contexts.at(shape);
        std::optional<RankedCandidate> best;
        Candidate c = layout;  // one copy per layout: its name is long for a composition
        // The layout's least memory (the smallest micro-batch, full checkpointing and the fused attention
        // where searched): when that does not fit, nothing of this layout does.
        c.micro_batch = space.micro_batches.front();
        c.checkpointing = std::count(space.checkpointing.begin(), space.checkpointing.end(), Checkpointing::full)
                              ? Checkpointing::full : space.checkpointing.front();
        c.attention = std::count(space.attention.begin(), space.attention.end(), Attention::fused) ? Attention::fused
                                                                                                   : space.attention.front();
        if (evaluated) ++*evaluated;
        if (!estimate_memory(ctx.memory, c, n, false).fits) continue;
        for (Checkpointing ck : space.checkpointing)
          for (Attention at : space.attention)
            for (int64_t b : space.micro_batches) {
              c.micro_batch = b, c.checkpointing = ck, c.attention = at;
              RankedCandidate r = evaluate_candidate(ctx, c, objective);
              if (evaluated) ++*evaluated;
              // Memory grows with the micro-batch (ascending here): the larger ones cannot fit either.
              if (!r.memory.fits) break;
              if (!within(r)) continue;
              if (all_candidates) rows.push_back({hw.id, n, r});
              else if (!best || r.score < best->score) best = r;
            }
        if (best) rows.push_back({hw.id, n, *best});
      }
    }
  }
  // Rank indices, then move the rows once (a row is large: sorting the rows themselves moves each many times).
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  sort_by_rank(order, [&](size_t i) -> const RankedCandidate& { return rows[i].result; });
  std::vector<SweepRow> sorted;
  sorted.reserve(rows.size());
  for (size_t i : order) sorted.push_back(std::move(rows[i]));
  return sorted;
}

bool sweep_has_job(const std::vector<SweepRow>& rows) {
  return !rows.empty() &&
         std::all_of(rows.begin(), rows.end(), [](const SweepRow& r) { return r.result.has_job; });
}

SweepPoint sweep_point(const SweepRow& row, bool job) {
  const RankedCandidate& c = row.result;
  if (job) return {c.job_time_s, c.cost_usd};
  return {c.step.tokens_per_s > 0 ? 1e6 / c.step.tokens_per_s : 0.0, c.cost_usd_per_million_tokens};
}

std::vector<size_t> sweep_frontier(const std::vector<SweepRow>& rows) {
  const bool job = sweep_has_job(rows);
  std::vector<SweepPoint> points;
  for (const auto& r : rows) points.push_back(sweep_point(r, job));
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return points[a].time_s != points[b].time_s ? points[a].time_s < points[b].time_s
                                                : points[a].cost_usd < points[b].cost_usd;
  });
  // Fastest first: a row is on the frontier when it is cheaper than every faster (or as fast) row.
  std::vector<size_t> frontier;
  for (size_t i : order)
    if (frontier.empty() || points[i].cost_usd < points[frontier.back()].cost_usd) frontier.push_back(i);
  return frontier;
}

namespace {

struct Cells {
  std::vector<std::string> header{"gpu", "gpus", "strategy", "micro_batch", "checkpointing", "memory_GiB",
                                  "step_time_s", "tokens_per_s", "mfu_pct", "job_time", "job_time_s", "cost_usd"};
  static std::vector<std::string> row(const SweepRow& r) {
    const RankedCandidate& c = r.result;
    return {r.gpu,
            std::to_string(r.gpus),
            c.candidate.name,
            std::to_string(c.candidate.micro_batch),
            to_string(c.candidate.checkpointing),
            format_fixed(c.memory.per_gpu.total / double(1LL << 30), 2),
            format_fixed(c.step.step_time_s, 4),
            format_fixed(c.step.tokens_per_s, 0),
            format_fixed(c.step.mfu * 100, 1),
            c.has_job ? format_duration(c.job_time_s) : "-",
            c.has_job ? format_fixed(c.job_time_s, 0) : "",
            c.has_job ? format_fixed(c.cost_usd, 2) : ""};
  }
};

}  // namespace

std::string sweep_table(const std::vector<SweepRow>& rows) {
  Cells cells;
  std::vector<std::vector<std::string>> all{cells.header};
  for (const auto& r : rows) all.push_back(Cells::row(r));
  std::vector<size_t> width(cells.header.size(), 0);
  for (const auto& line : all)
    for (size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  std::ostringstream out;
  for (const auto& line : all) {
    for (size_t i = 0; i < line.size(); ++i) out << (i ? "  " : "") << std::setw(static_cast<int>(width[i])) << line[i];
    out << "\n";
  }
  if (rows.empty()) out << "(no plan fits within the limits)\n";
  return out.str();
}

std::string sweep_csv(const std::vector<SweepRow>& rows) {
  Cells cells;
  std::ostringstream out;
  auto write = [&](const std::vector<std::string>& line) {
    // RFC 4180: a field holding a comma or a quote is quoted (a composition's name, "tp=2,dp_shard=2").
    for (size_t i = 0; i < line.size(); ++i) {
      out << (i ? "," : "");
      if (line[i].find_first_of(",\"") == std::string::npos) {
        out << line[i];
        continue;
      }
      out << '"';
      for (char c : line[i]) out << (c == '"' ? "\"\"" : std::string(1, c));
      out << '"';
    }
    out << "\n";
  };
  write(cells.header);
  for (const auto& r : rows) write(Cells::row(r));
  return out.str();
}

std::string sweep_markdown(const std::vector<SweepRow>& rows) {
  Cells cells;
  std::ostringstream out;
  auto write = [&](const std::vector<std::string>& line) {
    out << "|";
    for (const auto& cell : line) out << " " << cell << " |";
    out << "\n";
  };
  write(cells.header);
  out << "|";
  for (size_t i = 0; i < cells.header.size(); ++i) out << " --- |";
  out << "\n";
  for (const auto& r : rows) write(Cells::row(r));
  return out.str();
}

nlohmann::json sweep_json(const std::vector<SweepRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json c = ranked_candidate_json(r.result);
    c["gpu"] = r.gpu;
    c["gpus"] = r.gpus;
    j.push_back(c);
  }
  return j;
}

}  // namespace ftplan
