// Collectives: the α-β formulas checked exactly against hand arithmetic, the hierarchical
// all-reduce across nodes, and the ring bandwidth derived from topology graphs built by hand.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/collectives.h"
#include "planner/data_paths.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"
#include "planner/topology.h"

using Catch::Matchers::Contains;
using Catch::Matchers::WithinRel;
using ftplan::Collective;

namespace {

// Floating-point tolerance for formulas evaluated in a different order than by hand.
constexpr double kExact = 1e-12;

// Dual-socket PCIe box: gpu0, gpu1 on cpu0's root complex, gpu2, gpu3 on cpu1's, UPI between.
// `interleaved` puts gpu0, gpu2 on cpu0 and gpu1, gpu3 on cpu1 instead, so the index-order ring
// crosses the sockets at every hop.
ftplan::Topology dual_socket(double pcie, double upi, bool interleaved = false) {
  ftplan::Topology t;
  for (int k = 0; k < 4; ++k) t.vertices.push_back({"gpu" + std::to_string(k), "gpu"});
  t.vertices.push_back({"cpu0", "cpu"});
  t.vertices.push_back({"cpu1", "cpu"});
  for (int k = 0; k < 4; ++k) {
    const int socket = interleaved ? k % 2 : k / 2;
    t.links.push_back({"gpu" + std::to_string(k), "cpu" + std::to_string(socket), pcie, "pcie4"});
  }
  t.links.push_back({"cpu0", "cpu1", upi, "upi"});
  return t;
}

ftplan::Topology star(int gpus, double bandwidth) {
  ftplan::Topology t;
  t.vertices.push_back({"switch", "switch"});
  for (int k = 0; k < gpus; ++k) {
    t.vertices.push_back({"gpu" + std::to_string(k), "gpu"});
    t.links.push_back({"gpu" + std::to_string(k), "switch", bandwidth, "nvlink4"});
  }
  return t;
}

}  // namespace

TEST_CASE("ring all-reduce is 2(N-1)/N · M / B", "[comm]") {
  // M = 1e9 B, N = 8, B = 1e11 B/s: 2·7/8·1e9/1e11 = 0.0175 s.
  CHECK_THAT(ftplan::collective_time_s(Collective::all_reduce, 1e9, 8, 1e11, 0.0), WithinRel(0.0175, kExact));
  auto [M, N, B] = GENERATE(table<double, int64_t, double>({
      {1e9, 2, 1e11}, {1e9, 8, 1e11}, {2.5e8, 4, 2.2e10}, {16.06e9, 64, 2.3e11}, {13.6e6, 3, 1.2e10}}));
  CAPTURE(M, N, B);
  const double n = static_cast<double>(N);
  CHECK_THAT(ftplan::collective_time_s(Collective::all_reduce, M, N, B, 0.0), WithinRel(2 * (n - 1) / n * M / B, kExact));
  CHECK_THAT(ftplan::collective_time_s(Collective::reduce_scatter, M, N, B, 0.0), WithinRel((n - 1) / n * M / B, kExact));
  CHECK_THAT(ftplan::collective_time_s(Collective::all_gather, M, N, B, 0.0), WithinRel((n - 1) / n * M / B, kExact));
  CHECK_THAT(ftplan::collective_time_s(Collective::broadcast, M, N, B, 0.0), WithinRel(M / B, kExact));
  CHECK_THAT(ftplan::collective_time_s(Collective::send_recv, M, 2, B, 0.0), WithinRel(M / B, kExact));
  SECTION("an efficiency below 1 divides the bandwidth") {
    CHECK_THAT(ftplan::collective_time_s(Collective::all_reduce, M, N, B, 0.0, 0.5),
               WithinRel(2 * (n - 1) / n * M / (0.5 * B), kExact));
  }
}

TEST_CASE("wire bytes per GPU", "[comm]") {
  // Each GPU sends 2(N-1)/N·M in a ring all-reduce, (N-1)/N·M in reduce-scatter or all-gather.
  CHECK_THAT(ftplan::wire_bytes(Collective::all_reduce, 1e9, 8), WithinRel(1.75e9, kExact));
  CHECK_THAT(ftplan::wire_bytes(Collective::reduce_scatter, 1e9, 8), WithinRel(0.875e9, kExact));
  CHECK_THAT(ftplan::wire_bytes(Collective::all_gather, 1e9, 8), WithinRel(0.875e9, kExact));
  CHECK_THAT(ftplan::wire_bytes(Collective::broadcast, 1e9, 8), WithinRel(1e9, kExact));
  CHECK_THAT(ftplan::wire_bytes(Collective::send_recv, 1e9, 2), WithinRel(1e9, kExact));
  CHECK_THAT(ftplan::wire_bytes(Collective::all_reduce, 1e9, 2), WithinRel(1e9, kExact));
  // The formula's constants (collectives.h).
  CHECK(ftplan::collective_formula(Collective::all_reduce).scale == 2.0);
  CHECK(ftplan::collective_formula(Collective::all_reduce).offset == -1.0);
  CHECK(ftplan::collective_formula(Collective::reduce_scatter).scale == 1.0);
  CHECK(ftplan::collective_formula(Collective::broadcast).offset == 0.0);
}

TEST_CASE("the latency term is α per ring step", "[comm]") {
  // Ring all-reduce: 2(N-1) steps; reduce-scatter and all-gather: N-1; point-to-point: 1.
  const double alpha = 1e-5, M = 1e9, B = 1e11;
  auto N = GENERATE(as<int64_t>{}, 2, 4, 8, 16);
  CAPTURE(N);
  const double n = static_cast<double>(N);
  CHECK_THAT(ftplan::collective_time_s(Collective::all_reduce, M, N, B, alpha),
             WithinRel(alpha * 2 * (n - 1) + 2 * (n - 1) / n * M / B, kExact));
  CHECK_THAT(ftplan::collective_time_s(Collective::reduce_scatter, M, N, B, alpha),
             WithinRel(alpha * (n - 1) + (n - 1) / n * M / B, kExact));
  CHECK_THAT(ftplan::collective_time_s(Collective::send_recv, M, 2, B, alpha), WithinRel(alpha + M / B, kExact));
  // A tiny buffer costs the latency alone (to 1e-3: 1 byte adds 1e-11 s).
  CHECK_THAT(ftplan::collective_time_s(Collective::all_reduce, 1.0, N, B, alpha), WithinRel(alpha * 2 * (n - 1), 1e-3));
}

TEST_CASE("one GPU or an empty buffer communicates nothing", "[comm]") {
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather, Collective::broadcast}) {
    CAPTURE(ftplan::to_string(c));
    CHECK(ftplan::collective_time_s(c, 1e9, 1, 1e11, 1e-5) == 0.0);
    CHECK(ftplan::wire_bytes(c, 1e9, 1) == 0.0);
    CHECK(ftplan::collective_time_s(c, 0.0, 8, 1e11, 1e-5) == 0.0);
  }
}

TEST_CASE("hierarchical all-reduce across nodes", "[comm]") {
  // 2 nodes of 8 GPUs: reduce-scatter inside the node, all-reduce of M/8 between nodes, all-gather
  // inside the node. M = 1e9, intra 2e11, inter 2.5e10, α = 0:
  //   RS: 7/8·1e9/2e11 = 4.375e-3; AR: 2·1/2·1.25e8/2.5e10 = 5e-3; AG: 4.375e-3; sum 1.375e-2 s.
  ftplan::Interconnect net;
  net.num_gpus = 16;
  net.gpus_per_node = 8;
  net.nodes = 2;
  net.intra_bandwidth_bytes_per_s = 2e11;
  net.inter_bandwidth_bytes_per_s = 2.5e10;
  net.latency_s = 0;
  CHECK_THAT(ftplan::collective_time_s(net, Collective::all_reduce, 1e9), WithinRel(1.375e-2, kExact));
  // Reduce-scatter: 4.375e-3 inside + 1/2·1.25e8/2.5e10 = 2.5e-3 between: 6.875e-3 s.
  CHECK_THAT(ftplan::collective_time_s(net, Collective::reduce_scatter, 1e9), WithinRel(6.875e-3, kExact));
  CHECK_THAT(ftplan::collective_time_s(net, Collective::all_gather, 1e9), WithinRel(6.875e-3, kExact));

  SECTION("one node: the plain ring") {
    net.num_gpus = 8;
    net.nodes = 1;
    CHECK_THAT(ftplan::collective_time_s(net, Collective::all_reduce, 1e9), WithinRel(2 * 7.0 / 8 * 1e9 / 2e11, kExact));
  }
  SECTION("the shipped A100-80GB SXM at 16 GPUs is two nodes") {
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    const auto n16 = ftplan::interconnect_for(hw, 16);
    CHECK(n16.nodes == 2);
    CHECK(n16.gpus_per_node == 8);
    CHECK(n16.inter_bandwidth_bytes_per_s == hw.inter_node_bandwidth_bytes_per_s);
    CHECK(n16.intra_bandwidth_bytes_per_s == 2.3e11);  // hwdb: NVLink3 through NVSwitch, 230 GB/s
    const double expected = 2 * (7.0 / 8) * 1e9 / 2.3e11 + 1.25e8 / hw.inter_node_bandwidth_bytes_per_s +
                            hw.comm_latency_s * (7 + 2 * 1 + 7);
    CHECK_THAT(ftplan::collective_time_s(n16, Collective::all_reduce, 1e9), WithinRel(expected, kExact));
  }
}

TEST_CASE("ring bandwidth over a dual-socket PCIe box", "[comm]") {
  // Ring 0->1->2->3->0 with gpu0,1 on cpu0 and gpu2,3 on cpu1: the hops 1->2 and 3->0 cross UPI, one
  // each way, and every PCIe link carries one hop each way: bottleneck = min(pcie, upi / 1).
  auto [pcie, upi, expected, link] = GENERATE(table<double, double, double, std::string>({
      {2.5e10, 1.0e10, 1.0e10, "upi"},
      {2.2e10, 1.2e10, 1.2e10, "upi"},
      {2.5e10, 4.0e10, 2.5e10, "pcie4"},
  }));
  CAPTURE(pcie, upi);
  const auto r = ftplan::ring_bandwidth(dual_socket(pcie, upi), 4);
  CHECK(r.bytes_per_s == expected);
  CHECK_THAT(r.bottleneck, Contains(link));
  if (link == "upi") CHECK_THAT(r.bottleneck, Contains("cpu0-cpu1"));

  SECTION("two GPUs on one socket never touch UPI") {
    CHECK(ftplan::ring_bandwidth(dual_socket(pcie, upi), 2).bytes_per_s == pcie);
  }
  SECTION("GPUs interleaved across sockets: every hop crosses UPI, two each way") {
    const auto inter = ftplan::ring_bandwidth(dual_socket(pcie, upi, true), 4);
    CHECK(inter.bytes_per_s == std::min(pcie, upi / 2));
  }
  SECTION("path bandwidth between two GPUs is the slowest link on the path") {
    const auto t = dual_socket(pcie, upi);
    CHECK(ftplan::path_bandwidth(t, 0, 1) == pcie);
    CHECK(ftplan::path_bandwidth(t, 1, 2) == std::min(pcie, upi));
  }
}

TEST_CASE("ring bandwidth over a star is the link bandwidth", "[comm]") {
  auto gpus = GENERATE(2, 4, 8);
  CAPTURE(gpus);
  CHECK(ftplan::ring_bandwidth(star(8, 4.5e11), gpus).bytes_per_s == 4.5e11);
}

TEST_CASE("ring bandwidth of shipped machines", "[comm]") {
  SECTION("A100-80GB SXM: NVLink 3 through NVSwitch, 230 GB/s per direction (hwdb)") {
    const auto hw = ftplan::load_hardware("a100-80gb-sxm");
    const auto r = ftplan::ring_bandwidth(hw.topology, 8);
    CHECK(r.bytes_per_s == 2.3e11);
    CHECK(r.bytes_per_s == hw.intra_node_bandwidth_bytes_per_s);
    CHECK_THAT(r.bottleneck, Contains("nvlink3"));
  }
  SECTION("RTX 6000 Ada: two GPUs per socket, UPI at 12 GB/s is the bottleneck (hwdb topology)") {
    const auto hw = ftplan::load_hardware("rtx-6000-ada");
    const auto r = ftplan::ring_bandwidth(hw.topology, 4);
    CHECK(r.bytes_per_s == 1.2e10);
    CHECK_THAT(r.bottleneck, Contains("upi"));
    CHECK(ftplan::interconnect_for(hw, 4).intra_bandwidth_bytes_per_s == 1.2e10);
  }
  SECTION("RTX 3090: host-staged PCIe at 12 GB/s, UPI at 10 GB/s (hwdb topology)") {
    const auto hw = ftplan::load_hardware("rtx-3090");
    const auto r = ftplan::ring_bandwidth(hw.topology, 4);
    CHECK(r.bytes_per_s == 1.0e10);
    CHECK_THAT(r.bottleneck, Contains("upi"));
  }
  SECTION("a file without a topology is a star at its intra-node bandwidth") {
    auto j = ftplan::read_json_file(ftplan::data_dir() + "/hwdb/rtx-3090.json");
    j.erase("topology");
    j["sources"].erase("topology");
    const auto hw = ftplan::hardware_spec_from_json(j, "rtx-3090-star");
    CHECK(ftplan::ring_bandwidth(hw.topology, 4).bytes_per_s == hw.intra_node_bandwidth_bytes_per_s);
    CHECK(hw.intra_node_bandwidth_bytes_per_s == 1.2e10);
  }
}
