#include "executor/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <ostream>
#include <thread>

#include "planner/errors.h"

namespace ftexec {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, std::vector<std::string>& problems, int fallback = -1) {
  const char* v = env(name);
  if (!v) {
    if (fallback < 0) problems.push_back(std::string(name) + " is not set");
    return fallback < 0 ? 0 : fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) {
    problems.push_back(std::string(name) + "=\"" + v + "\" is not a non-negative integer");
    return 0;
  }
  return static_cast<int>(x);
}

void read_master(DistEnv& e, std::vector<std::string>& problems, const std::string& how) {
  if (!env("MASTER_ADDR")) problems.push_back("MASTER_ADDR is not set (" + how + ")");
  else e.master_addr = env("MASTER_ADDR");
  e.master_port = env_int("MASTER_PORT", problems);
  if (!env("MASTER_PORT")) problems.back() += " (" + how + ")";
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "stopped (status " + std::to_string(status) + ")";
}

volatile sig_atomic_t g_group = 0;

void forward_signal(int sig) {
  if (g_group > 0) ::kill(-g_group, SIGKILL);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv e;
  std::vector<std::string> problems;
  if (env("RANK") || env("WORLD_SIZE")) {
    e.source = env("FTEXEC_LAUNCHER") ? "ftexec" : "torchrun";
    e.rank = env_int("RANK", problems);
    e.world = env_int("WORLD_SIZE", problems);
    e.local_rank = env_int("LOCAL_RANK", problems, e.rank);
    e.local_world = env_int("LOCAL_WORLD_SIZE", problems, e.world);
    read_master(e, problems, "torchrun sets it");
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    e.host_store = !(agent && std::string(agent) == "True");
  } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = env_int("SLURM_PROCID", problems);
    e.world = env_int("SLURM_NTASKS", problems);
    e.local_rank = env_int("SLURM_LOCALID", problems);
    e.local_world = env_int("SLURM_NTASKS_PER_NODE", problems, 1);
    read_master(e, problems, "under Slurm export the first node of $SLURM_JOB_NODELIST and a free port");
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    e.source = "openmpi";
    e.rank = env_int("OMPI_COMM_WORLD_RANK", problems);
    e.world = env_int("OMPI_COMM_WORLD_SIZE", problems);
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", problems);
    e.local_world = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", problems, 1);
    read_master(e, problems, "under mpirun pass -x MASTER_ADDR -x MASTER_PORT");
  }
  if (problems.empty() && e.world < 1) problems.push_back("the world size is " + std::to_string(e.world));
  if (problems.empty() && e.rank >= e.world)
    problems.push_back("rank " + std::to_string(e.rank) + " >= world size " + std::to_string(e.world));
  if (!problems.empty()) {
    std::string msg = "distributed environment (" + e.source + "): ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    ftplan::fail_input(msg);
  }
  return e;
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) ftplan::fail_input(std::string("socket(): ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    ftplan::fail_input(std::string("no free TCP port: ") + std::strerror(errno));
  }
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

int launch_local(const LaunchOptions& o, std::ostream& log) {
  if (!o.rank_main) throw std::logic_error("launch_local: no rank_main");
  const double grace_s = std::min(o.grace_s, o.timeout_s);
  using Clock = std::chrono::steady_clock;
  const int port = free_tcp_port();
  std::vector<pid_t> pids(o.nproc, 0);
  std::vector<bool> done(o.nproc, false);
  pid_t group = 0;
  const pid_t parent = ::getpid();
  std::cout.flush();  // a child must not write the launcher's buffered output again
  std::cerr.flush();
  std::fflush(nullptr);
  for (int r = 0; r < o.nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      log << "ftexec: fork failed for rank " << r << ": " << std::strerror(errno) << "\n";
      if (group > 0) ::kill(-group, SIGKILL);
      return 3;
    }
    if (pid == 0) {
      ::setpgid(0, group);                   // group 0: this child leads a new group
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);    // never outlive the launcher
      if (::getppid() != parent) std::_Exit(3);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("FTEXEC_LAUNCHER", "1", 1);
      ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
      const int code = o.rank_main();
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      std::exit(code);  // as the rank's own main would return: static destructors run
    }
    if (group == 0) group = pid;
    ::setpgid(pid, group);  // also from the parent: no race with the child's own call
    pids[r] = pid;
  }
  g_group = group;
  auto old_int = ::signal(SIGINT, forward_signal);
  auto old_term = ::signal(SIGTERM, forward_signal);

  int exit_code = 0, first_failed = -1, first_signaled = -1, remaining = o.nproc;
  std::string signaled_how;
  Clock::time_point deadline{};
  bool killed = false;
  while (remaining > 0) {
    int status = 0;
    const pid_t pid = ::waitpid(-group, &status, WNOHANG);
    if (pid > 0) {
      int r = 0;
      while (r < o.nproc && pids[r] != pid) ++r;
      if (r == o.nproc) continue;
      done[r] = true;
      --remaining;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !killed) {
        log << "ftexec: rank " << r << " (pid " << pid << ") " << describe_status(status) << "\n";
        if (WIFSIGNALED(status) && first_signaled < 0) {
          first_signaled = r;
          signaled_how = describe_status(status);
        }
        if (first_failed < 0) {
          first_failed = r;
          exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
          deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (first_failed >= 0 && !killed && Clock::now() >= deadline) {
      std::string rest;
      for (int r = 0; r < o.nproc; ++r)
        if (!done[r]) rest += (rest.empty() ? "" : ", ") + std::to_string(r);
      log << "ftexec: rank(s) " << rest << " still running " << grace_s
          << " s after rank " << first_failed << " failed (hung?): killing them (process group " << group << ")\n";
      ::kill(-group, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::signal(SIGINT, old_int);
  ::signal(SIGTERM, old_term);
  g_group = 0;
  if (first_failed >= 0) {
    if (first_signaled >= 0)
      log << "ftexec: failed: rank " << first_signaled << " " << signaled_how << "; the run is incomplete\n";
    else
      log << "ftexec: failed: rank " << first_failed << " failed first; the run is incomplete\n";
    return exit_code == 0 ? 3 : exit_code;
  }
  return 0;
}

}  // namespace ftexec
