#include "fusetune/metrics/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "fusetune/util/clock.h"
#include "fusetune/util/crc32c.h"
#include "fusetune/util/error.h"

namespace fusetune {
namespace {

// The protobuf wire format, for the handful of field kinds an Event uses.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}
void key(std::string& out, int field, int wire_type) {
  varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}
template <class T>
void little_endian(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 is little endian, as the wire format
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);  // wall_time: double (fixed64)
  little_endian(e, wall_time);
  if (step != 0) {
    key(e, 2, 0);  // step: int64 (varint)
    varint(e, uint64_t(step));
  }
  return e;
}

}  // namespace

std::string tensorboard_scalars_event(double wall_time, int64_t step,
                                      const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    bytes_field(v, 1, tag);  // tag
    key(v, 2, 5);            // simple_value: float (fixed32)
    little_endian(v, float(value));
    bytes_field(summary, 1, v);  // Summary.value
  }
  std::string e = event_header(wall_time, step);
  bytes_field(e, 5, summary);  // Event.summary
  return e;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  little_endian(r, uint64_t(data.size()));
  const uint32_t len_crc = masked_crc32c(r.data(), 8);
  little_endian(r, len_crc);
  r += data;
  little_endian(r, masked_crc32c(data.data(), data.size()));
  return r;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double now = unix_now_s();
  path_ = dir / ("events.out.tfevents." + std::to_string(int64_t(now)) + "." + host);
  errno = 0;
  file_.reset(std::fopen(path_.c_str(), "ab"));
  if (!file_)
    throw Error("cannot open TensorBoard event file '" + path_.string() +
                "': " + std::strerror(errno) + " (check that the log directory is writable)");
  std::string version = event_header(now, 0);
  bytes_field(version, 3, "brain.Event:2");  // file_version
  append(tfrecord(version));
}

void TensorBoardWriter::write(int64_t step,
                              const std::vector<std::pair<std::string, double>>& scalars) {
  append(tfrecord(tensorboard_scalars_event(unix_now_s(), step, scalars)));
}

void TensorBoardWriter::append(const std::string& record) {
  if (!file_) return;
  errno = 0;
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size() ||
      std::fflush(file_.get()) != 0) {
    const std::string reason = errno ? std::strerror(errno) : "write failed";
    file_.reset();  // report once
    throw Error("cannot write to TensorBoard event file '" + path_.string() + "': " + reason);
  }
}

}  // namespace fusetune
