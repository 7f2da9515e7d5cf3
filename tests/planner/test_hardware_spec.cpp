// Hardware specs from hwdb/: every shipped file loads with a source for every figure, a few figures
// checked against their datasheets, and each kind of bad file rejected with the file and field named.
// Bad files are built from a good file's JSON with one field changed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/json_fields.h"

namespace {

constexpr int64_t kGiB = INT64_C(1) << 30;

nlohmann::json hwdb_json(const std::string& id) {
  return ftplan::read_json_file(ftplan::data_dir() + "/hwdb/" + id + ".json");
}

}  // namespace

TEST_CASE("hwdb ships every GPU and the CPU pseudo device", "[hwdb]") {
  const std::vector<std::string> expected = {
      "a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm", "a10g",         "cpu",
      "h100-96gb-hbm2e", "h100-pcie",    "h100-sxm",      "h200",         "l4",
      "l40s",          "rtx-3090",       "rtx-4090",      "rtx-6000-ada", "rtx-a6000",
      "v100-32gb"};
  CHECK(ftplan::list_hardware_ids() == expected);  // sorted
}

TEST_CASE("every shipped hwdb file loads and sources every figure", "[hwdb]") {
  const auto ids = ftplan::list_hardware_ids();
  REQUIRE(ids.size() == 16);
  for (const auto& id : ids) {
    CAPTURE(id);
    ftplan::HardwareSpec hw;
    REQUIRE_NOTHROW(hw = ftplan::load_hardware(id));
    CHECK(hw.id == id);
    CHECK_FALSE(hw.name.empty());
    CHECK(hw.kind == (id == "cpu" ? "cpu" : "gpu"));
    for (const char* figure :
         {"memory_bytes", "peak_flops_fp32", "peak_flops_tf32", "peak_flops_bf16", "peak_flops_fp8",
          "hbm_bandwidth_bytes_per_s", "intra_node_link", "gpus_per_node", "inter_node_bandwidth_bytes_per_s",
          "pcie_host_bandwidth_bytes_per_s", "price_usd_per_gpu_hour", "matmul_efficiency", "comm_latency_s",
          "framework_overhead_bytes"}) {
      CAPTURE(figure);
      CHECK(hw.sources.count(figure) == 1);
    }
    // The topology (given or derived) has one vertex per GPU of the node.
    const auto gpus = std::count_if(hw.topology.vertices.begin(), hw.topology.vertices.end(),
                                    [](const ftplan::TopologyVertex& v) { return v.kind == "gpu"; });
    CHECK(gpus == hw.gpus_per_node);
    CHECK_FALSE(hw.topology.links.empty());
    // Sanity: what fits is less than the card, peaks ordered as on every datasheet.
    CHECK(hw.framework_overhead_bytes < hw.memory_bytes);
    CHECK(hw.peak_flops_bf16 >= hw.peak_flops_fp32);
    CHECK(hw.matmul_efficiency <= 0.6);
  }
}

TEST_CASE("hwdb figures match their datasheets", "[hwdb]") {
  using Catch::Matchers::WithinRel;
  // id, memory_bytes, dense bf16 FLOP/s, memory bandwidth B/s, GPUs per node; source in each file.
  auto [id, memory_bytes, bf16_flops, hbm_bytes_per_s, gpus] =
      GENERATE(table<std::string, int64_t, double, double, int64_t>({
          {"a100-80gb-sxm", 80 * kGiB, 312e12, 2.039e12, 8},      // A100 datasheet
          {"a100-40gb-sxm", 40 * kGiB, 312e12, 1.555e12, 8},      // A100 datasheet
          {"h100-sxm", 80 * kGiB, 989e12, 3.35e12, 8},            // H100 datasheet, SXM: 1979 sparse / 2
          {"h100-pcie", 80 * kGiB, 756e12, 2.0e12, 8},            // H100 datasheet, PCIe
          {"h200", 143771 * (INT64_C(1) << 20), 989e12, 4.8e12, 8},  // nvidia-smi 143771 MiB
          {"rtx-3090", 24 * kGiB, 71e12, 9.36e11, 4},             // GA102 whitepaper, FP32 accumulate
          {"rtx-4090", 24 * kGiB, 165.2e12, 1.008e12, 4},         // Ada whitepaper, FP32 accumulate
          {"l4", 24 * kGiB, 121e12, 3.0e11, 8},                   // L4 datasheet: 242 sparse / 2
          {"v100-32gb", 32 * kGiB, 125e12, 9.0e11, 8},            // fp16 tensor cores; no bf16
      }));
  CAPTURE(id);
  const auto hw = ftplan::load_hardware(id);
  CHECK(hw.memory_bytes == memory_bytes);
  CHECK_THAT(hw.peak_flops_bf16, WithinRel(bf16_flops, 1e-3));
  CHECK_THAT(hw.hbm_bandwidth_bytes_per_s, WithinRel(hbm_bytes_per_s, 1e-3));
  CHECK(hw.gpus_per_node == gpus);
}

TEST_CASE("hwdb: a few link and figure spot checks", "[hwdb]") {
  using Catch::Matchers::WithinRel;
  const auto h100 = ftplan::load_hardware("h100-sxm");
  CHECK_THAT(h100.peak_flops_fp8, WithinRel(1979e12, 1e-3));
  CHECK_THAT(h100.inter_node_bandwidth_bytes_per_s, WithinRel(50e9, 1e-6));  // 400 Gb/s NDR per GPU
  CHECK(h100.intra_node_link == "nvlink4-nvswitch");
  const auto a100 = ftplan::load_hardware("a100-80gb-sxm");
  CHECK(a100.peak_flops_fp8 == 0);  // no FP8 on Ampere
  CHECK_THAT(a100.inter_node_bandwidth_bytes_per_s, WithinRel(25e9, 1e-6));  // 200 Gb/s HDR per GPU
  // PCIe boxes are slower inside the node than NVLink boxes, and the 4090 (no P2P) slowest of all.
  const auto pcie = ftplan::load_hardware("a100-80gb-pcie");
  const auto rtx4090 = ftplan::load_hardware("rtx-4090");
  CHECK(pcie.intra_node_bandwidth_bytes_per_s < a100.intra_node_bandwidth_bytes_per_s);
  CHECK(rtx4090.intra_node_bandwidth_bytes_per_s < pcie.intra_node_bandwidth_bytes_per_s);
  const auto cpu = ftplan::load_hardware("cpu");
  CHECK(cpu.memory_bytes == 24 * kGiB);
  CHECK(cpu.framework_overhead_bytes == 0);
}

TEST_CASE("hwdb: a file without a topology gets a star around one switch", "[hwdb]") {
  auto j = hwdb_json("a100-80gb-sxm");
  j.erase("topology");
  j["sources"].erase("topology");
  const auto hw = ftplan::hardware_spec_from_json(j, "a100-80gb-sxm");
  REQUIRE(hw.topology.vertices.size() == 9);
  REQUIRE(hw.topology.links.size() == 8);
  for (size_t i = 0; i < hw.topology.links.size(); ++i) {
    const auto& link = hw.topology.links[i];
    CHECK(link.a == "gpu" + std::to_string(i));
    CHECK(link.b == "switch");
    CHECK(link.bandwidth_bytes_per_s == hw.intra_node_bandwidth_bytes_per_s);
  }
}

TEST_CASE("hwdb: bad files are rejected naming the file and the field", "[hwdb]") {
  using Catch::Matchers::Contains;
  using Catch::Matchers::StartsWith;
  auto j = hwdb_json("h100-sxm");
  const auto load = [&] { return ftplan::hardware_spec_from_json(j, "h100-sxm"); };

  SECTION("valid as shipped") { CHECK_NOTHROW(load()); }
  SECTION("unknown key") {
    j["memory_gb"] = 80;
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: memory_gb: unknown key"));
  }
  SECTION("unknown key inside peak_flops") {
    j["peak_flops"]["fp4"] = 1e15;
    CHECK_THROWS_WITH(load(), Contains("peak_flops: fp4: unknown key"));
  }
  SECTION("negative value") {
    j["memory_bytes"] = -5;
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: memory_bytes: -5 is out of range"));
  }
  SECTION("negative bandwidth") {
    j["intra_node_link"]["bandwidth_bytes_per_s"] = -3.6e11;
    CHECK_THROWS_WITH(load(), Contains("intra_node_link: bandwidth_bytes_per_s") && Contains("out of range"));
  }
  SECTION("absurd value") {
    j["peak_flops"]["bf16"] = 989e18;  // exa, not tera
    CHECK_THROWS_WITH(load(), Contains("peak_flops: bf16") && Contains("out of range"));
  }
  SECTION("efficiency given as a percentage") {
    j["matmul_efficiency"] = 40;
    CHECK_THROWS_WITH(load(), Contains("matmul_efficiency"));
  }
  SECTION("missing key") {
    j.erase("gpus_per_node");
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: gpus_per_node: missing"));
  }
  SECTION("string where a number belongs") {
    j["hbm_bandwidth_bytes_per_s"] = "3.35 TB/s";
    CHECK_THROWS_WITH(load(), Contains("hbm_bandwidth_bytes_per_s: expected a number"));
  }
  SECTION("overhead larger than the memory") {
    j["framework_overhead_bytes"] = 100 * kGiB;
    CHECK_THROWS_WITH(load(), Contains("framework_overhead_bytes"));
  }
  SECTION("missing source") {
    j["sources"].erase("peak_flops_bf16");
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: sources: missing source for peak_flops_bf16"));
  }
  SECTION("empty source") {
    j["sources"]["price_usd_per_gpu_hour"] = "";
    CHECK_THROWS_WITH(load(), Contains("sources: price_usd_per_gpu_hour"));
  }
  SECTION("missing source for the topology") {
    j["sources"].erase("topology");
    CHECK_THROWS_WITH(load(), Contains("missing source for topology"));
  }
  SECTION("link to a missing vertex") {
    j["topology"]["links"][3]["b"] = "nvswitch9";
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: topology: links[3]: b: no vertex 'nvswitch9'"));
  }
  SECTION("link with zero bandwidth") {
    j["topology"]["links"][0]["bandwidth_bytes_per_s"] = 0;
    CHECK_THROWS_WITH(load(), Contains("topology: links[0]: bandwidth_bytes_per_s"));
  }
  SECTION("wrong GPU count in the topology") {
    j["gpus_per_node"] = 4;
    CHECK_THROWS_WITH(load(), Contains("topology: vertices: 8 of kind \"gpu\", but gpus_per_node is 4"));
  }
  SECTION("disconnected topology") {
    j["topology"]["vertices"].push_back({{"id", "gpu8"}, {"kind", "gpu"}});
    j["gpus_per_node"] = 9;
    CHECK_THROWS_WITH(load(), Contains("not connected") && Contains("gpu8"));
  }
  SECTION("duplicate vertex id") {
    j["topology"]["vertices"].push_back({{"id", "gpu0"}, {"kind", "switch"}});
    CHECK_THROWS_WITH(load(), Contains("duplicate id 'gpu0'"));
  }
  SECTION("every problem is reported at once") {
    j["memory_bytes"] = -5;
    j["sources"].erase("comm_latency_s");
    j["topology"]["links"][0]["a"] = "gpu99";
    std::string message;
    try {
      load();
    } catch (const ftplan::InputError& e) {
      message = e.what();
    }
    CHECK_THAT(message, StartsWith("hwdb/h100-sxm.json: memory_bytes: -5") &&
                            Contains("missing source for comm_latency_s") && Contains("'gpu99'"));
  }
}

TEST_CASE("hwdb: unknown ids and user files", "[hwdb]") {
  using Catch::Matchers::Contains;
  // An unknown id lists the known ones.
  CHECK_THROWS_WITH(ftplan::load_hardware("h800"), Contains("--gpu") && Contains("a100-80gb-sxm"));
  // A path works like an id; messages name the path.
  const std::string path = ftplan::data_dir() + "/hwdb/l40s.json";
  CHECK(ftplan::load_hardware(path).id == "l40s");
}
