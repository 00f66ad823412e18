#pragma once
// TensorBoard event files (metric_logger: tensorboard): `events.out.tfevents.<unix>.<host>` in
// the log directory, a TFRecord stream of `Event` protocol buffers, as TensorFlow writes them:
//   record = uint64 length (little endian), uint32 masked CRC-32C of those 8 bytes,
//            the bytes, uint32 masked CRC-32C of the bytes
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// (tensorflow/core/util/event.proto, tensorflow/core/framework/summary.proto). The first
// event carries file_version "brain.Event:2"; then one event per logged step with a scalar
// value per metric. The few fields are written by hand in the protobuf wire format.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fusetune {

// The serialized Event of one step's scalars.
std::string tensorboard_scalars_event(double wall_time, int64_t step,
                                      const std::vector<std::pair<std::string, double>>& scalars);
// One TFRecord around `data`.
std::string tfrecord(const std::string& data);

class TensorBoardWriter {
 public:
  // Creates the event file in `dir` (which must exist) and writes its version event; throws
  // fusetune::Error naming the path when it cannot.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  // Appends one step's scalars and flushes (TensorBoard reads the file while it grows).
  void write(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  void append(const std::string& record);
  std::filesystem::path path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

}  // namespace fusetune
