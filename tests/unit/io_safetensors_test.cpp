// io/safetensors: round trips for every dtype, the on-disk layout, and every malformed input
// the reader must reject with a one-line error naming the file and tensor.
#include "fusetune/io/safetensors.h"

#include <cstring>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/util/error.h"
#include "fusetune/util/fs.h"
#include "test_support.h"

namespace fs = std::filesystem;
using fusetune::testing::TempDir;

namespace fusetune {
namespace {

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char(v >> (8 * i));
  return s;
}

// A safetensors file from a literal header and data section.
std::string raw_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

Tensor arange(Shape shape, DType dt) {
  Tensor f = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<double>()[i] = double(i) * 0.5 - 3;
  if (dt == DType::I32 || dt == DType::I64) {
    Tensor t = Tensor::empty(shape, dt);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (dt == DType::I32)
        t.data<int32_t>()[i] = int32_t(i * 7 - 5);
      else
        t.data<int64_t>()[i] = int64_t(i) * 3000000000LL;
    }
    return t;
  }
  return f.to(dt);
}

// Expects open() of a file with these bytes to fail with a message containing every needle.
void expect_open_error(const std::string& bytes, std::initializer_list<std::string> needles) {
  TempDir tmp;
  const fs::path p = tmp / "bad.safetensors";
  write_file_atomic(p, bytes);
  try {
    SafetensorsFile::open(p);
    ADD_FAILURE() << "expected an error for a file of " << bytes.size() << " bytes";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
  // The in-memory parser (the fuzz target's entry point) must agree.
  EXPECT_THROW(SafetensorsFile::from_memory(bytes.data(), bytes.size(), nullptr, "mem"), Error);
}

TEST(IoSafetensors, RoundTripEveryDtypeWithMetadata) {
  TempDir tmp;
  NamedTensors in;
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64})
    in.push_back({std::string("t_") + dtype_name(dt), arange({3, 5}, dt)});
  in.push_back({"scalar", arange({}, DType::F32)});
  in.push_back({"empty", Tensor::empty({0, 4}, DType::F32)});
  save_safetensors(tmp / "m.safetensors", in, {{"format", "pt"}, {"note", "x"}});

  auto f = SafetensorsFile::open(tmp / "m.safetensors");
  ASSERT_EQ(f.names().size(), in.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");
  for (size_t k = 0; k < in.size(); ++k) {
    const auto& [name, t] = in[k];
    EXPECT_EQ(f.names()[k], name);  // header order = given order
    ASSERT_TRUE(f.has(name));
    EXPECT_EQ(f.info(name).dtype, t.dtype());
    EXPECT_EQ(f.info(name).shape, t.shape());
    Tensor r = f.tensor(name);
    ASSERT_EQ(r.nbytes(), t.nbytes());
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(r.raw(), t.raw(), t.nbytes()), 0) << name;
    }
  }
  EXPECT_FALSE(f.has("nope"));
  EXPECT_THROW(f.info("nope"), Error);
}

TEST(IoSafetensors, LayoutMatchesHuggingFace) {
  TempDir tmp;
  save_safetensors(tmp / "m.safetensors",
                   {{"b", arange({3}, DType::F32)}, {"a", arange({2, 2}, DType::BF16)}},
                   {{"format", "pt"}});
  const std::string bytes = read_file(tmp / "m.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);  // data section 8-byte aligned
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.substr(header.rfind('}') + 1).find_first_not_of(' '), std::string::npos);
  auto j = nlohmann::ordered_json::parse(header);
  EXPECT_EQ(j.begin().key(), "__metadata__");
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::ordered_json::parse("[0, 12]"));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::ordered_json::parse("[12, 20]"));
  EXPECT_EQ(j["a"]["dtype"], "BF16");
  EXPECT_EQ(bytes.size(), 8 + n + 20);  // tensors packed back to back, nothing after
}

TEST(IoSafetensors, BorrowedTensorSharesMappingAndIsCopyOnWrite) {
  TempDir tmp;
  save_safetensors(tmp / "m.safetensors", {{"w", arange({4, 4}, DType::F32)}});
  const std::string before = read_file(tmp / "m.safetensors");
  Tensor t;
  {
    auto f = SafetensorsFile::open(tmp / "m.safetensors");
    t = f.tensor("w");
    Tensor t2 = f.tensor("w");
    EXPECT_EQ(t.raw(), t2.raw());  // no copy: both view the mapping
  }
  // The file object is gone; the tensor keeps the mapping alive.
  EXPECT_FLOAT_EQ(t.data<float>()[5], 5 * 0.5f - 3);
  t.data<float>()[5] = 42.0f;  // private mapping: allowed, and the file is untouched
  EXPECT_EQ(read_file(tmp / "m.safetensors"), before);
}

TEST(IoSafetensors, MisalignedDataIsCopiedNotBorrowed) {
  // A header of odd length (another writer's choice) leaves the F32 data unaligned.
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  float v[2] = {1.5f, -2.25f};
  std::string data(reinterpret_cast<char*>(v), 8);
  TempDir tmp;
  write_file_atomic(tmp / "m.safetensors", raw_file(header, data));
  auto f = SafetensorsFile::open(tmp / "m.safetensors");
  Tensor t = f.tensor("w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 4, 0u);
  EXPECT_EQ(t.data<float>()[0], 1.5f);
  EXPECT_EQ(t.data<float>()[1], -2.25f);
}

TEST(IoSafetensors, SaveIsAtomicAndRejectsBadInput) {
  TempDir tmp;
  save_safetensors(tmp / "m.safetensors", {{"w", arange({2}, DType::F32)}});
  const std::string before = read_file(tmp / "m.safetensors");
  EXPECT_THROW(save_safetensors(tmp / "m.safetensors", {{"w", Tensor()}}), Error);
  EXPECT_THROW(save_safetensors(tmp / "m.safetensors",
                                {{"w", arange({2}, DType::F32)}, {"w", arange({2}, DType::F32)}}),
               Error);
  EXPECT_THROW(save_safetensors(tmp / "m.safetensors", {{"__metadata__", arange({2}, DType::F32)}}),
               Error);
  EXPECT_EQ(read_file(tmp / "m.safetensors"), before);
  int n = 0;
  for (auto& e : fs::directory_iterator(tmp.path())) n += e.is_regular_file();
  EXPECT_EQ(n, 1);  // no temp files left behind
}

// --- malformed files ---

const std::string kGoodHeader = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
const std::string kGoodData(8, '\0');

TEST(IoSafetensors, GoodBaselineOpens) {
  TempDir tmp;
  write_file_atomic(tmp / "ok.safetensors", raw_file(kGoodHeader, kGoodData));
  EXPECT_NO_THROW(SafetensorsFile::open(tmp / "ok.safetensors"));
}

TEST(IoSafetensors, RejectsTruncatedFiles) {
  expect_open_error("", {"truncated"});
  expect_open_error("abc", {"truncated"});
  const std::string full = raw_file(kGoodHeader, kGoodData);
  // Cut inside the header: the length field now points past the end.
  expect_open_error(full.substr(0, 20), {"header length", "past the end"});
  // Cut inside the data: the tensor's offsets run past the end.
  expect_open_error(full.substr(0, full.size() - 3), {"tensor 'w'", "past the end"});
}

TEST(IoSafetensors, RejectsBadHeaderLength) {
  expect_open_error(le64(1000) + kGoodHeader, {"header length 1000", "past the end"});
  expect_open_error(le64(uint64_t(1) << 62) + kGoodHeader, {"implausible"});
  expect_open_error(le64(0), {"header"});
}

TEST(IoSafetensors, RejectsHeaderThatIsNotAJsonObject) {
  expect_open_error(raw_file("{\"w\": [1, 2", ""), {"not valid JSON"});
  expect_open_error(raw_file("[1, 2, 3]", ""), {"does not start with '{'"});
  expect_open_error(raw_file("{} garbage", ""), {"not valid JSON"});
  expect_open_error(raw_file(R"({"w": 5})", ""), {"tensor 'w'", "expected an object"});
}

TEST(IoSafetensors, RejectsBadEntries) {
  expect_open_error(raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", kGoodData),
                    {"tensor 'w'", "data_offsets"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", kGoodData),
      {"tensor 'w'", "dtype 'F8_E4M3' is not supported"});
  expect_open_error(raw_file(R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", kGoodData),
                    {"tensor 'w'", "dtype"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", kGoodData),
      {"tensor 'w'", "non-negative"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", kGoodData),
      {"tensor 'w'", "non-negative integer"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", kGoodData),
      {"tensor 'w'", "end before"});
  expect_open_error(raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", kGoodData),
                    {"tensor 'w'", "data_offsets"});
  expect_open_error(raw_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                             R"("data_offsets":[0,8]}})",
                             kGoodData),
                    {"tensor 'w'", "too large"});
  // Names with control characters are escaped: the message stays one line.
  expect_open_error(
      raw_file(R"({"a\nb":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", kGoodData),
      {"tensor 'a\\x0ab'", "dtype 'U8'"});
  expect_open_error(raw_file(R"({"__metadata__":{"format":1}})", ""), {"__metadata__", "format"});
  expect_open_error(raw_file(R"({"__metadata__":[1]})", ""), {"__metadata__"});
}

TEST(IoSafetensors, RejectsOffsetsPastEndWrongSizeOverlapAndGaps) {
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", std::string(16, '\0')),
      {"tensor 'w'", "span 16 bytes", "need 8"});
  expect_open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", kGoodData),
      {"tensor 'w'", "past the end"});
  expect_open_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                             std::string(12, '\0')),
                    {"tensor 'b'", "overlaps tensor 'a'"});
  expect_open_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                             std::string(12, '\0')),
                    {"gap", "tensor 'b'"});
  expect_open_error(raw_file(kGoodHeader, kGoodData + "xx"), {"trailing"});
}

}  // namespace
}  // namespace fusetune
