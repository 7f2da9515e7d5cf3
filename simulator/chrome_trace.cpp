#include "simulator/chrome_trace.h"

#include <algorithm>

#include "planner/json_fields.h"

namespace ftplan::sim {
namespace {

constexpr double kMicrosecondsPerSecond = 1e6;
constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json metadata(const char* name, int pid, int tid, const std::string& value) {
  return {{"ph", "M"}, {"name", name}, {"pid", pid}, {"tid", tid}, {"args", {{"name", value}}}};
}

}  // namespace

nlohmann::json chrome_trace_json(const OpGraph& g, const Schedule& schedule) {
  nlohmann::json events = nlohmann::json::array();
  const std::string represented =
      g.num_ranks < g.num_ranks_represented
          ? " (stands for all " + std::to_string(g.num_ranks_represented) + " GPUs)"
          : std::string();
  for (int r = 0; r < g.num_ranks; ++r) {
    events.push_back(metadata("process_name", r, 0, "rank " + std::to_string(r) + represented));
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r}, {"tid", 0},
                      {"args", {{"sort_index", r}}}});
    for (int s = 0; s < kStreamCount; ++s)
      events.push_back(metadata("thread_name", r, s, stream_name(static_cast<Stream>(s))));
  }
  for (OpId v = 0; v < graph_op_count(g); ++v) {
    const Op& op = graph_op(g, v);
    nlohmann::json args = {{"layer", op.layer}, {"micro_batch", op.micro_batch}};
    if (op.bytes) args["bytes"] = op.bytes;
    if (op.allocated_bytes) args["allocated_bytes"] = op.allocated_bytes;
    if (op.freed_bytes) args["freed_bytes"] = op.freed_bytes;
    events.push_back({{"ph", "X"},
                      {"name", op.label},
                      {"cat", op_kind_name(op.kind)},
                      {"pid", op.rank},
                      {"tid", static_cast<int>(op.stream)},
                      {"ts", schedule.ops[v].start_s * kMicrosecondsPerSecond},
                      {"dur", op.duration_s * kMicrosecondsPerSecond},
                      {"args", std::move(args)}});
  }
  for (const RankTimeline& rt : schedule.ranks) {
    for (const MemorySample& m : rt.memory)
      events.push_back({{"ph", "C"},
                        {"name", "memory"},
                        {"pid", rt.rank},
                        {"tid", 0},
                        {"ts", m.time_s * kMicrosecondsPerSecond},
                        {"args", {{"GiB", static_cast<double>(m.bytes) / kBytesPerGiB}}}});
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

nlohmann::json chrome_trace_json(const OpGraph& g, const Schedule& schedule, const Parallelism& layout, int max_ranks) {
  const int64_t gpus = layout.gpus();
  if (gpus > max_ranks || gpus <= g.num_ranks) return chrome_trace_json(g, schedule);
  const nlohmann::json classes = chrome_trace_json(g, schedule);
  const int64_t per_stage = gpus / std::max<int64_t>(1, layout.pp);
  auto class_of = [&](int64_t r) { return g.num_ranks > 1 ? static_cast<int>(r / per_stage) : 0; };
  nlohmann::json events = nlohmann::json::array();
  for (int64_t r = 0; r < gpus; ++r) {
    const int64_t tp = r % layout.tp, cp = r / layout.tp % layout.cp, shard = r / (layout.tp * layout.cp) % layout.dp_shard,
                  rep = r / (layout.tp * layout.cp * layout.dp_shard) % layout.dp_replicate, pp = r / per_stage;
    const std::string who = "rank " + std::to_string(r) + " (tp " + std::to_string(tp) + ", cp " + std::to_string(cp) +
                            ", dp_shard " + std::to_string(shard) + ", dp_replicate " + std::to_string(rep) + ", pp " +
                            std::to_string(pp) + ")";
    const int cls = class_of(r);
    for (const auto& e : classes["traceEvents"]) {
      if (e["pid"].get<int>() != cls) continue;
      nlohmann::json copy = e;
      copy["pid"] = r;
      if (copy["ph"] == "M" && copy["name"] == "process_name") copy["args"]["name"] = who;
      if (copy["ph"] == "M" && copy["name"] == "process_sort_index") copy["args"]["sort_index"] = r;
      events.push_back(std::move(copy));
    }
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

void chrome_trace_write(const std::string& path, const OpGraph& g, const Schedule& schedule) {
  write_file_atomically(path, chrome_trace_json(g, schedule).dump());
}

}  // namespace ftplan::sim
