// Checkpoint manifests, their verification on --resume, and --keep-last ([checkpoint]): checkpoint
// folders built by hand (no ranks).
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

