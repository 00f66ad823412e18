#include "fusetune/data/records.h"

#include <gtest/gtest.h>

#include "data_test_util.h"
#include "fusetune/util/error.h"
#include "test_support.h"

namespace fusetune {
namespace {

using testing::write_file;

TEST(DataRecords, JsonArrayRowsNameTheirIndex) {
  testing::TempDir dir;
  auto p = write_file(dir / "a.json", R"([{"x": 1}, {"x": 2}])");
  auto rows = read_json_records(p);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].value["x"], 2);
  EXPECT_EQ(rows[1].where, p + " element [1]");
}

TEST(DataRecords, JsonLinesSkipBlankLinesAndKeepLineNumbers) {
  testing::TempDir dir;
  auto p = write_file(dir / "a.jsonl", "{\"x\": 1}\n\n{\"x\": \n{\"x\": 3}\n");
  auto rows = read_json_records(p);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].where, p + " line 1");
  EXPECT_EQ(rows[1].where, p + " line 3");
  EXPECT_NE(rows[1].error.find("invalid JSON"), std::string::npos);
  EXPECT_EQ(rows[2].where, p + " line 4");
  EXPECT_TRUE(rows[2].error.empty());
}

// A number past double's range is valid JSON syntax that nlohmann's parser refuses with
// out_of_range (not parse_error): a bad row named by its line, or for an array an Error naming
// the file; never an exception that escapes (found by jsonl_rows_fuzz).
TEST(DataRecords, ANumberOutOfRangeIsABadRowOrAnErrorNamingTheFile) {
  testing::TempDir dir;
  auto p = write_file(dir / "a.jsonl", "{\"x\": 1}\n{\"x\": 5e555555}\n{\"x\": 3}\n");
  auto rows = read_json_records(p);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].where, p + " line 2");
  EXPECT_NE(rows[1].error.find("invalid JSON"), std::string::npos) << rows[1].error;
  EXPECT_TRUE(rows[2].error.empty());
  auto a = write_file(dir / "a.json", "[{\"x\": 1}, {\"x\": -5e555555}]");
  try {
    read_json_records(a);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(a + ": invalid JSON"), std::string::npos) << e.what();
  }
}

TEST(DataRecords, BrokenJsonArrayNamesLine) {
  testing::TempDir dir;
  auto p = write_file(dir / "a.json", "[\n{\"x\": 1},\n{\"x\": }\n]");
  try {
    read_json_records(p);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(p), std::string::npos) << m;
    EXPECT_NE(m.find("line 3"), std::string::npos) << m;
  }
}

TEST(DataRecords, PrettyPrintedObjectGetsAClearMessage) {
  testing::TempDir dir;
  auto p = write_file(dir / "a.json", "{\n  \"data\": []\n}\n");
  try {
    read_json_records(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("single JSON value"), std::string::npos) << e.what();
  }
}

TEST(DataRecords, MissingFileNamesPath) {
  try {
    read_json_records("/nonexistent/dir/x.jsonl");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.jsonl"), std::string::npos);
  }
}

TEST(DataRecords, TextSplitsAtEndOfTextMarkers) {
  testing::TempDir dir;
  auto p = write_file(dir / "a.txt",
                      "First story.\n\nStill first.\n<|endoftext|>\nSecond<|endoftext|>\n\n"
                      "<|endoftext|>Third\n");
  auto docs = read_text_documents(p);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].value, "First story.\n\nStill first.");
  EXPECT_EQ(docs[1].value, "Second");
  EXPECT_EQ(docs[2].value, "Third");
  EXPECT_EQ(docs[0].where, p + " line 1");
  EXPECT_EQ(docs[1].where, p + " line 5");
  EXPECT_EQ(docs[2].where, p + " line 7");
}

TEST(DataRecords, TextWithoutMarkersSplitsAtBlankLines) {
  testing::TempDir dir;
  auto p = write_file(dir / "a.txt", "\n\nOne\nline two\n  \t\nTwo\n\n\n\nThree");
  auto docs = read_text_documents(p);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].value, "One\nline two");
  EXPECT_EQ(docs[0].where, p + " line 3");
  EXPECT_EQ(docs[1].value, "Two");
  EXPECT_EQ(docs[1].where, p + " line 6");
  EXPECT_EQ(docs[2].value, "Three");
  EXPECT_EQ(docs[2].where, p + " line 10");
}

}  // namespace
}  // namespace fusetune
