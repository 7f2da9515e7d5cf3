// Checkpoint manifests, their verification on --resume, and --keep-last ([checkpoint]). The first
// tests build checkpoint folders by hand (no ranks); the [dist] ones run `ftexec run --nproc 2` on
// the tiny config and share one checkpoint run (ZeRO-3, a checkpoint every step, --keep-last 2,
// stopped at step 6) between every case, each on its own copy of the folder.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dist_test_util.h"
#include "executor/checkpoint.h"
#include "executor_test_util.h"
#include "planner/errors.h"

#undef CHECK
#include <catch2/catch.hpp>

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using ftexec_test::run_ftexec;
using ftexec_test::ScratchDir;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// Lines of `text` that contain `needle`.
int lines_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}

std::vector<std::string> step_folders(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& f : ftexec::checkpoint_folders(dir)) out.push_back(fs::path(f.path).filename().string());
  return out;
}

// A hand-made checkpoint folder: one rank's files, and the manifest when complete.
void make_folder(const ScratchDir& dir, int64_t step, bool complete) {
  const fs::path p = dir.path / ("step-" + std::to_string(step));
  fs::create_directories(p);
  write_bytes((p / "rank-0.json").string(), "{\"step\": " + std::to_string(step) + "}\n");
  if (complete) write_bytes((p / "manifest.json").string(), "{}\n");
}

}  // namespace

TEST_CASE("the newest complete checkpoint is resumed; --keep-last removes the rest, never latest's", "[checkpoint]") {
  ScratchDir dir("ckpt_folders");
  SECTION("nothing to resume: the error names the directory and why") {
    CHECK_THROWS_WITH(ftexec::checkpoint_choose(dir / "absent"), Contains("no complete checkpoint") && Contains("does not exist"));
    make_folder(dir, 2, false);
    CHECK_THROWS_WITH(ftexec::checkpoint_choose(dir.path.string()), Contains("step-2 is incomplete"));
  }
  SECTION("an incomplete newest folder is skipped, and the choice says so") {
    make_folder(dir, 2, true), make_folder(dir, 10, true), make_folder(dir, 12, false);
    const auto c = ftexec::checkpoint_choose(dir.path.string());
    CHECK(c.folder.step == 10);  // by step, not by name ("step-10" < "step-2")
    CHECK_THAT(c.note, Contains("step-12 is incomplete") && Contains("resuming from " + dir / "step-10"));
    make_folder(dir, 12, true);
    CHECK(ftexec::checkpoint_choose(dir.path.string()).note.empty());
  }
  SECTION("keep 2: older complete ones and incomplete ones older than the newest complete go") {
    make_folder(dir, 0, false);
    for (int s = 1; s <= 5; ++s) make_folder(dir, s, true);
    make_folder(dir, 7, false);  // newer than every complete one: a checkpoint being written
    write_bytes(dir / "latest", "step-5\n");
    CHECK(ftexec::checkpoint_rotate(dir.path.string(), 2).size() == 4);
    CHECK(step_folders(dir.path.string()) == std::vector<std::string>{"step-4", "step-5", "step-7"});
  }
  SECTION("the folder latest names stays even beyond N") {
    for (int s = 1; s <= 3; ++s) make_folder(dir, s, true);
    write_bytes(dir / "latest", "step-1\n");
    ftexec::checkpoint_rotate(dir.path.string(), 1);
    CHECK(step_folders(dir.path.string()) == std::vector<std::string>{"step-1", "step-3"});
  }
  SECTION("a fresh run refuses a directory with another run's checkpoints; --resume needs one") {
    CHECK_THROWS_WITH(ftexec::checkpoint_preflight(dir / "new", true), Contains("--resume: no complete checkpoint"));
    CHECK_NOTHROW(ftexec::checkpoint_preflight(dir / "new", false));
    make_folder(dir, 3, false);
    CHECK_NOTHROW(ftexec::checkpoint_preflight(dir.path.string(), false));  // incomplete only: nothing to lose
    make_folder(dir, 4, true);
    CHECK_THROWS_WITH(ftexec::checkpoint_preflight(dir.path.string(), false), Contains("already holds") && Contains("--resume"));
  }
}

TEST_CASE("a manifest names each differing field, and each file whose size or CRC-32 differs", "[checkpoint]") {
  ScratchDir dir("ckpt_manifest");
  CHECK(ftexec::crc32_hex(std::string("123456789")) == "cbf43926");  // CRC-32's check value (zlib, PNG, gzip)
  const std::string shard = std::string(1000, 'x') + "weights";
  write_bytes(dir / "rank-0.safetensors", shard);
  const nlohmann::json layout = {{"strategy", "zero3"}, {"method", "full"}, {"micro_batch", 2}};
  const auto manifest = ftexec::checkpoint_manifest(4, 2, "tiny-test", layout,
                                                    {{"rank-0.safetensors", ftexec::file_digest(dir / "rank-0.safetensors")}});
  CHECK(manifest["files"]["rank-0.safetensors"]["bytes"] == 1007);
  CHECK(ftexec::checkpoint_layout_differences(manifest, 4, 2, layout).empty());
  CHECK(ftexec::checkpoint_file_problem(manifest, dir.path.string(), "rank-0.safetensors").empty());

  nlohmann::json other = layout;
  other["strategy"] = "ddp";
  other.erase("micro_batch");
  const auto d = ftexec::checkpoint_layout_differences(manifest, 6, 4, other);
  REQUIRE(d.size() == 4);
  CHECK(d[0] == "step: manifest 4, folder step-6");
  CHECK(d[1] == "world_size: checkpoint 2, this run 4");
  CHECK(d[2] == "strategy: checkpoint \"zero3\", this run \"ddp\"");
  CHECK(d[3] == "micro_batch: checkpoint 2, this run none");
  nlohmann::json old = manifest;
  old["format"] = "ftexec-checkpoint/1";
  CHECK_THAT(ftexec::checkpoint_layout_differences(old, 4, 2, layout).at(0), Contains("format") && Contains("no checksums"));

  std::string flipped = shard;
  flipped[500] ^= 0x01;
  write_bytes(dir / "rank-0.safetensors", flipped);
  CHECK_THAT(ftexec::checkpoint_file_problem(manifest, dir.path.string(), "rank-0.safetensors"),
             Contains(dir / "rank-0.safetensors") && Contains("crc32") && Contains("!= manifest"));
  write_bytes(dir / "rank-0.safetensors", shard.substr(0, 900));
  CHECK_THAT(ftexec::checkpoint_file_problem(manifest, dir.path.string(), "rank-0.safetensors"),
             Contains("900 bytes != manifest 1007 (truncated"));
  fs::remove(dir / "rank-0.safetensors");
  CHECK_THAT(ftexec::checkpoint_file_problem(manifest, dir.path.string(), "rank-0.safetensors"), Contains("missing"));
  CHECK_THAT(ftexec::checkpoint_file_problem(manifest, dir.path.string(), "rank-1.safetensors"), Contains("not listed"));
}

namespace {

// The run every [dist][checkpoint] case below shares: ZeRO-3 on 2 ranks, 6 steps.
std::string job(const std::string& strategy = "zero3") {
  return ftexec_test::tiny_job(32, 2, 1, 6) + " --lr 3e-3 --strategy " + strategy + " --nproc 2 --timeout-s 30";
}
const std::string kJob = job();

struct SharedRuns {
  ScratchDir dir{"ckpt_shared"};
  std::vector<double> losses;  // the uninterrupted run
  std::string checkpoints;     // stopped before step 6: checkpoints of steps 1..5, the newest 2 kept
  std::string stopped_output;
};

const SharedRuns& shared_runs() {
  static SharedRuns r;
  if (r.losses.empty()) {
    const auto full = run_ftexec(kJob + " --out " + r.dir / "full.json");
    INFO(full.output);
    REQUIRE(full.exit_code == 0);
    r.checkpoints = r.dir / "ck";
    const auto stopped = run_ftexec(kJob + " --checkpoint-dir " + r.checkpoints +
                                    " --checkpoint-every 1 --keep-last 2 --fault-inject 0:6:kill");
    r.stopped_output = stopped.output;
    r.losses = ftplan::read_json_file(r.dir / "full.json")["loss"].get<std::vector<double>>();
  }
  return r;
}

// A copy of the shared checkpoints to damage, and the resume of it.
std::string copy_of_checkpoints(const ScratchDir& dir) {
  const std::string to = dir / "ck";
  fs::copy(shared_runs().checkpoints, to, fs::copy_options::recursive);
  return to;
}

ftexec_test::RunResult resume(const std::string& ck, const std::string& strategy = "zero3", const std::string& out = "") {
  return run_ftexec(job(strategy) + " --checkpoint-dir " + ck + " --resume" + (out.empty() ? "" : " --out " + out));
}

}  // namespace

TEST_CASE("--keep-last 2 leaves the newest two checkpoints, and resuming gives the identical loss", "[dist][checkpoint]") {
  const auto& runs = shared_runs();
  INFO(runs.stopped_output);
  REQUIRE(runs.losses.size() == 6);
  CHECK(step_folders(runs.checkpoints) == std::vector<std::string>{"step-4", "step-5"});
  CHECK(read_bytes(runs.checkpoints + "/latest") == "step-5\n");
  const auto manifest = ftplan::read_json_file(runs.checkpoints + "/step-5/manifest.json");
  CHECK(manifest["world_size"] == 2);
  CHECK(manifest["layout"]["strategy"] == "zero3");
  CHECK(manifest["files"].size() == 4);  // each rank's safetensors and state JSON
  CHECK(manifest["files"]["rank-1.safetensors"]["bytes"] == fs::file_size(runs.checkpoints + "/step-5/rank-1.safetensors"));

  ScratchDir dir("ckpt_keep");
  const auto r = resume(copy_of_checkpoints(dir), "zero3", dir / "resumed.json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto m = ftplan::read_json_file(dir / "resumed.json");
  CHECK(m["first_step"] == 5);
  REQUIRE(m["loss"].size() == 1);
  CHECK(m["loss"][0].get<double>() == runs.losses[5]);  // bit for bit
}

TEST_CASE("an incomplete newest checkpoint (no manifest) is skipped: resume from the one before, saying so", "[dist][checkpoint]") {
  const auto& runs = shared_runs();
  ScratchDir dir("ckpt_incomplete");
  const std::string ck = copy_of_checkpoints(dir);
  fs::remove(ck + "/step-5/manifest.json");
  const auto r = resume(ck, "zero3", dir / "resumed.json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("step-5 is incomplete") && Contains("resuming from " + ck + "/step-4"));
  const auto m = ftplan::read_json_file(dir / "resumed.json");
  CHECK(m["first_step"] == 4);
  REQUIRE(m["loss"].size() == 2);
  CHECK(m["loss"][0].get<double>() == runs.losses[4]);
  CHECK(m["loss"][1].get<double>() == runs.losses[5]);
}

TEST_CASE("a damaged or foreign checkpoint ends --resume on every rank with one line naming it (exit 2)", "[dist][checkpoint]") {
  ScratchDir dir("ckpt_damaged");
  const std::string ck = copy_of_checkpoints(dir);
  const std::string shard0 = ck + "/step-5/rank-0.safetensors", shard1 = ck + "/step-5/rank-1.safetensors";
  // (One GENERATE row per damage, not a SECTION each: the checks follow the damage.)
  const std::string damage = GENERATE(as<std::string>{}, "flipped byte", "swapped shards", "truncated shard",
                                      "world size", "strategy");
  std::string strategy = "zero3", names, what;
  if (damage == "flipped byte") {  // one bit of one byte in rank 1's shard
    std::string bytes = read_bytes(shard1);
    bytes[bytes.size() / 2] ^= 0x10;
    write_bytes(shard1, bytes);
    names = shard1, what = "crc32";
  } else if (damage == "swapped shards") {  // rank 0's and rank 1's ZeRO-3 shards
    fs::rename(shard0, ck + "/tmp"), fs::rename(shard1, shard0), fs::rename(ck + "/tmp", shard1);
    names = shard0, what = "(it is the manifest's rank-1.safetensors: files swapped";  // the lowest failing rank's
  } else if (damage == "truncated shard") {
    const std::string bytes = read_bytes(shard0);
    write_bytes(shard0, bytes.substr(0, bytes.size() - 100));
    names = shard0, what = "bytes != manifest";
  } else if (damage == "world size") {  // a manifest from another world size
    auto m = ftplan::read_json_file(ck + "/step-5/manifest.json");
    m["world_size"] = 4;
    write_bytes(ck + "/step-5/manifest.json", m.dump(1));
    names = "manifest.json", what = "world_size: checkpoint 4, this run 2";
  } else {  // resumed with another strategy
    strategy = "fsdp";
    names = "manifest.json", what = "strategy: checkpoint \"zero3\", this run \"fsdp\"";
  }
  CAPTURE(damage, names, what);
  const auto r = resume(ck, strategy);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.seconds < 20);  // every rank ends at once, none waits for the timeout (30 s)
  CHECK(lines_with(r.output, "ftexec: error:") == 1);
  CHECK(lines_with(r.output, names) == 1);
  CHECK_THAT(r.output, Contains("ftexec: error: --resume: ") && Contains(what));
}

TEST_CASE("checkpoint flags are checked before any rank starts", "[dist][checkpoint]") {
  ScratchDir dir("ckpt_flags");
  for (const char* n : {"0", "-1"}) {
    const auto r = run_ftexec(kJob + " --checkpoint-dir " + dir / "ck" + " --keep-last " + n);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains(std::string("--keep-last: ") + n + " is out of range [1,"));
  }
  const auto no_dir = run_ftexec(kJob + " --keep-last 2");
  CHECK(no_dir.exit_code == 2);
  CHECK_THAT(no_dir.output, Contains("--keep-last needs --checkpoint-dir"));
  // A fresh run into a directory holding another run's checkpoints would mix them (and --keep-last
  // would remove that run's weights).
  const auto fresh = run_ftexec(kJob + " --checkpoint-dir " + copy_of_checkpoints(dir));
  INFO(fresh.output);
  CHECK(fresh.exit_code == 2);
  CHECK_THAT(fresh.output, Contains("already holds the checkpoints of a run") && Contains("add --resume"));
  CHECK(lines_with(fresh.output, "ftexec: error:") == 1);
}
