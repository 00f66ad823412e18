#include "fusetune/util/fs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "fusetune/util/error.h"

namespace fs = std::filesystem;

namespace fusetune {
namespace {

std::atomic<bool> g_rename_exchange{true};

std::string errno_str() { return std::strerror(errno); }

std::string quoted(const fs::path& p) { return "'" + p.string() + "'"; }

// Drops a trailing separator so "out/ckpt/" names the directory "ckpt".
fs::path strip_trailing_slash(fs::path p) {
  p = p.lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p;
}

}  // namespace

void detail::set_rename_exchange_enabled(bool enabled) { g_rename_exchange = enabled; }

fs::path unique_sibling(const fs::path& path, std::string_view tag) {
  static std::atomic<uint64_t> counter{0};
  fs::path p = strip_trailing_slash(path);
  std::string name = p.filename().string() + std::string(tag) + "-" + std::to_string(::getpid()) +
                     "-" + std::to_string(counter.fetch_add(1));
  return p.parent_path() / name;
}

// True when `name` is `<base>.tmp-<pid>-<n>` for a process other than this one that no longer
// exists: the staging left behind by a save that was killed. Such a leftover is always
// partial (it was never renamed), so it is safe to delete.
bool is_dead_process_temp(const std::string& name, const std::string& base) {
  const std::string prefix = base + ".tmp-";
  if (name.rfind(prefix, 0) != 0) return false;
  const std::string rest = name.substr(prefix.size());
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string::npos) return false;
  for (size_t i = 0; i < rest.size(); ++i)
    if (i != dash && (rest[i] < '0' || rest[i] > '9')) return false;
  const long pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
  if (pid <= 0 || pid == long(::getpid())) return false;
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

void remove_dead_temps(const fs::path& target) {
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string base = target.filename().string();
  std::error_code ec;
  std::vector<fs::path> dead;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec))
    if (is_dead_process_temp(it->path().filename().string(), base)) dead.push_back(it->path());
  for (const fs::path& p : dead) fs::remove_all(p, ec);  // best effort
}

std::string read_input_file(const fs::path& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in, std::string(what) + " not found or not readable at " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_file(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FT_CHECK(fd >= 0, "cannot open " + quoted(path) + ": " + errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::string why = S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file";
    ::close(fd);
    throw Error("cannot read " + quoted(path) + ": " + why);
  }
  std::string out;
  out.resize(size_t(st.st_size));
  size_t got = 0;
  while (true) {
    if (got == out.size()) out.resize(out.size() + 4096);  // the file may have grown
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string err = errno_str();
      ::close(fd);
      throw Error("cannot read " + quoted(path) + ": " + err);
    }
    if (n == 0) break;
    got += size_t(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

void fsync_directory(const fs::path& dir) {
  fs::path d = dir.empty() ? fs::path(".") : dir;
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  FT_CHECK(fd >= 0, "cannot open directory " + quoted(d) + " to sync it: " + errno_str());
  int rc = ::fsync(fd);
  std::string err = rc != 0 ? errno_str() : "";
  ::close(fd);
  // Some filesystems do not support fsync on directories; that is not a failed save.
  FT_CHECK(rc == 0 || err == std::strerror(EINVAL),
           "cannot sync directory " + quoted(d) + ": " + err);
}

// --- FileWriter ---

FileWriter::FileWriter(const fs::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  FT_CHECK(fd_ >= 0, "cannot create " + quoted(path) + ": " + errno_str());
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t bytes) {
  FT_CHECK(fd_ >= 0, "write to closed file " + quoted(path_));
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most ~2 GiB per call; chunk so large tensors go through in pieces.
    size_t chunk = bytes < (size_t(1) << 30) ? bytes : (size_t(1) << 30);
    ssize_t n = ::write(fd_, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    FT_CHECK(n > 0, "cannot write " + quoted(path_) + ": " + (n < 0 ? errno_str() : "no progress"));
    p += n;
    bytes -= size_t(n);
    written_ += size_t(n);
  }
}

void FileWriter::close() {
  if (fd_ < 0) return;
  int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    std::string err = errno_str();
    ::close(fd);
    throw Error("cannot sync " + quoted(path_) + ": " + err);
  }
  FT_CHECK(::close(fd) == 0, "cannot close " + quoted(path_) + ": " + errno_str());
}

// --- write_file_atomic ---

void write_file_atomic(const fs::path& path, std::string_view bytes) {
  fs::path target = strip_trailing_slash(path);
  remove_dead_temps(target);
  fs::path tmp = unique_sibling(target, ".tmp");
  try {
    FileWriter w(tmp);
    w.write(bytes);
    w.close();
    FT_CHECK(::rename(tmp.c_str(), target.c_str()) == 0,
             "cannot rename " + quoted(tmp) + " to " + quoted(target) + ": " + errno_str());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(target.parent_path());
}

// --- AtomicDirectory ---

AtomicDirectory::AtomicDirectory(fs::path final_dir) : final_(strip_trailing_slash(final_dir)) {
  FT_CHECK(final_.has_filename() && final_.filename() != "." && final_.filename() != "..",
           "invalid output directory " + quoted(final_dir));
  std::error_code ec;
  if (final_.has_parent_path()) fs::create_directories(final_.parent_path(), ec);
  FT_CHECK(!ec, "cannot create " + quoted(final_.parent_path()) + ": " + ec.message());
  remove_dead_temps(final_);
  tmp_ = unique_sibling(final_, ".tmp");
  FT_CHECK(::mkdir(tmp_.c_str(), 0755) == 0,
           "cannot create directory " + quoted(tmp_) + ": " + errno_str());
}

AtomicDirectory::~AtomicDirectory() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);  // best effort: a leftover .tmp- dir never looks complete
  }
}

void AtomicDirectory::commit() {
  FT_CHECK(!committed_, "AtomicDirectory " + quoted(final_) + " committed twice");
  fsync_directory(tmp_);
  const fs::path parent = final_.parent_path();
  std::error_code ec;
  const bool replacing = fs::symlink_status(final_, ec).type() != fs::file_type::not_found;
  if (!replacing) {
    FT_CHECK(::rename(tmp_.c_str(), final_.c_str()) == 0,
             "cannot rename " + quoted(tmp_) + " to " + quoted(final_) + ": " + errno_str());
    committed_ = true;
    fsync_directory(parent);
    return;
  }
  // Atomic swap: `<final>` is the old or the new directory at every instant.
  if (g_rename_exchange) {
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_.c_str(), RENAME_EXCHANGE) == 0) {
      committed_ = true;
      fsync_directory(parent);
      fs::remove_all(tmp_, ec);  // now holds the old directory
      return;
    }
    FT_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP,
             "cannot replace " + quoted(final_) + ": " + errno_str());
  }
  // No exchange on this filesystem: old aside, new in, old removed. A crash in between leaves
  // no `<final>` at all (the old one survives under `.old-`), never a partial one.
  const fs::path old = unique_sibling(final_, ".old");
  FT_CHECK(::rename(final_.c_str(), old.c_str()) == 0,
           "cannot move " + quoted(final_) + " aside: " + errno_str());
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
    std::string err = errno_str();
    ::rename(old.c_str(), final_.c_str());  // put the old one back
    throw Error("cannot rename " + quoted(tmp_) + " to " + quoted(final_) + ": " + err);
  }
  committed_ = true;
  fsync_directory(parent);
  fs::remove_all(old, ec);
}

}  // namespace fusetune
