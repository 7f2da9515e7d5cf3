#include "simulator/scheduler.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>
#include <utility>

namespace ftplan::sim {
namespace {

using Interval = std::pair<double, double>;

// Length of the union of intervals (sorted in place).
double union_length(std::vector<Interval>& intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0.0, lo = 0.0, hi = 0.0;
  bool open = false;
  for (const auto& [a, b] : intervals) {
    if (!open || a > hi) {
      if (open) total += hi - lo;
      lo = a;
      hi = b;
      open = true;
    } else {
      hi = std::max(hi, b);
    }
  }
  if (open) total += hi - lo;
  return total;
}

struct MemoryEvent {
  double time_s;
  int type;  // 0: free, 1: allocation (frees first at one instant)
  std::size_t allocation;
  bool operator<(const MemoryEvent& o) const {
    if (time_s != o.time_s) return time_s < o.time_s;
    if (type != o.type) return type < o.type;
    return allocation < o.allocation;
  }
};

// Walks one rank's memory events instant by instant. Returns the alive flags after the instant
// `stop_group` (all instants when stop_group is npos) and fills the timeline's peak and samples.
std::vector<char> memory_walk(const OpGraph& g, const std::vector<MemoryEvent>& events,
                              std::size_t stop_group, RankTimeline* timeline, std::size_t* peak_group) {
  std::vector<char> alive(g.allocations.size(), 0);
  std::vector<std::size_t> deferred;
  int64_t current = 0;
  std::size_t group = 0;
  for (std::size_t i = 0; i < events.size(); ++group) {
    const double t = events[i].time_s;
    deferred.clear();
    for (; i < events.size() && events[i].time_s == t && events[i].type == 0; ++i) {
      const std::size_t a = events[i].allocation;
      if (alive[a]) {
        alive[a] = 0;
        current -= g.allocations[a].bytes;
      } else {
        deferred.push_back(a);  // allocated and freed at this same instant (zero-length ops)
      }
    }
    for (; i < events.size() && events[i].time_s == t; ++i) {
      alive[events[i].allocation] = 1;
      current += g.allocations[events[i].allocation].bytes;
    }
    if (group == stop_group) return alive;
    if (timeline) {
      if (current > timeline->peak_memory_bytes) {
        timeline->peak_memory_bytes = current;
        timeline->peak_time_s = t;
        *peak_group = group;
      }
      timeline->memory.push_back({t, current});
    }
    for (std::size_t a : deferred) {
      if (!alive[a])
        throw std::logic_error("schedule_run: allocation \"" + g.allocations[a].label +
                               "\" is freed before it is allocated");
      alive[a] = 0;
      current -= g.allocations[a].bytes;
    }
  }
  return alive;
}

}  // namespace

Schedule schedule_run(const OpGraph& g) {
  const std::size_t n = graph_op_count(g);
  const std::size_t resources = static_cast<std::size_t>(g.num_ranks) * kStreamCount;
  auto resource_of = [&](OpId v) {
    const Op& op = (*g.graph)[v];
    return static_cast<std::size_t>(op.rank) * kStreamCount + static_cast<std::size_t>(op.stream);
  };

  Schedule out;
  out.ops.assign(n, OpTiming{});
  std::vector<std::size_t> pending = graph_in_degrees(g);
  using MinQueue = std::priority_queue<OpId, std::vector<OpId>, std::greater<OpId>>;
  std::vector<MinQueue> ready(resources);
  std::vector<char> busy(resources, 0), dirty(resources, 1);
  std::vector<std::size_t> dirty_list(resources);
  for (std::size_t r = 0; r < resources; ++r) dirty_list[r] = r;
  using Event = std::pair<double, OpId>;  // (end time, op)
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> running;

  for (OpId v = 0; v < n; ++v) {
    if (pending[v] == 0) ready[resource_of(v)].push(v);
  }
  auto dispatch = [&](double now) {
    for (std::size_t r : dirty_list) {
      dirty[r] = 0;
      if (busy[r] || ready[r].empty()) continue;
      const OpId v = ready[r].top();
      ready[r].pop();
      busy[r] = 1;
      out.ops[v] = {now, now + (*g.graph)[v].duration_s};
      running.push({out.ops[v].end_s, v});
    }
    dirty_list.clear();
  };
  auto mark = [&](std::size_t r) {
    if (!dirty[r]) {
      dirty[r] = 1;
      dirty_list.push_back(r);
    }
  };

  std::size_t done = 0;
  dispatch(0.0);
  while (!running.empty()) {
    const double now = running.top().first;
    while (!running.empty() && running.top().first == now) {
      const OpId v = running.top().second;
      running.pop();
      ++done;
      const std::size_t r = resource_of(v);
      busy[r] = 0;
      mark(r);
      for (auto [e, end] = boost::out_edges(v, *g.graph); e != end; ++e) {
        const OpId w = boost::target(*e, *g.graph);
        if (--pending[w] == 0) {
          ready[resource_of(w)].push(w);
          mark(resource_of(w));
        }
      }
    }
    dispatch(now);
    out.step_time_s = std::max(out.step_time_s, now);
  }
  if (done != n)
    throw std::logic_error("schedule_run: " + std::to_string(n - done) +
                           " ops never became ready (the op graph has a cycle)");

  // Per-rank time accounting.
  const int ranks = g.num_ranks;
  std::vector<std::vector<Interval>> compute(ranks), comm(ranks), host(ranks);
  std::vector<double> pass_busy(ranks, 0.0);  // forward/backward/recompute
  double pass_end = 0.0;
  out.ranks.assign(ranks, RankTimeline{});
  for (OpId v = 0; v < n; ++v) {
    const Op& op = (*g.graph)[v];
    const Interval iv{out.ops[v].start_s, out.ops[v].end_s};
    RankTimeline& rt = out.ranks[op.rank];
    rt.finish_s = std::max(rt.finish_s, iv.second);
    if (op.stream == Stream::compute) compute[op.rank].push_back(iv);
    else if (op.stream == Stream::cpu) host[op.rank].push_back(iv);
    else comm[op.rank].push_back(iv);
    if (op.kind == OpKind::forward || op.kind == OpKind::backward_input ||
        op.kind == OpKind::backward_weight || op.kind == OpKind::recompute) {
      pass_busy[op.rank] += op.duration_s;
      pass_end = std::max(pass_end, iv.second);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    RankTimeline& rt = out.ranks[r];
    rt.rank = r;
    std::vector<Interval> all = compute[r];
    const double busy_compute = union_length(all);
    all.insert(all.end(), comm[r].begin(), comm[r].end());
    const double busy_gpu = union_length(all);
    all.insert(all.end(), host[r].begin(), host[r].end());
    const double busy_any = union_length(all);
    rt.compute_busy_s = busy_compute;
    rt.exposed_comm_s = busy_gpu - busy_compute;
    rt.exposed_host_s = busy_any - busy_gpu;
    rt.idle_s = out.step_time_s - busy_any;
    if (ranks > 1 && pass_end > 0.0) rt.bubble_fraction = 1.0 - pass_busy[r] / pass_end;
  }

  // Memory over time, the peak and what is alive at it.
  std::vector<std::vector<MemoryEvent>> events(ranks);
  for (std::size_t a = 0; a < g.allocations.size(); ++a) {
    const Allocation& al = g.allocations[a];
    if (al.bytes == 0) continue;
    events[al.rank].push_back({al.alloc_op == kNoOp ? 0.0 : out.ops[al.alloc_op].start_s, 1, a});
    if (al.free_op != kNoOp) events[al.rank].push_back({out.ops[al.free_op].end_s, 0, a});
  }
  for (int r = 0; r < ranks; ++r) {
    std::sort(events[r].begin(), events[r].end());
    RankTimeline& rt = out.ranks[r];
    std::size_t peak_group = static_cast<std::size_t>(-1);
    memory_walk(g, events[r], static_cast<std::size_t>(-1), &rt, &peak_group);
    if (peak_group == static_cast<std::size_t>(-1)) continue;
    const std::vector<char> alive = memory_walk(g, events[r], peak_group, nullptr, nullptr);
    for (std::size_t a = 0; a < alive.size(); ++a)
      if (alive[a]) rt.alive_at_peak.push_back(a);
    std::stable_sort(rt.alive_at_peak.begin(), rt.alive_at_peak.end(), [&](std::size_t x, std::size_t y) {
      return g.allocations[x].bytes > g.allocations[y].bytes;
    });
  }
  return out;
}

}  // namespace ftplan::sim
