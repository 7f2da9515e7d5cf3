#include "planner/hardware_spec.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <set>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/connected_components.hpp>
#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/json_fields.h"

namespace ftplan {
namespace {

// Bounds that catch typos (a missing exponent, bits for bytes) rather than describe real hardware.
constexpr int64_t kMiB = INT64_C(1) << 20;
constexpr int64_t kTiB = INT64_C(1) << 40;
constexpr double kMaxFlops = 1e17;                 // 100 PFLOP/s per device
constexpr double kMaxBandwidthBytesPerS = 1e14;    // 100 TB/s
constexpr int64_t kMaxGpusPerNode = 1024;
constexpr int64_t kMaxNvlinkDomain = 1024;         // NVL72 today; NVL576 announced

// "YYYY-MM", a month from 2000-01 to 2099-12: when a rental price was read.
bool is_year_month(const std::string& s) {
  if (s.size() != 7 || s[4] != '-') return false;
  for (size_t i : {0u, 1u, 2u, 3u, 5u, 6u})
    if (s[i] < '0' || s[i] > '9') return false;
  const int year = std::stoi(s.substr(0, 4)), month = std::stoi(s.substr(5, 2));
  return year >= 2000 && year <= 2099 && month >= 1 && month <= 12;
}

// The figures that must each have an entry in "sources" (and "topology" when the file has one).
constexpr const char* kSourcedFigures[] = {
    "memory_bytes",           "peak_flops_fp32",         "peak_flops_tf32",
    "peak_flops_bf16",        "peak_flops_fp8",          "hbm_bandwidth_bytes_per_s",
    "intra_node_link",        "gpus_per_node",           "nvlink_domain_size",
    "pcie_only",              "inter_node_bandwidth_bytes_per_s", "pcie_host_bandwidth_bytes_per_s",
    "host_memory_bytes_per_node", "price_usd_per_gpu_hour", "price_date",
    "matmul_efficiency",      "comm_latency_s",          "framework_overhead_bytes"};

// Collects every problem of one file so that a user fixes them all in one pass (STYLE.md rule 4).
// Each check runs a strict reader; an InputError it throws becomes one line of the final message.
class Problems {
 public:
  void check(const std::function<void()>& read) {
    try {
      read();
    } catch (const InputError& e) {
      lines_.push_back(e.what());
    }
  }
  void add(const std::string& line) { lines_.push_back(line); }
  void append(const Problems& other) { lines_.insert(lines_.end(), other.lines_.begin(), other.lines_.end()); }
  bool empty() const { return lines_.empty(); }
  // One problem reads as one line; several are listed one per line, the first on the first line.
  [[noreturn]] void throw_all() const {
    std::string msg = lines_.front();
    if (lines_.size() > 1) {
      msg += " (and " + std::to_string(lines_.size() - 1) + " more problem" +
             (lines_.size() > 2 ? "s" : "") + ")";
      for (size_t i = 1; i < lines_.size(); ++i) msg += "\n  " + lines_[i];
    }
    fail_input(msg);
  }

 private:
  std::vector<std::string> lines_;
};

// gpu0..gpuN-1 each linked to one "switch" vertex: what a file without a topology means.
Topology star_topology(int64_t gpus, double bandwidth_bytes_per_s, const std::string& link_kind) {
  Topology t;
  t.vertices.push_back({"switch", "switch"});
  for (int64_t i = 0; i < gpus; ++i) {
    std::string gpu = "gpu" + std::to_string(i);
    t.vertices.push_back({gpu, "gpu"});
    t.links.push_back({gpu, "switch", bandwidth_bytes_per_s, link_kind});
  }
  return t;
}

Topology read_topology(const nlohmann::json& j, const std::string& where, Problems& problems) {
  Topology t;
  problems.check([&] { require_known_keys(j, {"vertices", "links"}, where); });
  if (!j.is_object()) return t;
  const auto vertices = j.find("vertices");
  const auto links = j.find("links");
  const bool vertices_ok = vertices != j.end() && vertices->is_array() && !vertices->empty();
  const bool links_ok = links != j.end() && links->is_array();
  if (!vertices_ok) problems.add(where + ": vertices: expected a non-empty array");
  if (!links_ok) problems.add(where + ": links: expected an array");
  if (!vertices_ok || !links_ok) return t;

  for (size_t i = 0; i < vertices->size(); ++i) {
    const auto& v = (*vertices)[i];
    const std::string w = where + ": vertices[" + std::to_string(i) + "]";
    TopologyVertex vertex;
    problems.check([&] {
      require_known_keys(v, {"id", "kind"}, w);
      vertex.id = read_string(v, "id", w);
      vertex.kind = read_string(v, "kind", w);
      if (vertex.id.empty()) fail_input(w + ": id: empty");
      if (vertex.kind != "gpu" && vertex.kind != "switch" && vertex.kind != "cpu" && vertex.kind != "nic")
        fail_input(w + ": kind: '" + vertex.kind + "' is not one of gpu, switch, cpu, nic");
    });
    t.vertices.push_back(vertex);
  }
  for (size_t i = 0; i < links->size(); ++i) {
    const auto& l = (*links)[i];
    const std::string w = where + ": links[" + std::to_string(i) + "]";
    TopologyLink link;
    problems.check([&] {
      require_known_keys(l, {"a", "b", "kind", "bandwidth_bytes_per_s"}, w);
      link.a = read_string(l, "a", w);
      link.b = read_string(l, "b", w);
      link.kind = read_string(l, "kind", w);
      // Positive: a zero-bandwidth link would make every route through it infinitely slow.
      link.bandwidth_bytes_per_s = read_number(l, "bandwidth_bytes_per_s", w, 1e6, kMaxBandwidthBytesPerS);
    });
    t.links.push_back(link);
  }
  return t;
}

// Ids unique, links between existing distinct vertices, exactly `gpus` GPU vertices (unless
// gpus < 0: gpus_per_node itself was bad), connected.
void check_topology(const Topology& t, int64_t gpus, const std::string& where, Problems& problems) {
  std::map<std::string, size_t> index;  // vertex id -> graph vertex
  int64_t gpu_vertices = 0;
  for (const auto& v : t.vertices) {
    if (v.id.empty()) continue;  // already reported
    if (!index.emplace(v.id, index.size()).second)
      problems.add(where + ": vertices: duplicate id '" + v.id + "'");
    if (v.kind == "gpu") ++gpu_vertices;
  }
  if (gpus >= 0 && gpu_vertices != gpus)
    problems.add(where + ": vertices: " + std::to_string(gpu_vertices) + " of kind \"gpu\", but gpus_per_node is " +
                 std::to_string(gpus));

  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS>;
  Graph graph(index.size());
  for (size_t i = 0; i < t.links.size(); ++i) {
    const auto& l = t.links[i];
    const std::string w = where + ": links[" + std::to_string(i) + "]";
    if (l.a.empty() || l.b.empty()) continue;  // already reported
    auto a = index.find(l.a), b = index.find(l.b);
    if (a == index.end()) problems.add(w + ": a: no vertex '" + l.a + "'");
    if (b == index.end()) problems.add(w + ": b: no vertex '" + l.b + "'");
    if (a == index.end() || b == index.end()) continue;
    if (a == b) {
      problems.add(w + ": links '" + l.a + "' to itself");
      continue;
    }
    boost::add_edge(a->second, b->second, graph);
  }
  if (index.empty()) return;
  std::vector<int> component(boost::num_vertices(graph));
  int components = boost::connected_components(graph, component.data());
  if (components > 1) {
    // Name a vertex that the first vertex cannot reach, so the user knows which link is missing.
    std::string first, unreachable;
    for (const auto& [id, i] : index) {
      if (i == 0) first = id;
      if (component[i] != component[0] && unreachable.empty()) unreachable = id;
    }
    problems.add(where + ": links: the graph is not connected (" + std::to_string(components) +
                 " parts; '" + unreachable + "' cannot reach '" + first + "')");
  }
}

HardwareSpec parse(const nlohmann::json& j, const std::string& id, const std::string& where) {
  if (!j.is_object()) fail_input(where + ": expected a JSON object");
  Problems problems;
  HardwareSpec hw;
  hw.id = id;

  problems.check([&] {
    require_known_keys(j, {"name", "kind", "memory_bytes", "peak_flops", "hbm_bandwidth_bytes_per_s",
                           "intra_node_link", "gpus_per_node", "nvlink_domain_size", "pcie_only",
                           "inter_node_bandwidth_bytes_per_s", "pcie_host_bandwidth_bytes_per_s",
                           "host_memory_bytes_per_node", "price_usd_per_gpu_hour", "price_date",
                           "matmul_efficiency", "comm_latency_s", "framework_overhead_bytes",
                           "usable_memory_bytes", "gemm_efficiency", "pcie_slot", "topology", "sources"},
                       where);
  });
  problems.check([&] {
    hw.name = read_string(j, "name", where);
    if (hw.name.empty()) fail_input(where + ": name: empty");
  });
  problems.check([&] {
    hw.kind = read_string(j, "kind", where);
    if (hw.kind != "gpu" && hw.kind != "cpu")
      fail_input(where + ": kind: '" + hw.kind + "' is not \"gpu\" or \"cpu\"");
  });
  problems.check([&] { hw.memory_bytes = read_int(j, "memory_bytes", where, kMiB, kTiB); });
  problems.check([&] {
    if (!has_field(j, "usable_memory_bytes")) return;
    hw.usable_memory_bytes = read_int(j, "usable_memory_bytes", where, kMiB, kTiB);
    if (hw.memory_bytes > 0 && hw.usable_memory_bytes > hw.memory_bytes)
      fail_input(where + ": usable_memory_bytes: " + std::to_string(hw.usable_memory_bytes) +
                 " is more than memory_bytes " + std::to_string(hw.memory_bytes));
    if (!j.contains("sources") || !j.at("sources").is_object() || !j.at("sources").contains("usable_memory_bytes"))
      fail_input(where + ": sources: missing source for usable_memory_bytes");
  });
  problems.check([&] {
    const std::string w = where + ": peak_flops";
    if (!has_field(j, "peak_flops")) fail_input(w + ": missing");
    const auto& pf = j.at("peak_flops");
    require_known_keys(pf, {"fp32", "tf32", "bf16", "fp8"}, w);
    Problems inner;  // each precision on its own, so one bad figure does not hide another
    inner.check([&] { hw.peak_flops_fp32 = read_number(pf, "fp32", w, 1e6, kMaxFlops); });
    inner.check([&] { hw.peak_flops_tf32 = read_number(pf, "tf32", w, 0.0, kMaxFlops); });
    inner.check([&] { hw.peak_flops_bf16 = read_number(pf, "bf16", w, 1e6, kMaxFlops); });
    inner.check([&] { hw.peak_flops_fp8 = read_number(pf, "fp8", w, 0.0, kMaxFlops); });
    if (!inner.empty()) inner.throw_all();
  });
  problems.check([&] {
    hw.hbm_bandwidth_bytes_per_s = read_number(j, "hbm_bandwidth_bytes_per_s", where, 1e8, kMaxBandwidthBytesPerS);
  });
  problems.check([&] {
    const std::string w = where + ": intra_node_link";
    if (!has_field(j, "intra_node_link")) fail_input(w + ": missing");
    const auto& link = j.at("intra_node_link");
    require_known_keys(link, {"type", "bandwidth_bytes_per_s"}, w);
    hw.intra_node_link = read_string(link, "type", w);
    hw.intra_node_bandwidth_bytes_per_s = read_number(link, "bandwidth_bytes_per_s", w, 1e6, kMaxBandwidthBytesPerS);
  });
  bool gpus_ok = false;
  problems.check([&] {
    hw.gpus_per_node = read_int(j, "gpus_per_node", where, 1, kMaxGpusPerNode);
    gpus_ok = true;
  });
  bool domain_ok = false, pcie_only_ok = false;
  problems.check([&] {
    hw.nvlink_domain_size = read_int(j, "nvlink_domain_size", where, 1, kMaxNvlinkDomain);
    domain_ok = true;
  });
  problems.check([&] {
    hw.pcie_only = read_bool(j, "pcie_only", where);
    pcie_only_ok = true;
  });
  // A card without NVLink or Infinity Fabric is its own domain.
  if (domain_ok && pcie_only_ok && hw.pcie_only && hw.nvlink_domain_size != 1)
    problems.add(where + ": nvlink_domain_size: " + std::to_string(hw.nvlink_domain_size) +
                 ", but pcie_only is true (a PCIe-only card is a domain of 1)");
  problems.check([&] {
    hw.inter_node_bandwidth_bytes_per_s =
        read_number(j, "inter_node_bandwidth_bytes_per_s", where, 1e6, kMaxBandwidthBytesPerS);
  });
  problems.check([&] {
    hw.pcie_host_bandwidth_bytes_per_s =
        read_number(j, "pcie_host_bandwidth_bytes_per_s", where, 1e6, kMaxBandwidthBytesPerS);
    hw.host_memory_bytes_per_node = read_int(j, "host_memory_bytes_per_node", where, INT64_C(1) << 30, INT64_C(64) << 40);
  });
  problems.check([&] {
    if (!has_field(j, "pcie_slot")) return;
    hw.pcie_slot = parse_pcie_slot(read_string(j, "pcie_slot", where), where + ": pcie_slot");
    hw.pcie_link = hw.pcie_slot;
  });
  problems.check([&] { hw.price_usd_per_gpu_hour = read_number(j, "price_usd_per_gpu_hour", where, 0.0, 1000.0); });
  problems.check([&] {
    hw.price_date = read_string(j, "price_date", where);
    if (!is_year_month(hw.price_date))
      fail_input(where + ": price_date: '" + hw.price_date + "' is not YYYY-MM (the month the price was read, e.g. 2026-07)");
  });
  // An efficiency is a fraction of peak; below 1% it is surely a percentage typed as a fraction.
  problems.check([&] { hw.matmul_efficiency = read_number(j, "matmul_efficiency", where, 0.01, 1.0); });
  problems.check([&] {
    if (!has_field(j, "gemm_efficiency")) return;
    const auto& g = j.at("gemm_efficiency");
    const std::string w = where + ": gemm_efficiency";
    if (!g.is_object()) fail_input(w + ": expected an object {\"16\": .., \"64\": .., \"512\": .., \"4096\": ..}");
    for (auto it = g.begin(); it != g.end(); ++it)
      if (std::find_if(std::begin(kGemmAnchorKeys), std::end(kGemmAnchorKeys), [&](const char* k) { return it.key() == k; }) ==
          std::end(kGemmAnchorKeys))
        fail_input(w + ": " + it.key() + ": unknown key (the anchors are 16, 64, 512, 4096)");
    std::vector<double> anchors;
    for (const char* k : kGemmAnchorKeys) anchors.push_back(read_number(g, k, w, 0.01, 1.0));
    hw.gemm_efficiency_bf16 = anchors;
  });
  problems.check([&] { hw.comm_latency_s = read_number(j, "comm_latency_s", where, 0.0, 1.0); });
  problems.check([&] {
    hw.framework_overhead_bytes = read_int(j, "framework_overhead_bytes", where, 0, kTiB);
    if (hw.memory_bytes > 0 && hw.framework_overhead_bytes >= hw.memory_bytes)
      fail_input(where + ": framework_overhead_bytes: " + std::to_string(hw.framework_overhead_bytes) +
                 " leaves nothing of memory_bytes " + std::to_string(hw.memory_bytes));
  });

  // Sources: one non-empty string per figure, no entries for figures that do not exist.
  const bool has_topology = has_field(j, "topology");
  problems.check([&] {
    const std::string w = where + ": sources";
    if (!has_field(j, "sources")) fail_input(w + ": missing");
    const auto& s = j.at("sources");
    if (!s.is_object()) fail_input(w + ": expected an object");
    Problems inner;
    for (auto it = s.begin(); it != s.end(); ++it) {
      bool known = it.key() == "topology" || (it.key() == "usable_memory_bytes" && has_field(j, "usable_memory_bytes")) ||
                   (it.key() == "pcie_slot" && has_field(j, "pcie_slot")) ||
                   (it.key() == "gemm_efficiency" && has_field(j, "gemm_efficiency"));
      for (const char* f : kSourcedFigures) known = known || it.key() == f;
      if (!known) inner.add(w + ": " + it.key() + ": unknown key (not a figure of this file)");
      else if (!it->is_string() || it->get<std::string>().empty())
        inner.add(w + ": " + it.key() + ": expected a non-empty string");
      else hw.sources[it.key()] = it->get<std::string>();
    }
    for (const char* f : kSourcedFigures)
      if (!s.contains(f)) inner.add(w + ": missing source for " + f);
    if (has_topology && !s.contains("topology")) inner.add(w + ": missing source for topology");
    if (has_field(j, "gemm_efficiency") && !s.contains("gemm_efficiency")) inner.add(w + ": missing source for gemm_efficiency");
    if (has_field(j, "pcie_slot") && !s.contains("pcie_slot")) inner.add(w + ": missing source for pcie_slot");
    if (!inner.empty()) inner.throw_all();
  });

  if (has_topology) {
    Problems topology_problems;  // its own list: the graph checks need a well-formed topology
    hw.topology = read_topology(j.at("topology"), where + ": topology", topology_problems);
    if (topology_problems.empty())
      check_topology(hw.topology, gpus_ok ? hw.gpus_per_node : -1, where + ": topology", topology_problems);
    problems.append(topology_problems);
  } else if (problems.empty()) {
    hw.topology = star_topology(hw.gpus_per_node, hw.intra_node_bandwidth_bytes_per_s, hw.intra_node_link);
  }

  if (!problems.empty()) problems.throw_all();
  return hw;
}

}  // namespace

// PCI-SIG's per-lane signalling rate and line encoding, per direction: 1.0 2.5 GT/s and 2.0 5 GT/s with
// 8b/10b; 3.0 8 GT/s, 4.0 16 GT/s and 5.0 32 GT/s with 128b/130b; 6.0 64 GT/s PAM4 in 256-byte FLITs of
// 242 payload bytes.
double PcieSlot::bandwidth_bytes_per_s() const {
  static constexpr double kPerLane[] = {0.0, 2.5e9 * 8 / 10 / 8, 5e9 * 8 / 10 / 8, 8e9 * 128 / 130 / 8,
                                        16e9 * 128 / 130 / 8, 32e9 * 128 / 130 / 8, 64e9 * 242 / 256 / 8};
  return generation >= 1 && generation <= 6 ? kPerLane[generation] * lanes : 0.0;
}

std::string PcieSlot::to_string() const {
  return stated() ? std::to_string(generation) + ".0 x" + std::to_string(lanes) : std::string("none");
}

std::string PcieSlot::key() const {
  return stated() ? std::to_string(generation) + "x" + std::to_string(lanes) : std::string();
}

PcieSlot parse_pcie_slot(const std::string& text, const std::string& field) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t.rfind("gen", 0) == 0) t = t.substr(3);
  const auto x = t.find('x');
  const auto digits = [](const std::string& d) {
    return !d.empty() && d.size() <= 2 && std::all_of(d.begin(), d.end(), [](unsigned char c) { return std::isdigit(c); });
  };
  const bool shaped = x != std::string::npos && digits(t.substr(0, x)) && digits(t.substr(x + 1));
  PcieSlot slot;
  if (shaped) {
    slot.generation = std::stoi(t.substr(0, x));
    slot.lanes = std::stoi(t.substr(x + 1));
  }
  const bool lanes_ok = slot.lanes == 1 || slot.lanes == 2 || slot.lanes == 4 || slot.lanes == 8 || slot.lanes == 16;
  if (!shaped || slot.generation < 1 || slot.generation > 6 || !lanes_ok)
    fail_input(field + ": '" + text + "' is not a PCIe slot GENxLANES (generation 1-6, lanes 1, 2, 4, 8 or 16), e.g. 3x8");
  return slot;
}

HardwareSpec hardware_spec_from_json(const nlohmann::json& j, const std::string& id) {
  return parse(j, id, "hwdb/" + id + ".json");
}

HardwareSpec load_hardware(const std::string& id_or_path) {
  namespace fs = std::filesystem;
  const std::string path = resolve_data_file(id_or_path, "hwdb", "--gpu");
  const std::string id = fs::path(path).stem().string();
  // Shipped files are named as hwdb/<id>.json in messages; a user's file by the path they gave.
  const bool shipped = fs::path(path).parent_path() == fs::path(data_dir()) / "hwdb";
  return parse(read_json_file(path), id, shipped ? "hwdb/" + id + ".json" : path);
}

std::vector<std::string> list_hardware_ids() { return list_data_names("hwdb"); }

}  // namespace ftplan
