// util/fs: whole-file reads, atomic file writes, atomic directory publication.
#include "files.h"
#include "fusetune/util/fs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fusetune/util/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::sorted_entries;
using fusetune::testing::TempDir;

namespace fusetune {
namespace {

TEST(IoFs, ReadFileReturnsBytesAndNamesMissingPath) {
  TempDir tmp;
  write_file_atomic(tmp / "a.bin", std::string("x\0y", 3));
  EXPECT_EQ(read_file(tmp / "a.bin"), std::string("x\0y", 3));
  try {
    read_file(tmp / "nope.txt");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.txt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_file(tmp.path()), Error);  // a directory
}

TEST(IoFs, WriteFileAtomicReplacesAndLeavesNoTemp) {
  TempDir tmp;
  write_file_atomic(tmp / "f.txt", "old");
  write_file_atomic(tmp / "f.txt", "new contents");
  EXPECT_EQ(read_file(tmp / "f.txt"), "new contents");
  EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"f.txt"});
}

TEST(IoFs, WriteFileAtomicFailureKeepsTargetAndRemovesTemp) {
  TempDir tmp;
  // The target is a non-empty directory: the final rename must fail.
  fs::create_directories(tmp / "target" / "inner");
  write_file_atomic(tmp / "target" / "inner" / "keep.txt", "keep");
  EXPECT_THROW(write_file_atomic(tmp / "target", "data"), Error);
  EXPECT_EQ(read_file(tmp / "target" / "inner" / "keep.txt"), "keep");
  EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"target"});
  // A missing parent directory fails cleanly too.
  EXPECT_THROW(write_file_atomic(tmp / "no" / "such" / "f.txt", "x"), Error);
}

TEST(IoFs, AtomicDirectoryPublishesOnCommitOnly) {
  TempDir tmp;
  const fs::path final_dir = tmp / "ckpt";
  {
    AtomicDirectory d(final_dir);
    write_file_atomic(d.path() / "a.txt", "A1");
    EXPECT_FALSE(fs::exists(final_dir));  // nothing under the final name before commit
    EXPECT_NE(d.path().filename().string().find("ckpt.tmp-"), std::string::npos);
    d.commit();
  }
  EXPECT_EQ(read_file(final_dir / "a.txt"), "A1");
  EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"ckpt"});

  // Replace: the old contents are gone entirely, not merged.
  {
    AtomicDirectory d(final_dir);
    write_file_atomic(d.path() / "b.txt", "B2");
    EXPECT_EQ(read_file(final_dir / "a.txt"), "A1");  // old still complete until commit
    d.commit();
  }
  EXPECT_EQ(sorted_entries(final_dir), std::vector<std::string>{"b.txt"});
  EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"ckpt"});
}

TEST(IoFs, AtomicDirectoryFallbackWithoutRenameExchange) {
  TempDir tmp;
  detail::set_rename_exchange_enabled(false);
  const fs::path final_dir = tmp / "ckpt";
  for (const char* v : {"one", "two", "three"}) {
    AtomicDirectory d(final_dir);
    write_file_atomic(d.path() / (std::string(v) + ".txt"), v);
    d.commit();
    EXPECT_EQ(sorted_entries(final_dir), std::vector<std::string>{std::string(v) + ".txt"});
    EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"ckpt"});  // old removed
  }
  detail::set_rename_exchange_enabled(true);
}

TEST(IoFs, AtomicDirectoryWithoutCommitRemovesTempAndKeepsOld) {
  TempDir tmp;
  const fs::path final_dir = tmp / "out" / "ckpt";  // parent created on demand
  {
    AtomicDirectory d(final_dir);
    write_file_atomic(d.path() / "a.txt", "old");
    d.commit();
  }
  try {
    AtomicDirectory d(final_dir);
    write_file_atomic(d.path() / "a.txt", "half-written");
    throw Error("simulated failure mid-save");
  } catch (const Error&) {
  }
  EXPECT_EQ(read_file(final_dir / "a.txt"), "old");
  EXPECT_EQ(sorted_entries(tmp / "out"), std::vector<std::string>{"ckpt"});
}

TEST(IoFs, AtomicDirectoryCrashBeforeCommitLeavesNoFinalDirectory) {
  TempDir tmp;
  const fs::path final_dir = tmp / "ckpt";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child "crashes" mid-save: no destructor, no commit.
    auto* d = new AtomicDirectory(final_dir);
    FileWriter w(d->path() / "model.safetensors");
    w.write("partial");
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(fs::exists(final_dir));
  auto left = sorted_entries(tmp.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].rfind("ckpt.tmp-", 0), 0u) << left[0];  // only an obviously partial dir
}

// A pid that belonged to a process that has exited (and been reaped).
pid_t dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

TEST(IoFs, NextSaveRemovesStagingOfKilledProcessesOnly) {
  TempDir tmp;
  const std::string dead = std::to_string(dead_pid()), self = std::to_string(::getpid());
  for (const std::string& name : std::vector<std::string>{
           "ckpt.tmp-" + dead + "-0", "ckpt.tmp-" + self + "-99", "ckpt.old-" + dead + "-1",
           "other.tmp-" + dead + "-0", "ckpt.tmp-notapid"}) {
    fs::create_directories(tmp / name);
    write_file_atomic(tmp / name / "model.safetensors", "partial");
  }
  write_file_atomic(tmp / ("state.json.tmp-" + dead + "-3"), "partial");
  {
    AtomicDirectory d(tmp / "ckpt");
    write_file_atomic(d.path() / "model.safetensors", "complete");
    d.commit();
  }
  write_file_atomic(tmp / "state.json", "{}");
  // Gone: the killed process's staging of ckpt and of state.json. Kept: a live process's
  // staging (this one), the .old- copy (it may be the only copy), other names.
  EXPECT_EQ(
      sorted_entries(tmp.path()),
      (std::vector<std::string>{"ckpt", "ckpt.old-" + dead + "-1", "ckpt.tmp-" + self + "-99",
                                "ckpt.tmp-notapid", "other.tmp-" + dead + "-0", "state.json"}));
}

TEST(IoFs, AtomicDirectoryTrailingSlashAndBadNames) {
  TempDir tmp;
  {
    AtomicDirectory d((tmp / "ckpt").string() + "/");
    d.commit();
  }
  EXPECT_TRUE(fs::is_directory(tmp / "ckpt"));
  EXPECT_EQ(sorted_entries(tmp.path()), std::vector<std::string>{"ckpt"});
  EXPECT_THROW(AtomicDirectory(fs::path("/")), Error);
  EXPECT_THROW(AtomicDirectory(fs::path("")), Error);
}

TEST(IoFs, FileWriterRefusesExistingFile) {
  TempDir tmp;
  write_file_atomic(tmp / "f", "x");
  EXPECT_THROW(FileWriter(tmp / "f"), Error);
  EXPECT_EQ(read_file(tmp / "f"), "x");
}

}  // namespace
}  // namespace fusetune
