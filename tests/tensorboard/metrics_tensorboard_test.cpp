// metric_logger: tensorboard writes real event files: TFRecord framing with masked CRC-32C
// (checked here by a bitwise CRC written from the definition) around Event protocol buffers,
// decoded by protobuf's own parser from descriptors with the field numbers of TensorFlow's
// event.proto and summary.proto, to exactly the values metrics.jsonl logged.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fusetune/metrics/tensorboard.h"
#include "fusetune/util/crc32c.h"
#include "fusetune/util/error.h"
#include "recipe_runs.h"
#include "test_support.h"

namespace fs = std::filesystem;
namespace pb = google::protobuf;
using namespace fusetune;
using namespace fusetune::testing;

namespace {

// CRC-32C bit by bit, from the definition (reflected polynomial 0x82F63B78).
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}
uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

// tensorflow.Event and tensorflow.Summary(.Value) with their official field numbers.
struct EventProto {
  pb::DescriptorPool pool;
  pb::DynamicMessageFactory factory;
  const pb::Descriptor* event = nullptr;
  EventProto() {
    pb::FileDescriptorProto f;
    f.set_name("tensorflow_event.proto");
    f.set_package("tensorflow");
    f.set_syntax("proto3");
    auto field = [](pb::DescriptorProto* m, const char* name, int number,
                    pb::FieldDescriptorProto::Type type, const char* type_name = nullptr,
                    bool repeated = false) {
      auto* x = m->add_field();
      x->set_name(name);
      x->set_number(number);
      x->set_type(type);
      x->set_label(repeated ? pb::FieldDescriptorProto::LABEL_REPEATED
                            : pb::FieldDescriptorProto::LABEL_OPTIONAL);
      if (type_name) x->set_type_name(type_name);
    };
    pb::DescriptorProto* summary = f.add_message_type();
    summary->set_name("Summary");
    pb::DescriptorProto* value = summary->add_nested_type();
    value->set_name("Value");
    field(value, "tag", 1, pb::FieldDescriptorProto::TYPE_STRING);
    field(value, "simple_value", 2, pb::FieldDescriptorProto::TYPE_FLOAT);
    field(summary, "value", 1, pb::FieldDescriptorProto::TYPE_MESSAGE, ".tensorflow.Summary.Value",
          true);
    pb::DescriptorProto* ev = f.add_message_type();
    ev->set_name("Event");
    field(ev, "wall_time", 1, pb::FieldDescriptorProto::TYPE_DOUBLE);
    field(ev, "step", 2, pb::FieldDescriptorProto::TYPE_INT64);
    field(ev, "file_version", 3, pb::FieldDescriptorProto::TYPE_STRING);
    field(ev, "summary", 5, pb::FieldDescriptorProto::TYPE_MESSAGE, ".tensorflow.Summary");
    EXPECT_NE(pool.BuildFile(f), nullptr);
    event = pool.FindMessageTypeByName("tensorflow.Event");
  }
};

struct Decoded {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> scalars;
};

// Splits a TFRecord stream, checking both CRCs of every record, and decodes each Event.
std::vector<Decoded> read_events(const std::string& bytes, EventProto& proto) {
  std::vector<Decoded> out;
  size_t at = 0;
  while (at < bytes.size()) {
    EXPECT_GE(bytes.size() - at, 12u);
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(len_crc, masked(crc32c_bitwise(bytes.substr(at, 8))));
    const std::string data = bytes.substr(at + 12, len);
    std::memcpy(&data_crc, bytes.data() + at + 12 + len, 4);
    EXPECT_EQ(data_crc, masked(crc32c_bitwise(data)));
    at += 12 + len + 4;

    std::unique_ptr<pb::Message> m(proto.factory.GetPrototype(proto.event)->New());
    EXPECT_TRUE(m->ParseFromString(data));
    const pb::Reflection* r = m->GetReflection();
    const pb::Descriptor* d = proto.event;
    Decoded e;
    e.wall_time = r->GetDouble(*m, d->FindFieldByName("wall_time"));
    e.step = r->GetInt64(*m, d->FindFieldByName("step"));
    e.file_version = r->GetString(*m, d->FindFieldByName("file_version"));
    const pb::FieldDescriptor* sf = d->FindFieldByName("summary");
    if (r->HasField(*m, sf)) {
      const pb::Message& s = r->GetMessage(*m, sf);
      const pb::FieldDescriptor* vf = s.GetDescriptor()->FindFieldByName("value");
      for (int i = 0; i < s.GetReflection()->FieldSize(s, vf); ++i) {
        const pb::Message& v = s.GetReflection()->GetRepeatedMessage(s, vf, i);
        const pb::Reflection* vr = v.GetReflection();
        e.scalars[vr->GetString(v, v.GetDescriptor()->FindFieldByName("tag"))] =
            vr->GetFloat(v, v.GetDescriptor()->FindFieldByName("simple_value"));
      }
    }
    out.push_back(e);
  }
  EXPECT_EQ(at, bytes.size());
  return out;
}

}  // namespace

TEST(TensorBoard, Crc32cMatchesTheDefinitionAndItsCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  std::string s;
  for (int i = 0; i < 300; ++i) {
    s.push_back(char(i * 37 + 11));
    EXPECT_EQ(crc32c(s.data(), s.size()), crc32c_bitwise(s)) << i;
    EXPECT_EQ(masked_crc32c(s.data(), s.size()), masked(crc32c_bitwise(s)));
  }
}

TEST(TensorBoard, RunWritesEventsThatProtobufDecodesToTheLoggedValues) {
  TempDir tmp;
  const fs::path logs = tmp / "tb_logs";
  CliRun run = run_shell(demo_command(tmp / "out", {{"metric_logger._component_", "tensorboard"},
                                                    {"metric_logger.log_dir", logs.string()},
                                                    {"clip_grad_norm", "1.0"}}),
                         tmp / "io");
  ASSERT_EQ(run.code, 0) << run.err;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(logs))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u) << "one event file in metric_logger.log_dir";
  EXPECT_TRUE(fs::exists(logs / "metrics.jsonl")) << "log_dir holds the other logs too";

  EventProto proto;
  const std::vector<Decoded> events = read_events(read_text(files[0]), proto);
  const std::vector<nlohmann::json> steps = metrics_file_lines(logs / "metrics.jsonl");
  ASSERT_EQ(events.size(), steps.size() + 1);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GT(events[0].wall_time, 1.7e9);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Decoded& e = events[i + 1];
    const nlohmann::json& j = steps[i];
    EXPECT_EQ(e.step, j.at("step").get<int64_t>());
    for (const char* tag : {"loss", "lr", "tokens_per_second_per_gpu", "grad_norm", "mfu"}) {
      ASSERT_TRUE(e.scalars.count(tag)) << tag;
      EXPECT_EQ(e.scalars.at(tag), float(j.at(tag).get<double>())) << tag << " step " << e.step;
    }
  }
}

TEST(TensorBoard, AnUnwritableLogDirIsAnErrorNamingIt) {
  TempDir tmp;
  EXPECT_THROW({ TensorBoardWriter w(tmp / "missing" / "dir"); }, Error);
}
