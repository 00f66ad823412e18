// A source check on the documentation: a comment that cites a section of docs/design.md (the
// section sign and its number) must lead a reader to a section that exists, and a relative link
// in a Markdown page to a file that exists. The design's sections are numbered once (headings
// "## <sign>N Title", N = 1, 2, ... in order) and keep their numbers; this test fails when a
// reference or a link goes stale. (This file spells the sign as an escape: it cites nothing.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace fs = std::filesystem;

namespace {

// The section sign.
const std::string kSection = "\u00a7";

fs::path root() { return fs::path(::fusetune::testing::source_dir()); }

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The text files of the folders the project writes references in (and README.md).
std::vector<fs::path> project_text_files() {
  const std::set<std::string> exts = {".h", ".cpp", ".md", ".sh", ".yaml", ".txt", ".cmake", ".py"};
  std::vector<fs::path> files = {root() / "README.md"};
  for (const char* dir : {"src", "tests", "scripts", "docs", "bench", "configs", ".ci"}) {
    if (!fs::is_directory(root() / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root() / dir)) {
      if (!e.is_regular_file()) continue;
      const fs::path& p = e.path();
      if (exts.count(p.extension().string()) || p.parent_path().filename() == ".ci")
        files.push_back(p);
    }
  }
  return files;
}

// The section numbers of docs/design.md's "## <sign>N Title" headings, in order.
std::vector<int> design_sections() {
  const std::regex heading("^## " + kSection + "([0-9]+) ");
  std::vector<int> numbers;
  std::ifstream in(root() / "docs/design.md");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, heading)) numbers.push_back(std::stoi(m[1]));
  }
  return numbers;
}

// Every section reference in `text` (the sign, optional spaces, a number), with its line.
std::vector<std::pair<int, int>> section_references(const std::string& text) {
  const std::regex ref(kSection + "\\s*([0-9]+)");
  std::vector<std::pair<int, int>> found;  // (line, section)
  int line = 1;
  size_t counted = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), ref); it != std::sregex_iterator();
       ++it) {
    const size_t at = size_t(it->position(0));
    for (; counted < at; ++counted)
      if (text[counted] == '\n') ++line;
    found.push_back({line, std::stoi((*it)[1])});
  }
  return found;
}

}  // namespace

TEST(DocsReferences, DesignSectionsAreNumberedInOrder) {
  const std::vector<int> numbers = design_sections();
  ASSERT_FALSE(numbers.empty()) << "docs/design.md has no `## " << kSection << "N Title` heading";
  for (size_t i = 0; i < numbers.size(); ++i)
    EXPECT_EQ(numbers[i], int(i) + 1)
        << "docs/design.md: heading " << i + 1 << " is " << kSection << numbers[i];
}

TEST(DocsReferences, EverySectionReferenceResolves) {
  const std::vector<int> numbers = design_sections();
  const std::set<int> sections(numbers.begin(), numbers.end());
  ASSERT_FALSE(sections.empty());
  const std::string outside = std::string("DESIGN") + ".md";  // the design outside the checkout
  int references = 0;
  for (const fs::path& file : project_text_files()) {
    const std::string text = read_all(file);
    const std::string where = fs::relative(file, root()).string();
    for (const auto& [line, n] : section_references(text)) {
      ++references;
      EXPECT_TRUE(sections.count(n))
          << where << ":" << line << ": " << kSection << n << " is not a section of docs/design.md";
    }
    EXPECT_EQ(text.find(outside), std::string::npos)
        << where << " cites " << outside << ", which is not in the repository: cite "
        << "docs/design.md " << kSection << "N";
  }
  EXPECT_GT(references, 10) << "few " << kSection << " references found: is the pattern right?";
}

// [text](target) in README.md and docs/*.md: a relative target (anchor dropped) names a file or
// folder of the checkout.
TEST(DocsReferences, RelativeLinksInMarkdownResolve) {
  const std::regex link(R"(\]\(([^)\s]+)\))");
  int links = 0;
  for (const fs::path& file : project_text_files()) {
    if (file.extension() != ".md") continue;
    const std::string text = read_all(file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), link);
         it != std::sregex_iterator(); ++it) {
      std::string target = (*it)[1];
      if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) continue;
      target = target.substr(0, target.find('#'));
      if (target.empty()) continue;  // an anchor in the same page
      ++links;
      EXPECT_TRUE(fs::exists(file.parent_path() / target))
          << fs::relative(file, root()).string() << " links to " << target
          << ", which does not exist";
    }
  }
  EXPECT_GT(links, 5) << "few relative links found in the Markdown pages: is the pattern right?";
}
