// The only translation unit that includes c10d (through torch_compat.h).
#define FTEXEC_INCLUDE_C10D
#include "executor/torch_compat.h"

#include "executor/comm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "executor/run_job.h"
#include "planner/collectives.h"

namespace ftexec {

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::broadcast: return "broadcast";
    case CommOp::send: return "send";
    case CommOp::control: return "control";
  }
  return "?";
}

double CommStats::payload_bytes() const {
  double b = 0;
  for (int i = 0; i < kCommOps; ++i)
    if (i != static_cast<int>(CommOp::control)) b += ops[i].wire_bytes;
  return b;
}

namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;
constexpr int kRingTag = 1;  // ring collectives
constexpr int kP2pTag = 2;   // pipeline point to point
constexpr double kHeartbeatS = 0.5;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

std::string what_of(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

ftplan::Collective planner_op(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return ftplan::Collective::all_reduce;
    case CommOp::reduce_scatter: return ftplan::Collective::reduce_scatter;
    case CommOp::all_gather: return ftplan::Collective::all_gather;
    case CommOp::broadcast: return ftplan::Collective::broadcast;
    default: return ftplan::Collective::send_recv;
  }
}

class GlooComm final : public Comm {
 public:
  explicit GlooComm(const CommOptions& o) : o_(o), timeout_(Ms(static_cast<int64_t>(o.timeout_s * 1000))) {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(o.master_port);
    so.isServer = o.host_store && o.rank == 0;
    so.numWorkers = o.host_store ? c10::optional<std::size_t>(o.world) : c10::nullopt;
    so.waitWorkers = false;
    so.timeout = timeout_;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
      so.isServer = false;
      hb_store_ = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
      auto pg_store = c10::make_intrusive<c10d::PrefixStore>("ftexec/pg", store_);
      if (o.backend == "nccl") {
        pg_ = compat::make_nccl_group(pg_store, o.rank, o.world, timeout_);
      } else {
        pg_ = compat::make_gloo_group(pg_store, o.rank, o.world, timeout_, o.master_addr);
      }
    } catch (const std::exception& e) {
      throw RuntimeFailure("rank " + std::to_string(o.rank) + ": rendezvous at " + o.master_addr + ":" +
                           std::to_string(o.master_port) + " (world size " + std::to_string(o.world) +
                           ") failed within " + std::to_string(o.timeout_s) + " s: " + what_of(e));
    }
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }

  // A sub-group of `parent` (DeviceMesh's dimensions): its own process group over the parent's store,
  // group-local ranks; failures are diagnosed by the parent (the world's heartbeats).
  GlooComm(GlooComm& parent, const RankGroup& ranks, const std::string& name)
      : o_(parent.o_), timeout_(parent.timeout_), parent_(&parent), global_ranks_(ranks) {
    o_.world = static_cast<int>(ranks.size());
    o_.rank = -1;
    for (int i = 0; i < o_.world; ++i)
      if (ranks[i] == parent.o_.rank) o_.rank = i;
    TORCH_CHECK(o_.rank >= 0, "split: the group ", name, " does not hold rank ", parent.o_.rank);
    store_ = parent.store_;
    std::string key = "ftexec/pg/" + name;
    for (int r : ranks) key += "/" + std::to_string(r);
    auto pg_store = c10::make_intrusive<c10d::PrefixStore>(key, store_);
    try {
      if (o_.backend == "nccl") pg_ = compat::make_nccl_group(pg_store, o_.rank, o_.world, timeout_);
      else pg_ = compat::make_gloo_group(pg_store, o_.rank, o_.world, timeout_, o_.master_addr);
    } catch (const std::exception& e) {
      throw RuntimeFailure("rank " + std::to_string(parent.o_.rank) + ": process group " + name + " failed within " +
                           std::to_string(o_.timeout_s) + " s: " + what_of(e));
    }
  }

  std::unique_ptr<Comm> split(const RankGroup& ranks, const std::string& name) override;

  ~GlooComm() override {
    {
      std::lock_guard<std::mutex> lock(hb_mutex_);
      stop_ = true;
    }
    hb_cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  int rank() const override { return o_.rank; }
  int world() const override { return o_.world; }
  double timeout_s() const override { return o_.timeout_s; }

  void all_reduce_sum(const at::Tensor& t, double padding) override {
    all_reduce_sum_async(t, padding);
    wait_all();
  }

  void all_reduce_sum_async(const at::Tensor& t, double padding) override {
    Timer timer(this);
    begin(CommOp::all_reduce);
    count(CommOp::all_reduce, gloo_reduce_bytes(t), padding);
    Pending p;
    p.target = t;
    p.buffer = needs_fp32(t) ? t.to(at::kFloat) : t;
    std::vector<at::Tensor> v{p.buffer};
    p.work = guarded("all_reduce", [&] { return pg_->allreduce(v); });
    pending_.push_back(std::move(p));
  }

  void all_reduce_max(const at::Tensor& t) override {
    Timer timer(this);
    begin(CommOp::all_reduce);
    count(CommOp::all_reduce, double(t.nbytes()), 0);
    TORCH_CHECK(t.is_contiguous() && !needs_fp32(t), "all_reduce_max: a contiguous fp32 tensor");
    std::vector<at::Tensor> v{alias(t)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MAX;
    auto w = guarded("all_reduce (max)", [&] { return pg_->allreduce(v, opts); });
    wait(w, "all_reduce (max)", -1);
  }

  void wait_all() override {
    Timer timer(this);
    for (auto& p : pending_) {
      wait(p.work, "all_reduce", -1);
      if (!p.buffer.is_same(p.target)) p.target.copy_(p.buffer);
    }
    pending_.clear();
  }

  void reduce_scatter_sum(const at::Tensor& flat_in, double padding, const RankGroup& group) override {
    Timer timer(this);
    const Ring ring = ring_of(group);
    check_flat(flat_in, "reduce_scatter_sum", ring.n);
    begin(CommOp::reduce_scatter);
    count(CommOp::reduce_scatter, double(flat_in.nbytes()), padding, ring.n);
    ring_reduce_scatter(flat_in, ring);
  }

  void all_gather(const at::Tensor& flat_in, double padding, const RankGroup& group) override {
    Timer timer(this);
    const Ring ring = ring_of(group);
    check_flat(flat_in, "all_gather", ring.n);
    begin(CommOp::all_gather);
    count(CommOp::all_gather, double(flat_in.nbytes()), padding, ring.n);
    ring_all_gather(flat_in, ring);
  }

  void all_reduce_ring(const at::Tensor& flat_in, double padding, const RankGroup& group) override {
    Timer timer(this);
    const Ring ring = ring_of(group);
    check_flat(flat_in, "all_reduce_ring", ring.n);
    begin(CommOp::all_reduce);
    count(CommOp::all_reduce, double(flat_in.nbytes()), padding, ring.n);
    if (ring.n == 1) return;
    ring_reduce_scatter(flat_in, ring);  // (bf16: summed in fp32, sent in bf16)
    ring_all_gather(flat_in, ring);
  }

  void broadcast(const at::Tensor& t, int root) override {
    Timer timer(this);
    begin(CommOp::broadcast);
    count(CommOp::broadcast, double(t.nbytes()), 0);
    std::vector<at::Tensor> v{alias(t)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    auto w = guarded("broadcast", [&] { return pg_->broadcast(v, opts); });
    wait(w, "broadcast", root);
  }

  void send(const at::Tensor& t, int dst) override {
    Timer timer(this);
    begin(CommOp::send);
    count(CommOp::send, double(t.nbytes()), 0);
    std::vector<at::Tensor> v{alias(t.contiguous())};
    auto w = guarded("send", [&] { return pg_->send(v, dst, kP2pTag); });
    wait(w, "send", dst);
  }

  void recv(const at::Tensor& t, int src) override {
    Timer timer(this);
    begin(CommOp::send);  // counted by the sender
    TORCH_CHECK(t.is_contiguous(), "recv: the tensor must be contiguous");
    std::vector<at::Tensor> v{alias(t)};
    auto w = guarded("recv", [&] { return pg_->recv(v, src, kP2pTag); });
    wait(w, "recv", src);
  }

  void send_recv(const at::Tensor& out_in, int dst, const at::Tensor& in, int src) override {
    Timer timer(this);
    begin(CommOp::send);
    count(CommOp::send, double(out_in.nbytes()), 0);  // the received bytes are counted by their sender
    TORCH_CHECK(in.is_contiguous(), "send_recv: the receiving tensor must be contiguous");
    const at::Tensor out = out_in.contiguous();  // alive until both complete
    std::vector<at::Tensor> o{alias(out)}, i{alias(in)};
    auto ws = guarded("send", [&] { return pg_->send(o, dst, kP2pTag); });
    auto wr = guarded("recv", [&] { return pg_->recv(i, src, kP2pTag); });
    wait(wr, "recv", src);
    wait(ws, "send", dst);
  }

  void barrier() override {
    Timer timer(this);
    begin(CommOp::control);
    auto w = guarded("barrier", [&] { return pg_->barrier(); });
    wait(w, "barrier", -1);
  }

  double all_reduce_scalar(double value, bool max) override {
    Timer timer(this);
    begin(CommOp::control);
    at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble));
    count(CommOp::control, ftplan::wire_bytes(ftplan::Collective::all_reduce, 8, o_.world), 0, o_.world, /*formula=*/false);
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions opts;
    opts.reduceOp = max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    auto w = guarded("all_reduce (control)", [&] { return pg_->allreduce(v, opts); });
    wait(w, "all_reduce (control)", -1);
    return t.item<double>();
  }

  void set_step(int64_t step) override {
    step_.store(step);
    if (parent_) parent_->set_step(step);
  }

  void report_failure(const std::string& what) override {
    if (parent_) return parent_->report_failure(what);
    try {
      const std::string v = what.substr(0, 400);
      std::lock_guard<std::mutex> io(io_mutex_);
      hb_store_->set("ftexec/failed/" + std::to_string(o_.rank), std::vector<uint8_t>(v.begin(), v.end()));
    } catch (...) {
    }
  }

  void store_set(const std::string& key, const std::string& value) override {
    store_->set("ftexec/kv/" + key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string store_get(const std::string& key) override {
    try {
      auto v = store_->get("ftexec/kv/" + key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      throw RuntimeFailure("rank " + std::to_string(o_.rank) + ": waiting for \"" + key + "\" in the store: " + what_of(e));
    }
  }

  CommStats stats() const override { return stats_; }
  void reset_stats() override { stats_ = CommStats{}; }

 private:
  struct Pending {
    at::Tensor target, buffer;
    c10::intrusive_ptr<c10d::Work> work;
  };
  struct Timer {
    GlooComm* c;
    Clock::time_point t0 = Clock::now();
    explicit Timer(GlooComm* comm) : c(comm) {}
    ~Timer() { c->stats_.time_s += std::chrono::duration<double>(Clock::now() - t0).count(); }
  };

  // This rank's place in a ring: its position, the group's size, and its neighbours' global ranks.
  struct Ring {
    int pos = 0, n = 1, next = 0, prev = 0;
  };
  Ring ring_of(const RankGroup& group) const {
    Ring g;
    if (group.empty()) {
      g.n = o_.world, g.pos = o_.rank;
      g.next = (g.pos + 1) % g.n, g.prev = (g.pos + g.n - 1) % g.n;
      return g;
    }
    g.n = static_cast<int>(group.size());
    g.pos = -1;
    for (int i = 0; i < g.n; ++i)
      if (group[i] == o_.rank) g.pos = i;
    TORCH_CHECK(g.pos >= 0, "rank group without this rank (", o_.rank, ")");
    g.next = group[(g.pos + 1) % g.n], g.prev = group[(g.pos + g.n - 1) % g.n];
    return g;
  }

  // N-1 steps: send one chunk to the next rank, add the chunk received from the previous one; chunk
  // `pos` ends up summed over the ring.
  void ring_reduce_scatter(const at::Tensor& flat_in, const Ring& g) {
    const int N = g.n, r = g.pos;
    if (N == 1) return;
    at::NoGradGuard no_grad;
    // Chunks travel in the tensor's dtype (bf16: half of fp32's bytes, as NCCL sends them). Gloo
    // has no bf16 sum, so a bf16 tensor is summed in an fp32 copy and each partial sum is rounded
    // to bf16 as it is sent, as NCCL's ring rounds it at every hop.
    const bool widen = needs_fp32(flat_in);
    const at::Tensor wire = alias(flat_in);
    const at::Tensor acc = widen ? flat_in.to(at::kFloat) : wire;
    const int64_t n = wire.numel() / N;
    at::Tensor scratch = at::empty({n}, wire.options());
    for (int s = 0; s < N - 1; ++s) {
      const int send_idx = ((r - s - 1) % N + N) % N, recv_idx = ((r - s - 2) % N + N) % N;
      const at::Tensor partial = acc.narrow(0, send_idx * n, n);
      std::vector<at::Tensor> out{widen ? partial.to(wire.scalar_type()) : partial}, in{scratch};
      auto ws = guarded("reduce_scatter", [&] { return pg_->send(out, g.next, kRingTag); });
      auto wr = guarded("reduce_scatter", [&] { return pg_->recv(in, g.prev, kRingTag); });
      wait(wr, "reduce_scatter", g.prev);
      wait(ws, "reduce_scatter", g.next);
      acc.narrow(0, recv_idx * n, n).add_(widen ? scratch.to(at::kFloat) : scratch);
    }
    if (widen) wire.narrow(0, r * n, n).copy_(acc.narrow(0, r * n, n));
  }

  // N-1 steps straight into the chunks of the flat output; chunk `pos` must be filled.
  void ring_all_gather(const at::Tensor& flat_in, const Ring& g) {
    const int N = g.n, r = g.pos;
    if (N == 1) return;
    at::Tensor flat = alias(flat_in);  // raw bytes: no version-counter bump, any dtype
    const int64_t n = flat.numel() / N;
    for (int s = 0; s < N - 1; ++s) {
      const int send_idx = ((r - s) % N + N) % N, recv_idx = ((r - s - 1) % N + N) % N;
      std::vector<at::Tensor> out{flat.narrow(0, send_idx * n, n)}, in{flat.narrow(0, recv_idx * n, n)};
      auto ws = guarded("all_gather", [&] { return pg_->send(out, g.next, kRingTag); });
      auto wr = guarded("all_gather", [&] { return pg_->recv(in, g.prev, kRingTag); });
      wait(wr, "all_gather", g.prev);
      wait(ws, "all_gather", g.next);
    }
  }

  static bool needs_fp32(const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  }
  // Gloo's own all-reduce (DDP's buckets) moves bf16/fp16 as fp32: twice the bytes.
  static double gloo_reduce_bytes(const at::Tensor& t) { return double(t.numel()) * (needs_fp32(t) ? 4 : t.element_size()); }

  // A tensor over the same bytes with its own version counter (c10d writes without autograd).
  static at::Tensor alias(const at::Tensor& t) {
    return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().requires_grad(false));
  }

  void check_flat(const at::Tensor& flat, const char* what, int n) const {
    TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous(), what, ": expected a contiguous 1-D buffer");
    TORCH_CHECK(flat.numel() % n == 0, what, ": ", flat.numel(), " elements is not a multiple of the group size ",
                n, " (pad the flat buffer)");
  }

  // `n`: the ranks taking part (the world, or the group's size).
  void count(CommOp op, double bytes, double padding, int n = -1, bool formula = true) {
    if (n < 0) n = o_.world;
    auto& c = stats_.ops[static_cast<int>(op)];
    c.calls += 1;
    const double scale = bytes > 0 ? ftplan::wire_bytes(planner_op(op), bytes, n) / bytes : 0;
    c.wire_bytes += formula ? ftplan::wire_bytes(planner_op(op), bytes, n) : bytes;
    c.padding_bytes += padding * scale;
  }

  void begin(CommOp op) {
    seq_.fetch_add(1);
    op_.store(static_cast<int>(op));
  }

  template <class F>
  c10::intrusive_ptr<c10d::Work> guarded(const char* what, F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      fail(what, -1, what_of(e));
    }
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& w, const char* what, int peer) {
    bool ok = false;
    try {
      ok = w->wait(timeout_);
    } catch (const std::exception& e) {
      fail(what, peer, what_of(e));
    }
    if (!ok) fail(what, peer, "timed out");
  }

  [[noreturn]] void fail(const char* what, int peer, const std::string& detail) {
    if (parent_) {  // a sub-group: name the global ranks and let the world's heartbeats diagnose
      parent_->fail(what, peer >= 0 ? global_ranks_[peer] : -1, detail);
    }
    std::ostringstream m;
    m << "rank " << o_.rank << ": " << what;
    if (peer >= 0) m << " with rank " << peer;
    m << " failed at step " << step_.load() << " (collective #" << seq_.load() << ", timeout " << o_.timeout_s
      << " s): " << detail.substr(0, 300);
    const std::string who = diagnose();
    if (!who.empty()) m << "; " << who;
    throw RuntimeFailure(m.str());
  }

  // What the store says about the other ranks: failures they reported, heartbeats that stopped,
  // ranks behind this one. Best effort: the store lives in rank 0.
  std::string diagnose() {
    std::vector<std::string> notes;
    // Let every live rank publish its current progress first (heartbeats are kHeartbeatS apart).
    std::this_thread::sleep_for(std::chrono::duration<double>(2.5 * kHeartbeatS));
    std::lock_guard<std::mutex> io(io_mutex_);
    try {
      hb_store_->setTimeout(Ms(2000));
      const double t = now_s();
      const int64_t my_seq = seq_.load();
      for (int k = 0; k < o_.world; ++k) {
        if (k == o_.rank) continue;
        const std::string fk = "ftexec/failed/" + std::to_string(k);
        if (hb_store_->check({fk})) {
          auto v = hb_store_->get(fk);
          std::string first(v.begin(), v.end());
          first = first.substr(0, first.find(';'));  // its own diagnosis follows; keep the cause
          notes.push_back("rank " + std::to_string(k) + " reported: " + first);
          continue;
        }
        const std::string hk = "ftexec/hb/" + std::to_string(k);
        if (!hb_store_->check({hk})) {
          notes.push_back("rank " + std::to_string(k) + " never reported progress");
          continue;
        }
        auto v = hb_store_->get(hk);
        std::istringstream in(std::string(v.begin(), v.end()));
        double when = 0;
        int64_t step = 0, seq = 0;
        int op = 0;
        char sep;
        in >> when >> sep >> step >> sep >> seq >> sep >> op;
        if (t - when > 2 * kHeartbeatS)
          notes.push_back("rank " + std::to_string(k) + " stopped responding " + std::to_string(int(t - when)) +
                          " s ago (died or was killed?) at step " + std::to_string(step));
        else if (seq < my_seq)
          notes.push_back("rank " + std::to_string(k) + " is alive but behind (step " + std::to_string(step) +
                          ", collective #" + std::to_string(seq) + ": hung?)");
      }
    } catch (const std::exception&) {
      return o_.rank == 0 ? "" : "the rendezvous store on rank 0 is unreachable: rank 0 died or was killed";
    }
    std::string s;
    for (const auto& n : notes) s += (s.empty() ? "" : "; ") + n;
    return s;
  }

  void heartbeat_loop() {
    std::unique_lock<std::mutex> lock(hb_mutex_);
    while (!stop_) {
      std::ostringstream v;
      v.precision(17);
      v << now_s() << ";" << step_.load() << ";" << seq_.load() << ";" << op_.load();
      const std::string s = v.str();
      lock.unlock();
      try {
        std::lock_guard<std::mutex> io(io_mutex_);
        hb_store_->set("ftexec/hb/" + std::to_string(o_.rank), std::vector<uint8_t>(s.begin(), s.end()));
      } catch (...) {
      }
      lock.lock();
      hb_cv_.wait_for(lock, std::chrono::duration<double>(kHeartbeatS), [this] { return stop_; });
    }
  }

  CommOptions o_;
  Ms timeout_;
  GlooComm* parent_ = nullptr;  // a sub-group's world
  RankGroup global_ranks_;      // a sub-group's members (global ranks)
  c10::intrusive_ptr<c10d::Store> store_, hb_store_;
  c10::intrusive_ptr<compat::C10dGroup> pg_;
  std::vector<Pending> pending_;
  CommStats stats_;
  std::atomic<int64_t> step_{0}, seq_{0};
  std::atomic<int> op_{0};
  std::thread heartbeat_;
  std::mutex hb_mutex_;
  std::mutex io_mutex_;  // hb_store_ is shared by the heartbeat thread and the failure paths
  std::condition_variable hb_cv_;
  bool stop_ = false;
};

// One rank alone (WORLD_SIZE 1): every collective is the identity, nothing is sent, no store or
// process group is built (so a one-process run needs no port). Calls are counted as the planner's
// formulas count them over one rank: zero bytes.
class LocalComm final : public Comm {
 public:
  explicit LocalComm(const CommOptions& o) : o_(o) {}
  int rank() const override { return 0; }
  int world() const override { return 1; }
  double timeout_s() const override { return o_.timeout_s; }
  void all_reduce_sum(const at::Tensor&, double) override { count(CommOp::all_reduce); }
  void all_reduce_sum_async(const at::Tensor&, double) override { count(CommOp::all_reduce); }
  void wait_all() override {}
  void all_reduce_max(const at::Tensor&) override { count(CommOp::all_reduce); }
  void reduce_scatter_sum(const at::Tensor&, double, const RankGroup&) override { count(CommOp::reduce_scatter); }
  void all_gather(const at::Tensor&, double, const RankGroup&) override { count(CommOp::all_gather); }
  void all_reduce_ring(const at::Tensor&, double, const RankGroup&) override { count(CommOp::all_reduce); }
  void broadcast(const at::Tensor&, int) override { count(CommOp::broadcast); }
  void send(const at::Tensor&, int dst) override { no_peer("send", dst); }
  void recv(const at::Tensor&, int src) override { no_peer("recv", src); }
  void send_recv(const at::Tensor&, int dst, const at::Tensor&, int) override { no_peer("send_recv", dst); }
  void barrier() override { count(CommOp::control); }
  double all_reduce_scalar(double value, bool) override {
    count(CommOp::control);
    return value;
  }
  void set_step(int64_t) override {}
  void report_failure(const std::string&) override {}
  void store_set(const std::string& key, const std::string& value) override { kv_[key] = value; }
  std::string store_get(const std::string& key) override {
    const auto it = kv_.find(key);
    if (it == kv_.end()) throw RuntimeFailure("rank 0: no \"" + key + "\" in the store of a one-rank run");
    return it->second;
  }
  CommStats stats() const override { return stats_; }
  void reset_stats() override { stats_ = CommStats{}; }
  std::unique_ptr<Comm> split(const RankGroup& ranks, const std::string& name) override {
    TORCH_CHECK(ranks.size() == 1 && ranks[0] == 0, "split ", name, ": a one-rank run has rank 0 only");
    return std::make_unique<LocalComm>(o_);
  }

 private:
  void count(CommOp op) { stats_.ops[static_cast<int>(op)].calls += 1; }
  [[noreturn]] void no_peer(const char* what, int peer) {
    throw RuntimeFailure("rank 0: " + std::string(what) + " with rank " + std::to_string(peer) + " in a one-rank run");
  }
  CommOptions o_;
  CommStats stats_;
  std::map<std::string, std::string> kv_;
};

std::unique_ptr<Comm> GlooComm::split(const RankGroup& ranks, const std::string& name) {
  if (ranks.size() == 1) {
    CommOptions one = o_;
    one.world = 1, one.rank = 0;
    return std::make_unique<LocalComm>(one);
  }
  RankGroup global = ranks;
  if (parent_)
    for (auto& r : global) r = global_ranks_.at(r);
  GlooComm& world = parent_ ? *parent_ : *this;
  return std::make_unique<GlooComm>(world, global, name);
}

}  // namespace

std::unique_ptr<Comm> Comm::connect(const CommOptions& options) {
  if (options.world == 1) return std::make_unique<LocalComm>(options);
  return std::make_unique<GlooComm>(options);
}

std::string resolve_backend(const std::string& backend, bool cuda) {
  return backend == "auto" ? (cuda ? "nccl" : "gloo") : backend;
}

CommOptions comm_options(const DistEnv& env, double timeout_s, const std::string& backend) {
  CommOptions co;
  co.rank = env.rank;
  co.world = env.world;
  co.master_addr = env.master_addr;
  co.master_port = env.master_port;
  co.host_store = env.host_store;
  co.timeout_s = timeout_s;
  co.backend = backend;
  return co;
}

void set_rank_threads(int64_t threads, const DistEnv& env) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads > 0 ? static_cast<int>(threads) : std::max(1, cores / std::max(1, env.local_world)));
}

}  // namespace ftexec
