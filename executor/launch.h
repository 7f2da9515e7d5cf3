// Where a rank learns who it is, and how `ftexec run --nproc N` starts N local ranks. No LibTorch.
//
// Environments read, first match wins (every operand named in the errors):
//   ftexec --nproc / torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//                               (torchrun's agent hosts the store when TORCHELASTIC_USE_AGENT_STORE=True:
//                               every rank, rank 0 too, is then a client)
//   Slurm (srun)                SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE + MASTER_ADDR/PORT
//   OpenMPI (mpirun)            OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE + MASTER_ADDR/PORT
//   none                        one process, rank 0 of 1
//
// The local launcher forks N ranks with the first set, each child in one process group and killed
// with the launcher (PR_SET_PDEATHSIG). A child runs LaunchOptions::rank_main and exits with its code:
// no exec, so the ranks share the launcher's loaded libraries (LibTorch's start-up, ~0.6 s of CPU per
// process with Debian's build, is paid once per run instead of once per rank). It waits for all of them; when one fails it
// gives the others a grace period to report (they notice a dead peer at once, a hung one within the
// collective timeout), then kills the group, says which rank failed and how, and returns non-zero.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace ftexec {

struct DistEnv {
  int rank = 0;                     // e.g. 3
  int world = 1;                    // e.g. 8
  int local_rank = 0;               // rank on this node, e.g. 3
  int local_world = 1;              // ranks on this node, e.g. 4
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool host_store = true;           // rank 0 hosts the TCPStore
  std::string source = "none";      // "ftexec", "torchrun", "slurm", "openmpi", "none"
};

// Reads the environment; InputError naming every missing or malformed variable.
DistEnv dist_env_from_environment();

// A TCP port free on 127.0.0.1 now (bound to port 0 and released).
int free_tcp_port();

struct LaunchOptions {
  int nproc = 2;                 // ranks to start, e.g. 4
  double timeout_s = 60;         // the ranks' collective timeout: how long a hang can last
  double grace_s = 5;            // after a failure, how long the others get to report theirs; capped at
                                 // timeout_s (a peer blocked on the failed rank fails within one timeout)
  // What each rank runs, in its forked child with the rank environment set; returns the exit code.
  // The launcher must not have started threads, CUDA or a process group before it forks: ftexec's
  // launcher has only parsed and checked the job (executor/main.cpp).
  std::function<int()> rank_main;
};

// Forks `nproc` ranks that run options.rank_main with the rank environment, waits, and returns the
// exit code: 0 when every rank succeeded, else the first failure's (3 when it was killed by a
// signal). Writes what happened to `log` (stderr).
int launch_local(const LaunchOptions& options, std::ostream& log);

}  // namespace ftexec
