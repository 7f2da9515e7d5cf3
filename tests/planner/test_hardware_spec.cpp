// Hardware specs from hwdb/: every shipped file loads with a source for every figure, a few figures
// checked against their datasheets, and each kind of bad file rejected with the file and field named.
// Bad files are built from a good file's JSON with one field changed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <cmath>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/data_paths.h"
#include "planner/calibration.h"
#include "planner/errors.h"
#include "planner/hardware_spec.h"
#include "planner/job_fields.h"
#include "planner/json_fields.h"
#include "planner/training_setup.h"

namespace {

constexpr int64_t kGiB = INT64_C(1) << 30;
constexpr int64_t kMiB = INT64_C(1) << 20;

nlohmann::json hwdb_json(const std::string& id) {
  return ftplan::read_json_file(ftplan::data_dir() + "/hwdb/" + id + ".json");
}

}  // namespace

TEST_CASE("hwdb ships every GPU and the CPU pseudo device", "[hwdb]") {
  const std::vector<std::string> expected = {
      "a100-40gb-sxm", "a100-80gb-pcie",  "a100-80gb-sxm", "a10g",         "b200",
      "cpu",           "gb200-nvl72",     "gh200",         "h100-96gb-hbm2e", "h100-pcie",
      "h100-sxm",      "h20",             "h200",          "l4",           "l40s",
      "mi300x",        "mi325x",          "rtx-3090",      "rtx-4090",     "rtx-5090",
      "rtx-6000-ada",  "rtx-a6000",       "rtx-pro-6000-blackwell",        "v100-32gb"};
  CHECK(ftplan::list_hardware_ids() == expected);  // sorted
}

TEST_CASE("every shipped hwdb file loads and sources every figure", "[hwdb]") {
  const auto ids = ftplan::list_hardware_ids();
  REQUIRE(ids.size() == 24);
  for (const auto& id : ids) {
    CAPTURE(id);
    ftplan::HardwareSpec hw;
    REQUIRE_NOTHROW(hw = ftplan::load_hardware(id));
    CHECK(hw.id == id);
    CHECK_FALSE(hw.name.empty());
    CHECK(hw.kind == (id == "cpu" ? "cpu" : "gpu"));
    for (const char* figure :
         {"memory_bytes", "peak_flops_fp32", "peak_flops_tf32", "peak_flops_bf16", "peak_flops_fp8",
          "hbm_bandwidth_bytes_per_s", "intra_node_link", "gpus_per_node", "nvlink_domain_size", "pcie_only",
          "inter_node_bandwidth_bytes_per_s", "pcie_host_bandwidth_bytes_per_s", "host_memory_bytes_per_node",
          "price_usd_per_gpu_hour", "price_date", "matmul_efficiency", "comm_latency_s", "framework_overhead_bytes"}) {
      CAPTURE(figure);
      REQUIRE(hw.sources.count(figure) == 1);
      CHECK_FALSE(hw.sources.at(figure).empty());
    }
    // The topology (given or derived) has one vertex per GPU of the node.
    const auto gpus = std::count_if(hw.topology.vertices.begin(), hw.topology.vertices.end(),
                                    [](const ftplan::TopologyVertex& v) { return v.kind == "gpu"; });
    CHECK(gpus == hw.gpus_per_node);
    CHECK_FALSE(hw.topology.links.empty());
    // Sanity: what fits is less than the card, peaks ordered as on every datasheet.
    CHECK(hw.framework_overhead_bytes < hw.memory_bytes);
    CHECK(hw.peak_flops_bf16 >= hw.peak_flops_fp32);
    CHECK(hw.matmul_efficiency <= 0.8);  // below every measured GEMM ceiling (0.79-1.14 of the peak)
    // The new fields: a domain of at least one GPU, one where the card has no NVLink, a dated price.
    CHECK(hw.nvlink_domain_size >= 1);
    if (hw.pcie_only) CHECK(hw.nvlink_domain_size == 1);
    CHECK(hw.price_date.size() == 7);
    CHECK(hw.price_date >= "2025-01");
    if (hw.kind == "gpu") {
      CHECK(hw.price_usd_per_gpu_hour > 0);
      CHECK(hw.host_memory_bytes_per_node >= hw.gpus_per_node * hw.memory_bytes / 2);
      // Efficiencies and latencies are estimates, and their sources say so, or name the training benchmark they come from.
      CHECK_THAT(hw.sources.at("matmul_efficiency"),
                 Catch::Matchers::StartsWith("estimate") || Catch::Matchers::Contains("llm-foundry"));
      CHECK_THAT(hw.sources.at("comm_latency_s"), Catch::Matchers::StartsWith("estimate"));
    }
  }
}

TEST_CASE("hwdb: the NVLink / Infinity Fabric domain and the PCIe-only flag of each kind of machine", "[hwdb]") {
  // id, NVLink domain, PCIe-only, GPUs per node; sources in each file.
  auto [id, domain, pcie_only, gpus] = GENERATE(table<std::string, int64_t, bool, int64_t>({
      {"h100-sxm", 8, false, 8},                 // HGX H100 board
      {"b200", 8, false, 8},                     // HGX B200 board
      {"gb200-nvl72", 72, false, 72},            // one NVL72 rack, modelled as the planner's node
      {"gh200", 1, false, 1},                    // one superchip per rented node, NVLink-C2C to Grace
      {"mi300x", 8, false, 8},                   // 8 OAM GPUs on Infinity Fabric
      {"l40s", 1, true, 8},                      // PCIe cards
      {"rtx-5090", 1, true, 4},
      {"rtx-pro-6000-blackwell", 1, true, 8},
  }));
  CAPTURE(id);
  const auto hw = ftplan::load_hardware(id);
  CHECK(hw.nvlink_domain_size == domain);
  CHECK(hw.pcie_only == pcie_only);
  CHECK(hw.gpus_per_node == gpus);
}

TEST_CASE("hwdb: AMD entries are GPUs whose peaks name the ROCm stack", "[hwdb]") {
  for (const char* id : {"mi300x", "mi325x"}) {
    CAPTURE(id);
    const auto hw = ftplan::load_hardware(id);
    CHECK(hw.kind == "gpu");
    for (const char* figure : {"peak_flops_bf16", "peak_flops_fp8"})
      CHECK_THAT(hw.sources.at(figure), Catch::Matchers::Contains("ROCm"));
  }
}

TEST_CASE("hwdb figures match their datasheets", "[hwdb]") {
  using Catch::Matchers::WithinRel;
  // id, memory_bytes as nvidia-smi / rocm-smi reports it, dense bf16 FLOP/s, memory bandwidth B/s, GPUs per
  // node; source in each file.
  auto [id, memory_bytes, bf16_flops, hbm_bytes_per_s, gpus] =
      GENERATE(table<std::string, int64_t, double, double, int64_t>({
          {"a100-80gb-sxm", 81920 * kMiB, 312e12, 2.039e12, 8},     // nvidia-smi 81920 MiB; A100 datasheet
          {"a100-40gb-sxm", 40960 * kMiB, 312e12, 1.555e12, 8},     // nvidia-smi 40960 MiB; A100 datasheet
          {"h100-sxm", 81559 * kMiB, 989e12, 3.35e12, 8},           // nvidia-smi 81559 MiB; SXM: 1979 sparse / 2
          {"h100-pcie", 81559 * kMiB, 756e12, 2.0e12, 8},           // nvidia-smi 81559 MiB; H100 datasheet, PCIe
          {"h200", 143771 * kMiB, 989e12, 4.8e12, 8},               // nvidia-smi 143771 MiB
          {"rtx-3090", 24576 * kMiB, 71e12, 9.36e11, 4},            // GA102 whitepaper, FP32 accumulate
          {"rtx-4090", 24564 * kMiB, 165.2e12, 1.008e12, 4},        // Ada whitepaper, FP32 accumulate
          {"l4", 23034 * kMiB, 121e12, 3.0e11, 8},                  // nvidia-smi 23034 MiB; L4: 242 sparse / 2
          {"l40s", 46068 * kMiB, 362.05e12, 8.64e11, 8},            // nvidia-smi 46068 MiB; L40S datasheet
          {"rtx-a6000", 49140 * kMiB, 154.8e12, 7.68e11, 4},        // nvidia-smi 49140 MiB
          {"rtx-6000-ada", 49140 * kMiB, 364.2e12, 9.6e11, 4},      // nvidia-smi 49140 MiB
          {"v100-32gb", 32768 * kMiB, 125e12, 9.0e11, 8},           // fp16 tensor cores; no bf16
          {"b200", 183359 * kMiB, 2250e12, 7.7e12, 8},              // nvidia-smi 183359 MiB; HGX B200: 4.5 PF sparse / 2
          {"gb200-nvl72", 189471 * kMiB, 2500e12, 8e12, 72},        // nvidia-smi 189471 MiB; NVL72: 5 PF sparse / 2
          {"gh200", 97871 * kMiB, 989e12, 4.0e12, 1},               // nvidia-smi 97871 MiB; GH200: 96GB HBM3 4 TB/s
          {"h20", 97871 * kMiB, 148e12, 4.0e12, 8},                 // nvidia-smi 97871 MiB; 148 TFLOPS dense
          {"mi300x", INT64_C(206141652992), 1307.4e12, 5.3e12, 8},  // rocm-smi VRAM total; MI300X: 2614.9 sparse / 2
          {"mi325x", 256 * kGiB - 16 * kMiB, 1307.4e12, 6.0e12, 8}, // estimate as MI300X's rocm-smi; 256 GB HBM3E
          {"rtx-5090", 32607 * kMiB, 209.5e12, 1.792e12, 4},        // nvidia-smi 32607 MiB; FP32 accumulate, half rate
          {"rtx-pro-6000-blackwell", 97887 * kMiB, 503.8e12, 1.792e12, 8},  // nvidia-smi 97887 MiB; 4000 AI TOPS / 8
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

// GeForce cards boost above the clock their whitepaper peak assumes: torch.matmul bf16 (FP32 accumulate)
// reaches the whole peak on an RTX 4090 and more on an RTX 3090, a datacenter A100 SXM4 0.848 of its own
// (zzc0721/torch-performance-test-data database.md at 9d82827637262c4351e3f9483f96b8cff57a601f: A100 SXM4
// 80GB 264.53 TFLOPS, L13; median of six RTX 4090 24GB rows 165.26, L21-L89; median of three RTX 3090 rows
// 76.58, L16/L29/L54; RTX 5090 238.04). The consumer entries take the A100 entry's fraction of its ceiling, applied to theirs.
TEST_CASE("hwdb: GeForce efficiencies are the A100's fraction of the measured GEMM ceiling", "[hwdb]") {
  using Catch::Matchers::WithinAbs;
  const auto a100 = ftplan::load_hardware("a100-80gb-sxm");
  const double a100_of_ceiling = a100.matmul_efficiency / (264.53e12 / a100.peak_flops_bf16);  // 0.56 / 0.848
  CHECK_THAT(a100_of_ceiling, WithinAbs(0.6605, 1e-3));
  const auto rtx4090 = ftplan::load_hardware("rtx-4090");
  const auto rtx3090 = ftplan::load_hardware("rtx-3090");
  // Hand-derived: 0.6605 x 165.26 / 165.2 = 0.661 and 0.6605 x 76.58 / 71 = 0.712, rounded to 0.01.
  CHECK_THAT(rtx4090.matmul_efficiency, WithinAbs(a100_of_ceiling * 165.26e12 / rtx4090.peak_flops_bf16, 0.005));
  CHECK_THAT(rtx3090.matmul_efficiency, WithinAbs(a100_of_ceiling * 76.58e12 / rtx3090.peak_flops_bf16, 0.005));
  // RTX 5090: median of four 32GB rows 238.04 TFLOPS (L28, L45, L88, L103): 0.6605 x 238.04 / 209.5 = 0.750.
  const auto rtx5090 = ftplan::load_hardware("rtx-5090");
  CHECK_THAT(rtx5090.matmul_efficiency, WithinAbs(a100_of_ceiling * 238.04e12 / rtx5090.peak_flops_bf16, 0.005));
  // The whitepaper's dense FP32-accumulate figures (half the FP16-accumulate rate on GeForce).
  CHECK(rtx4090.peak_flops_bf16 == 165.2e12);
  CHECK(rtx3090.peak_flops_bf16 == 71e12);
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
  using Catch::Matchers::Equals;
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
  SECTION("usable memory above the card's memory") {
    j["usable_memory_bytes"] = j["memory_bytes"].get<int64_t>() + 1;
    j["sources"]["usable_memory_bytes"] = "a test";
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: usable_memory_bytes:") && Contains("is more than memory_bytes"));
  }
  SECTION("usable memory without its source") {
    j["sources"].erase("usable_memory_bytes");
    CHECK_THROWS_WITH(load(), Contains("missing source for usable_memory_bytes"));
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
  SECTION("a wrong-typed field names the file and the key") {
    j["pcie_only"] = "no";
    CHECK_THROWS_WITH(load(), Equals("hwdb/h100-sxm.json: pcie_only: expected true or false, got \"no\""));
  }
  SECTION("a domain given as text") {
    j["nvlink_domain_size"] = "8";
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: nvlink_domain_size: expected"));
  }
  SECTION("NVLink domain out of range") {
    j["nvlink_domain_size"] = 0;
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: nvlink_domain_size: 0 is out of range"));
    j["nvlink_domain_size"] = 100000;
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: nvlink_domain_size: 100000 is out of range"));
  }
  SECTION("a PCIe-only card with an NVLink domain") {
    j["pcie_only"] = true;
    CHECK_THROWS_WITH(load(), Equals("hwdb/h100-sxm.json: nvlink_domain_size: 8, but pcie_only is true (a PCIe-only "
                                     "card is a domain of 1)"));
  }
  SECTION("price date not YYYY-MM") {
    for (const char* bad : {"2026-13", "2026-7", "July 2026", "1999-12", "2026-07-23"}) {
      CAPTURE(bad);
      j["price_date"] = bad;
      CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: price_date: '" + std::string(bad) + "' is not YYYY-MM"));
    }
    j["price_date"] = 202607;
    CHECK_THROWS_WITH(load(), StartsWith("hwdb/h100-sxm.json: price_date: expected"));
  }
  SECTION("new fields are required, with their sources") {
    for (const char* key : {"nvlink_domain_size", "pcie_only", "price_date", "host_memory_bytes_per_node"}) {
      CAPTURE(key);
      auto k = hwdb_json("h100-sxm");
      k.erase(key);
      CHECK_THROWS_WITH(ftplan::hardware_spec_from_json(k, "h100-sxm"),
                        StartsWith("hwdb/h100-sxm.json: " + std::string(key) + ": missing"));
      auto m = hwdb_json("h100-sxm");
      m["sources"].erase(key);
      CHECK_THROWS_WITH(ftplan::hardware_spec_from_json(m, "h100-sxm"),
                        Equals("hwdb/h100-sxm.json: sources: missing source for " + std::string(key)));
    }
  }
  SECTION("measured GEMM anchors: the four anchors, fractions, with their source") {
    j["gemm_efficiency"]["128"] = 0.5;
    CHECK_THROWS_WITH(load(), Contains("gemm_efficiency: 128: unknown key"));
    j["gemm_efficiency"].erase("128");
    j["gemm_efficiency"].erase("64");
    CHECK_THROWS_WITH(load(), Contains("gemm_efficiency: 64: missing"));
    j["gemm_efficiency"]["64"] = 22.6;  // a percentage
    CHECK_THROWS_WITH(load(), Contains("gemm_efficiency: 64") && Contains("out of range"));
    j["gemm_efficiency"]["64"] = 0.226;
    CHECK_NOTHROW(load());
    j["sources"].erase("gemm_efficiency");
    CHECK_THROWS_WITH(load(), Contains("missing source for gemm_efficiency"));
    j.erase("gemm_efficiency");
    CHECK(load().gemm_efficiency_bf16.empty());  // optional: no table, every GEMM at matmul_efficiency
    j["sources"]["gemm_efficiency"] = "a source for a figure the file does not have";
    CHECK_THROWS_WITH(load(), Contains("sources: gemm_efficiency: unknown key"));
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

// What a process can allocate is torch's "total capacity" (cudaMemGetInfo's total): nvidia-smi's total less
// the memory the driver reserves, as torch's out-of-memory messages print it (the hwdb sources cite them).
TEST_CASE("hwdb: usable memory is torch's total capacity, below nvidia-smi's total", "[hwdb]") {
  const auto [id, usable_gib_printed] = GENERATE(table<std::string, double>({
      {"a100-80gb-sxm", 79.14}, {"a100-40gb-sxm", 39.50}, {"h100-sxm", 79.11}, {"rtx-4090", 23.64}, {"rtx-3090", 23.70}}));
  CAPTURE(id);
  const auto hw = ftplan::load_hardware(id);
  // Stored as whole MiB: within half a MiB of the printed figure's rounding (0.005 GiB).
  CHECK(std::abs(double(hw.usable_memory_bytes) / double(1LL << 30) - usable_gib_printed) <= 0.005);
  CHECK(hw.usable_memory_bytes % (1LL << 20) == 0);
  CHECK(ftplan::usable_device_bytes(hw) == hw.usable_memory_bytes);
  // The driver's reserve is 0.3-0.9 GiB on these cards.
  const double reserve_gib = double(hw.memory_bytes - hw.usable_memory_bytes) / double(1LL << 30);
  CHECK(reserve_gib > 0.25);
  CHECK(reserve_gib < 0.9);
  // A file without the key falls back to memory_bytes.
  auto plain = hw;
  plain.usable_memory_bytes = 0;
  CHECK(ftplan::usable_device_bytes(plain) == hw.memory_bytes);
}

TEST_CASE("hwdb: the H100's GEMM anchors are XLA's sm_90 per-shape table, fitted", "[hwdb]") {
  using Catch::Matchers::WithinAbs;
  // openxla's kDefaultMatmulPTable for sm_90 (tensorflow/tensorflow third_party/xla/xla/service/gpu/model/
  // matmul_interpolator_data.h @ 9bebee8e), bf16 FLOP/s of the b=1 GEMMs whose smallest dimension d has the
  // other two at 4096, as fractions of the SXM's 989 TFLOP/s, fitted as ftplan calibrate fits timed GEMMs.
  const double peak = 989e12;
  const std::vector<std::pair<double, double>> points = {
      {256, 376.223e12 / peak},  {256, 412.027e12 / peak},  {256, 392.163e12 / peak},  {512, 649.965e12 / peak},
      {512, 644.116e12 / peak},  {512, 543.117e12 / peak},  {1024, 738.474e12 / peak}, {1024, 738.474e12 / peak},
      {1024, 677.440e12 / peak}, {2048, 758.435e12 / peak}, {2048, 753.644e12 / peak}, {2048, 738.736e12 / peak},
      {4096, 783.329e12 / peak}};
  const std::vector<double> fitted = ftplan::fit_gemm_anchors(points);
  for (const char* id : {"h100-sxm", "h100-96gb-hbm2e"}) {
    CAPTURE(id);
    const ftplan::HardwareSpec hw = ftplan::load_hardware(id);
    REQUIRE(hw.gemm_efficiency_bf16.size() == 4);
    for (size_t k = 0; k < 4; ++k) CHECK_THAT(hw.gemm_efficiency_bf16[k], WithinAbs(fitted[k], 0.0006));  // 3 decimals
    CHECK(hw.peak_flops_bf16 == peak);
    CHECK_THAT(hw.sources.at("gemm_efficiency"), Catch::Matchers::Contains("9bebee8e429eea3a9a0cfcbd989f1aa6a470c15d"));
  }
  // Only the sm_90 H100s carry a table: no other GPU's per-shape GEMM throughput was found published.
  for (const auto& id : ftplan::list_hardware_ids())
    if (id != "h100-sxm" && id != "h100-96gb-hbm2e") CHECK(ftplan::load_hardware(id).gemm_efficiency_bf16.empty());
}

// The A100 80GB SXM's efficiency re-derived from LLM Foundry's MPT training benchmarks (mosaicml/llm-foundry
// scripts/train/benchmarking/README.md at 495218376830947dce625efabc4d86be7c47cc45, table "A100 80GB with 1600
// Gbps node-node interconnect", the 1B-13B rows: model, sequence, activation checkpointing, MFU %, parameters).
// Their MFU counts 6N + 3 x 4·L·d·S FLOPs per token (the whole S x S attention); ftplan's efficiency is over the
// FLOPs a step executes: causal attention's half, and the forward recomputed under checkpointing.
TEST_CASE("hwdb: the A100 80GB efficiency is LLM Foundry's median executed-FLOP utilisation", "[hwdb]") {
  struct Row { const char* model; double seq; bool ac; double mfu_pct; double params; };
  const std::vector<Row> rows = {
      {"13b", 32768, true, 51.69, 13011240960},
      {"13b", 16384, true, 54.07, 12927354880},
      {"13b", 8192, true, 56.07, 12885411840},
      {"13b", 4096, true, 57.62, 12864440320},
      {"13b", 2048, false, 59.57, 12853954560},
      {"13b", 1024, true, 59.48, 12848711680},
      {"7b", 65536, true, 46.97, 6918905856},
      {"7b", 32768, true, 49.46, 6784688128},
      {"7b", 16384, true, 51.96, 6717579264},
      {"7b", 8192, true, 54.47, 6684024832},
      {"7b", 4096, true, 54.84, 6667247616},
      {"7b", 2048, false, 64.23, 6658859008},
      {"7b", 1024, true, 58.01, 6654664704},
      {"3b", 65536, true, 46.05, 2814366720},
      {"3b", 32768, true, 47.18, 2730480640},
      {"3b", 16384, false, 57.13, 2688537600},
      {"3b", 8192, false, 59.34, 2667566080},
      {"3b", 4096, false, 60.53, 2657080320},
      {"3b", 2048, false, 62.11, 2651837440},
      {"3b", 1024, false, 62.73, 2649216000},
      {"3b", 512, false, 63.71, 2647905280},
      {"1b", 65536, true, 46.18, 1445974016},
      {"1b", 32768, false, 55.52, 1378865152},
      {"1b", 16384, false, 56.6, 1345310720},
      {"1b", 8192, false, 56.69, 1328533504},
      {"1b", 4096, false, 59.0, 1320144896},
      {"1b", 2048, false, 59.86, 1315950592},
      {"1b", 1024, false, 60.15, 1313853440},
      {"1b", 512, false, 60.68, 1312804864},
  };
  const std::map<std::string, std::pair<double, double>> dims = {  // d_model, n_layers (MPT yamls)
      {"1b", {2048, 24}}, {"3b", {2560, 32}}, {"7b", {4096, 32}}, {"13b", {5120, 40}}};
  std::vector<double> util;
  for (const auto& r : rows) {
    const auto [d, layers] = dims.at(r.model);
    const double model_flops = 6 * r.params + 3 * 4 * layers * d * r.seq;
    const double executed = 6 * r.params + 3 * 4 * layers * d * r.seq / 2 + (r.ac ? 2 * r.params + 4 * layers * d * r.seq / 2 : 0);
    util.push_back(r.mfu_pct / 100 * executed / model_flops);
  }
  REQUIRE(util.size() == 29);
  std::sort(util.begin(), util.end());
  const double median = util[util.size() / 2];
  CHECK_THAT(median, Catch::Matchers::WithinAbs(0.559, 0.001));
  CHECK(ftplan::load_hardware("a100-80gb-sxm").matmul_efficiency == std::round(median * 100) / 100);
}

TEST_CASE("a narrower PCIe slot scales the entry's PCIe figures, and only those", "[hwdb][pcie]") {
  using ftplan::parse_pcie_slot;
  // PCI-SIG per lane and direction: 3.0 is 8 GT/s with 128b/130b, 4.0 twice that: 3.0 x8 = 7.877 GB/s,
  // 4.0 x16 = 31.51 GB/s, a quarter of it exactly.
  CHECK_THAT(parse_pcie_slot("3x8", "f").bandwidth_bytes_per_s(), Catch::Matchers::WithinRel(8 * 8e9 * 128 / 130 / 8, 1e-12));
  CHECK_THAT(parse_pcie_slot("gen4x16", "f").bandwidth_bytes_per_s(), Catch::Matchers::WithinRel(31.5077e9, 1e-5));
  CHECK(parse_pcie_slot("Gen5x16", "f").to_string() == "5.0 x16");
  for (const char* bad : {"3x7", "7x16", "0x8", "x8", "3x", "3", "3x8x", "pcie3x8", "", "3x 8"})
    CHECK_THROWS_WITH(parse_pcie_slot(bad, "--pcie-slot"), Catch::Contains("--pcie-slot") && Catch::Contains("GENxLANES"));
  // Every entry with a PCIe host link states its card's interface; the superchips and the CPU have none.
  for (const auto& id : ftplan::list_hardware_ids()) {
    CAPTURE(id);
    const auto hw = ftplan::load_hardware(id);
    const bool pcie_host = id != "cpu" && id != "gh200" && id != "gb200-nvl72";
    CHECK(hw.pcie_slot.stated() == pcie_host);
    if (pcie_host) CHECK(hw.pcie_slot.lanes == 16);
  }

  ftplan::TrainingSetup s;
  s.num_gpus = 2;
  SECTION("RTX 3090 in PCIe 3.0 x8 slots: host-staged GPU links and host copies at a quarter, UPI untouched") {
    auto hw = ftplan::load_hardware("rtx-3090");
    s.pcie_slot = "3x8";
    ftplan::apply_topology(s, hw);
    CHECK_THAT(hw.intra_node_bandwidth_bytes_per_s, Catch::Matchers::WithinRel(1.2e10 / 4, 1e-12));
    CHECK_THAT(hw.pcie_host_bandwidth_bytes_per_s, Catch::Matchers::WithinRel(2.4e10 / 4, 1e-12));
    int pcie_links = 0;
    for (const auto& l : hw.topology.links) {
      CAPTURE(l.a, l.b, l.kind);
      if (l.kind == "upi") {
        CHECK(l.bandwidth_bytes_per_s == 1e10);
      } else {
        CHECK_THAT(l.bandwidth_bytes_per_s, Catch::Matchers::WithinRel(1.2e10 / 4, 1e-12));
        ++pcie_links;
      }
    }
    CHECK(pcie_links == 4);
    CHECK(hw.pcie_link.to_string() == "3.0 x8");
    CHECK(hw.pcie_slot.to_string() == "4.0 x16");
  }
  SECTION("H100 SXM in a 4.0 x16 slot: half the host copies, NVLink untouched") {
    auto hw = ftplan::load_hardware("h100-sxm");
    s.pcie_slot = "4x16";
    ftplan::apply_topology(s, hw);
    CHECK_THAT(hw.pcie_host_bandwidth_bytes_per_s, Catch::Matchers::WithinRel(5e10 / 2, 1e-12));
    CHECK(hw.intra_node_bandwidth_bytes_per_s == 3.6e11);
  }
  SECTION("the link trains at the lower generation and the fewer lanes: a 4.0 x16 card in 5.0 x8 slots runs 4.0 x8") {
    auto hw = ftplan::load_hardware("rtx-3090");
    s.pcie_slot = "5x8";
    ftplan::apply_topology(s, hw);
    CHECK(hw.pcie_link.to_string() == "4.0 x8");
    CHECK(hw.pcie_slot_given.to_string() == "5.0 x8");
    CHECK_THAT(hw.pcie_host_bandwidth_bytes_per_s, Catch::Matchers::WithinRel(2.4e10 / 2, 1e-12));
    auto fast = ftplan::load_hardware("rtx-3090");
    s.pcie_slot = "5x16";  // a faster slot: the card's own link, unchanged
    ftplan::apply_topology(s, fast);
    CHECK(fast.pcie_link.to_string() == "4.0 x16");
    CHECK(fast.intra_node_bandwidth_bytes_per_s == 1.2e10);
  }
  SECTION("refused: a card without a PCIe host link") {
    auto gh = ftplan::load_hardware("gh200");
    s.pcie_slot = "3x8";
    CHECK_THROWS_WITH(ftplan::apply_topology(s, gh), Catch::Contains("--pcie-slot (pcie_slot)") && Catch::Contains("states no PCIe slot"));
  }
}
