#include "executor/device_mesh.h"

#include "planner/errors.h"

namespace ftexec {

RankGroup mesh_group(int64_t rank, const ftplan::GroupPlacement& g) {
  const int64_t coord = (rank / g.stride) % g.size;
  const int64_t base = rank - coord * g.stride;
  RankGroup out;
  for (int64_t i = 0; i < g.size; ++i) out.push_back(static_cast<int>(base + i * g.stride));
  return out;
}

namespace {
ftplan::GroupPlacement placement(const ftplan::Parallelism& p, const std::string& dim) {
  if (dim == "tp") return ftplan::tp_group(p);
  if (dim == "cp") return ftplan::cp_group(p);
  if (dim == "dp_shard") return {p.dp_shard, p.tp * p.cp};
  if (dim == "dp_replicate") return ftplan::replicate_group(p);
  if (dim == "dp") return {p.dp_replicate * p.dp_shard, p.tp * p.cp};
  if (dim == "pp") return ftplan::pp_group(p);
  ftplan::fail_input("device mesh: no dimension \"" + dim + "\" (tp, cp, dp_shard, dp_replicate, dp, pp)");
}
}  // namespace

DeviceMesh::DeviceMesh(Comm& world, const ftplan::Parallelism& layout) : world_(world), layout_(layout) {
  if (layout.gpus() != world.world())
    ftplan::fail_input("parallel layout " + ftplan::name(layout) + ": " + std::to_string(layout.gpus()) +
                       " ranks != WORLD_SIZE(" + std::to_string(world.world()) + ")");
  // Same order on every rank: a group's members are all building it at once, so no rank waits on a
  // peer that is building another group.
  tp_ = world.split(group("tp"), "tp");
  cp_ = world.split(group("cp"), "cp");
  dp_ = world.split(mesh_group(world.rank(), ftplan::grad_group(layout)), "dp");  // dp x cp
  pp_ = world.split(group("pp"), "pp");
}

int64_t DeviceMesh::coordinate(const std::string& dim) const {
  const auto g = placement(layout_, dim);
  return (world_.rank() / g.stride) % g.size;
}

RankGroup DeviceMesh::group(const std::string& dim) const { return mesh_group(world_.rank(), placement(layout_, dim)); }

std::vector<std::pair<std::string, CommStats>> DeviceMesh::stats() const {
  std::vector<std::pair<std::string, CommStats>> out{{"tp", tp_->stats()}};
  if (layout_.cp > 1) out.emplace_back("cp", cp_->stats());
  for (auto& g : std::vector<std::pair<std::string, CommStats>>{{"dp", dp_->stats()}, {"pp", pp_->stats()}, {"world", world_.stats()}})
    out.push_back(g);
  return out;
}

void DeviceMesh::reset_stats() {
  tp_->reset_stats();
  cp_->reset_stats();
  dp_->reset_stats();
  pp_->reset_stats();
}

}  // namespace ftexec
