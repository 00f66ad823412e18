#pragma once
// File helpers for checkpoints: whole-file reads with clear errors, and crash-safe writes.
// A save either publishes a complete file/directory under its final name or leaves the
// previous one untouched: partial output only ever lives under a `.tmp-` name.
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace fusetune {

// The whole file as bytes. Throws fusetune::Error naming the path when it cannot be read.
std::string read_file(const std::filesystem::path& path);

// The whole file as bytes, for inputs a user names in a config: the error says which input it
// is ("<what> not found or not readable at <path>").
std::string read_input_file(const std::filesystem::path& path, std::string_view what);

// Writes `bytes` to a temp file beside `path`, fsyncs it, renames it over `path` and fsyncs
// the directory. On failure the temp file is removed and an existing `path` is left intact.
// Temp files that a killed process left beside `path` are removed first.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

// fsync() on a directory, so a rename inside it survives a crash.
void fsync_directory(const std::filesystem::path& dir);

// A file being written: unbuffered writes, then close() fsyncs. The destructor closes without
// syncing (for error paths); callers that care call close() and get its errors.
class FileWriter {
 public:
  // Creates `path` (which must not exist) for writing.
  explicit FileWriter(const std::filesystem::path& path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  size_t bytes_written() const { return written_; }
  void close();  // fsync + close; throws on failure

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  size_t written_ = 0;
};

// Publishes a whole directory atomically. Files go into `<final>.tmp-<pid>-<n>` (path());
// commit() fsyncs it and swaps it in as `<final>`, replacing an existing `<final>` (atomic
// exchange where the filesystem supports it, else: old aside, new in, old removed). Without
// commit() the destructor removes the temp directory. At no point does a `<final>` exist
// that holds a partial save. Staging directories of `<final>` left by a killed process (its pid
// no longer exists) are removed when the next save of `<final>` starts; `.old-` copies are kept.
class AtomicDirectory {
 public:
  explicit AtomicDirectory(std::filesystem::path final_dir);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  const std::filesystem::path& path() const { return tmp_; }  // write files here
  const std::filesystem::path& final_path() const { return final_; }
  void commit();

 private:
  std::filesystem::path final_;
  std::filesystem::path tmp_;
  bool committed_ = false;
};

namespace detail {
// Tests: force AtomicDirectory::commit onto its fallback path (no RENAME_EXCHANGE).
void set_rename_exchange_enabled(bool enabled);
}  // namespace detail

// A name for a temp sibling of `path`: `<path><tag>-<pid>-<n>`, unique within this process.
std::filesystem::path unique_sibling(const std::filesystem::path& path, std::string_view tag);

}  // namespace fusetune
