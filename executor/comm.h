// The communication seam of the distributed executor: the few collectives the strategies use, over a
// c10d process group (Gloo on CPU; NCCL where LibTorch has CUDA), with every byte counted.
//
//   all_reduce_sum      Gloo's allreduce, in place; bf16/fp16 are reduced in an fp32 copy (Gloo
//                       rejects bf16 reductions; ReduceOp::AVG kills the process: SUM, then divide),
//                       so DDP's buckets under mixed precision move, and count, twice the bf16 bytes.
//   reduce_scatter_sum  a ring over send/recv, in place: N-1 steps, each rank sends one chunk (M/N)
//                       to the next rank and adds the chunk it receives; chunk `rank` ends up summed.
//                       bf16/fp16 chunks travel in their dtype and are added in fp32 (as NCCL's
//                       ring: rounded at every hop), so the bytes are the planner's under mixed.
//   all_gather          a ring over send/recv straight into the chunks of the flat output.
//   all_reduce_ring     reduce-scatter then all-gather rings (2(N-1)/N·M) over a rank group: FSDP
//                       hybrid's all-reduce of gradient shards across the replica groups.
//   broadcast, send, recv, barrier.
// The rings take an optional RankGroup (FSDP hybrid's shard and replica groups): the collective runs
// among those ranks only, in the group's order, and is counted with the group's size as N. The
// group's ranks reach each other over the one world process group (send/recv between members), so
// no c10d subgroup is built and every group shares the fault reporting.
// Gloo in libtorch 1.13 has no reduce_scatter/_allgather_base; the notes' alltoall_base + local sum
// works too, but needs a second M-byte output buffer and Gloo's own allgather copies through an M-byte
// temporary. The rings move exactly the bytes of the α-β formulas (Thakur et al. 2005), need at most
// M/N bytes of scratch, and write without bumping autograd version counters (ZeRO-3 refills buffers
// that autograd saved). Flat buffers must hold a multiple of world() elements (the callers pad).
//
// Counting: each call adds ftplan::wire_bytes(op, M, N) (planner/collectives.h: all-reduce
// 2(N-1)/N·M, reduce-scatter and all-gather (N-1)/N·M, send M) for the M bytes it moves, so the
// measured figure and the planner's comm_bytes_per_step use one formula. Control traffic (the loss,
// the gradient norm, barriers) is counted apart, as the planner leaves it out.
//
// Faults: every wait has the --timeout-s limit. A heartbeat thread publishes this rank's progress
// (step, collective number, operation) to the rendezvous store every 0.5 s; when a collective fails or
// times out, the error names the ranks that reported a failure, stopped responding, or fell behind.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "executor/launch.h"

namespace ftexec {

enum class CommOp { all_reduce, reduce_scatter, all_gather, broadcast, send, control };
constexpr int kCommOps = 6;
const char* comm_op_name(CommOp op);  // "all_reduce", ..., "control"

struct CommCounter {
  int64_t calls = 0;
  double wire_bytes = 0;     // bytes this rank sent, by the planner's formula
  double padding_bytes = 0;  // of which padding (flat buffers rounded up to a multiple of N)
};

struct CommStats {
  std::array<CommCounter, kCommOps> ops;
  double time_s = 0;  // wall time inside communication calls (launch + wait)
  double payload_bytes() const;  // all ops but control
};

struct CommOptions {
  int rank = 0;
  int world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool host_store = true;      // rank 0 hosts the TCPStore; false under torchrun (its agent hosts it)
  double timeout_s = 60.0;     // every collective and the rendezvous
  std::string backend = "gloo";  // gloo | nccl
};

// --backend as given, or for "auto": nccl on CUDA, gloo on the CPU.
std::string resolve_backend(const std::string& backend, bool cuda);
// This rank's connection: the rendezvous the launcher (or torchrun, Slurm, MPI) gave in `env`.
CommOptions comm_options(const DistEnv& env, double timeout_s, const std::string& backend);
// This rank's intra-op threads: `threads` when set (> 0), else the cores shared among the node's ranks.
void set_rank_threads(int64_t threads, const DistEnv& env);

// Global ranks that run one collective among themselves, in ring order; must contain this rank.
// Empty: every rank, 0..world-1.
using RankGroup = std::vector<int>;

class Comm {
 public:
  // Rendezvous through c10d's TCPStore and build the process group. RuntimeFailure on timeout.
  // A world of one rank gets a local Comm instead: collectives are the identity, the store a map.
  static std::unique_ptr<Comm> connect(const CommOptions& options);
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int world() const = 0;

  // In place. `padding_bytes`: how much of t is padding (for the counters).
  virtual void all_reduce_sum(const at::Tensor& t, double padding_bytes = 0) = 0;
  // Launches an all-reduce and returns at once (Gloo runs it on its worker thread); wait_all() ends
  // every launched one. Used by DDP's buckets while backward runs.
  virtual void all_reduce_sum_async(const at::Tensor& t, double padding_bytes = 0) = 0;
  virtual void wait_all() = 0;
  // In place, synchronous: the element-wise maximum over all ranks (Gloo's allreduce with MAX),
  // counted as an all-reduce (the vocabulary-parallel cross-entropy's logit maximum).
  virtual void all_reduce_max(const at::Tensor& t) = 0;
  // flat: contiguous, numel % N == 0 (N: the group's size). Afterwards chunk i (this rank's
  // position in the group; its rank without one) holds the sum over the group; the other chunks
  // hold partial sums.
  virtual void reduce_scatter_sum(const at::Tensor& flat, double padding_bytes = 0, const RankGroup& group = {}) = 0;
  // flat: contiguous, numel % N == 0, chunk i already filled; fills the others.
  virtual void all_gather(const at::Tensor& flat, double padding_bytes = 0, const RankGroup& group = {}) = 0;
  // In place, synchronous: the sum over the group (ring reduce-scatter + all-gather, counted as one
  // all-reduce of M bytes over N). flat: contiguous, numel % N == 0.
  virtual void all_reduce_ring(const at::Tensor& flat, double padding_bytes, const RankGroup& group) = 0;
  virtual void broadcast(const at::Tensor& t, int root) = 0;
  virtual void send(const at::Tensor& t, int dst) = 0;
  virtual void recv(const at::Tensor& t, int src) = 0;
  // Sends `out` to dst and receives `in` from src at once, waiting for both (the 1F1B pipeline's
  // steady state: with two blocking calls in sequence, neighbours that both send first deadlock).
  virtual void send_recv(const at::Tensor& out, int dst, const at::Tensor& in, int src) = 0;
  virtual void barrier() = 0;

  // Control traffic (not in the per-step figures): a sum or max over ranks of one value.
  virtual double all_reduce_scalar(double value, bool max = false) = 0;

  // Progress for the failure messages (published by the heartbeat thread).
  virtual void set_step(int64_t step) = 0;
  // Tells the other ranks (through the store) why this rank is failing; best effort.
  virtual void report_failure(const std::string& what) = 0;

  // The rendezvous store, for small results (each rank's measured figures, merged by rank 0):
  // works across nodes without a shared file system. store_get waits up to the timeout.
  virtual void store_set(const std::string& key, const std::string& value) = 0;
  virtual std::string store_get(const std::string& key) = 0;

  virtual CommStats stats() const = 0;
  virtual void reset_stats() = 0;
  virtual double timeout_s() const = 0;

  // A communicator over `ranks` (global ranks of this world, ring order; must hold this rank): its
  // own c10d process group (Gloo or NCCL, built through the shared store under "ftexec/pg/<name>"),
  // group-local ranks 0..size-1, its own counters. Every member calls it together, and every rank
  // builds its groups in the same order (executor/device_mesh.h). A group of one rank is local.
  virtual std::unique_ptr<Comm> split(const RankGroup& ranks, const std::string& name) = 0;
};

}  // namespace ftexec
