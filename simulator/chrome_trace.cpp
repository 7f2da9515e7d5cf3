#include "simulator/chrome_trace.h"

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

void chrome_trace_write(const std::string& path, const OpGraph& g, const Schedule& schedule) {
  write_file_atomically(path, chrome_trace_json(g, schedule).dump());
}

}  // namespace ftplan::sim
