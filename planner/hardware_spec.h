// Hardware spec: one GPU model and the machine it usually sits in, read from hwdb/<id>.json.
// Every figure carries its source in the file's "sources" object; loading rejects unknown keys,
// missing figures or sources, and negative or absurd values, naming the file and the field.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ftplan {

// One vertex of a node's topology graph.
struct TopologyVertex {
  std::string id;    // e.g. "gpu0", "nvswitch", "pcie-switch0", "cpu0", "nic0"
  std::string kind;  // "gpu", "switch", "cpu", "nic"
};

// One full-duplex link; the bandwidth is achievable per direction.
struct TopologyLink {
  std::string a, b;                   // vertex ids
  double bandwidth_bytes_per_s = 0;   // e.g. 2.4e11 for NVLink 3 through NVSwitch
  std::string kind;                   // "nvlink4", "pcie4", "upi", ...
};

struct Topology {
  std::vector<TopologyVertex> vertices;
  std::vector<TopologyLink> links;
};

// A PCIe interface: generation and lanes, e.g. 4.0 x16. Which slot a card sits in sets its host copies
// (offload) and, on a PCIe-only card, its GPU-to-GPU traffic: consumer boards split 16 lanes x8/x8
// between two cards, and older ones are PCIe 3.0.
struct PcieSlot {
  int generation = 0;  // 1..6; 0: none stated (the host link is not PCIe: NVLink-C2C, a CPU)
  int lanes = 0;       // 1, 2, 4, 8 or 16
  bool stated() const { return generation > 0; }
  // Raw per direction: the PCI-SIG per-lane rate after line encoding x lanes (PCIe 3.0 x16: 15.75 GB/s).
  double bandwidth_bytes_per_s() const;
  std::string to_string() const;  // "3.0 x8"
  std::string key() const;        // "3x8", as --pcie-slot and the JSON take it; "" when none is stated
};

// "GENxLANES" as in "3x8" or "gen4x16"; anything else is an InputError naming `field`.
PcieSlot parse_pcie_slot(const std::string& text, const std::string& field);

// The efficiency parameters of the time model beyond hwdb's one matmul_efficiency: what a calibration
// (planner/calibration.h) fits from measured runs or `ftexec calibrate` measures. Unset: hwdb's
// matmul_efficiency everywhere, the hwdb bandwidths as written.
struct EfficiencyModel {
  // GEMM efficiency (achieved / peak) at the anchors of a GEMM's smallest dimension (rows, in or out
  // features): 16 (a LoRA rank), 64, 512, 4096; between anchors interpolated in log2 of the dimension,
  // beyond them held. Empty: matmul_efficiency for every GEMM.
  std::vector<double> gemm;             // kGemmAnchors values or none
  std::optional<double> attention;      // attention scores and P·V (QK^T, softmax, PV), achieved / peak
  double optimizer_bandwidth_factor = 1.0;  // the AdamW pass's achieved / hbm_bandwidth_bytes_per_s
  std::string source;                   // the calibration file applied, "" for hwdb's figures
};
constexpr int kGemmAnchors = 4;
constexpr double kGemmAnchorDims[kGemmAnchors] = {16.0, 64.0, 512.0, 4096.0};
constexpr const char* kGemmAnchorKeys[kGemmAnchors] = {"16", "64", "512", "4096"};

struct HardwareSpec {
  std::string id;                          // file stem, e.g. "a100-80gb-sxm"
  std::string name;                        // e.g. "NVIDIA A100 80GB SXM4"
  std::string kind = "gpu";                // "gpu", or "cpu" for the host-only test device
  int64_t memory_bytes = 0;                // device memory, e.g. 85899345920 (80 GiB)
  // What one process can allocate: cudaMemGetInfo's total, torch's "total capacity" in its out-of-memory
  // message (nvidia-smi's total less the memory the driver reserves). Equals memory_bytes where the hwdb
  // file has no usable_memory_bytes. Fits is judged against it.
  int64_t usable_memory_bytes = 0;
  double peak_flops_fp32 = 0;              // dense, FLOP/s
  double peak_flops_tf32 = 0;              // dense, FLOP/s; 0 where the GPU has no TF32
  double peak_flops_bf16 = 0;              // dense bf16/fp16 tensor-core FLOP/s
  double peak_flops_fp8 = 0;               // dense; 0 where the GPU has no FP8
  double hbm_bandwidth_bytes_per_s = 0;    // e.g. 2.039e12
  std::string intra_node_link;             // e.g. "nvlink3-nvswitch", "pcie4"
  double intra_node_bandwidth_bytes_per_s = 0;  // achievable per GPU, per direction
  int64_t gpus_per_node = 1;               // e.g. 8
  int64_t nvlink_domain_size = 1;          // GPUs in one NVLink / Infinity Fabric domain: 8 (HGX), 72 (GB200 NVL72),
                                           // 1 (PCIe-only cards)
  bool pcie_only = false;                  // no NVLink / Infinity Fabric: GPU peers talk over PCIe (or host memory)
  double inter_node_bandwidth_bytes_per_s = 0;  // per GPU, per direction
  double pcie_host_bandwidth_bytes_per_s = 0;   // host<->device copies (offload)
  PcieSlot pcie_slot;                      // the card's own interface, which the PCIe figures above assume
  PcieSlot pcie_link;                      // the link planned: pcie_slot, or as it trains in --pcie-slot's slot
  PcieSlot pcie_slot_given;                // --pcie-slot's slot; none stated without the option
  int64_t host_memory_bytes_per_node = 0;  // the node's host memory, e.g. 2 TiB for a DGX H100
  double price_usd_per_gpu_hour = 0;       // indicative on-demand rental, e.g. 2.69
  std::string price_date;                  // "YYYY-MM" the price was read, e.g. "2026-07"
  double matmul_efficiency = 0;            // achieved / peak bf16 for training, e.g. 0.45
  // Measured bf16 GEMM efficiency (achieved / peak_flops_bf16) at kGemmAnchorDims of a GEMM's smallest
  // dimension, one GEMM in isolation, from a published per-shape GEMM benchmark (hwdb key "gemm_efficiency");
  // empty where none is published. Where set, each GEMM of a bf16 / mixed-precision step runs at
  // matmul_efficiency scaled by its shape's measured efficiency relative to the largest anchor's
  // (compute_model.h hwdb_gemm_anchors); a calibration's anchors (EfficiencyModel::gemm) replace these.
  std::vector<double> gemm_efficiency_bf16;
  double comm_latency_s = 0;               // per collective step (alpha), e.g. 1e-5
  int64_t framework_overhead_bytes = 0;    // CUDA context + cuBLAS workspace + allocator slack
  Topology topology;                       // one node; derived as a star when the file has none
  EfficiencyModel efficiency;              // a calibration's parameters (planner/calibration.h), else unset
  std::map<std::string, std::string> sources;  // figure name -> where it comes from
};

// The device memory fits is judged against: usable_memory_bytes where the hwdb file states it, else memory_bytes.
inline int64_t usable_device_bytes(const HardwareSpec& hw) {
  return hw.usable_memory_bytes > 0 ? hw.usable_memory_bytes : hw.memory_bytes;
}

// Parses and validates one hwdb file's JSON; `id` is the file stem used in messages.
HardwareSpec hardware_spec_from_json(const nlohmann::json& j, const std::string& id);

// Loads hwdb/<id>.json (or a path); throws InputError naming the file and the field.
HardwareSpec load_hardware(const std::string& id_or_path);

// The ids of every shipped GPU, sorted.
std::vector<std::string> list_hardware_ids();

}  // namespace ftplan
