#include "server/dashboard/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace laissez::server::dashboard {
namespace {

namespace fs = std::filesystem;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lz-report-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                        "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

TEST_F(ReportTest, RendersTextFiguresAndTables) {
  Write("report.md", "# Results\n\nUtilization is **high** <script>x</script>.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n");
  Write("prices.csv", "time,price\n1,\"2,5\"\n");
  Write("fig1.svg", "<svg xmlns=\"http://www.w3.org/2000/svg\"/>");
  auto html = RenderReport(dir_.string());
  ASSERT_TRUE(html.ok()) << html.status().message();
  EXPECT_NE(html->find("<h2>Results</h2>"), std::string::npos);
  EXPECT_NE(html->find("<strong>high</strong>"), std::string::npos);
  EXPECT_EQ(html->find("<script>"), std::string::npos);  // Escaped, never live.
  EXPECT_NE(html->find("&lt;script&gt;"), std::string::npos);
  EXPECT_NE(html->find("<td>1</td><td>2</td>"), std::string::npos);
  EXPECT_NE(html->find("<summary>prices.csv</summary>"), std::string::npos);
  EXPECT_NE(html->find("<td>2,5</td>"), std::string::npos);  // A quoted comma stays in its cell.
  EXPECT_NE(html->find("data:image/svg+xml;base64,"), std::string::npos);
  EXPECT_NE(html->find("fig1.svg"), std::string::npos);
}

TEST_F(ReportTest, LongTablesAreCut) {
  std::string csv = "n\n";
  for (int i = 0; i < 250; ++i) csv += std::to_string(i) + "\n";
  Write("big.csv", csv);
  auto html = RenderReport(dir_.string());
  ASSERT_TRUE(html.ok());
  EXPECT_NE(html->find("<td>199</td>"), std::string::npos);
  EXPECT_EQ(html->find("<td>200</td>"), std::string::npos);
  EXPECT_NE(html->find("First 200 of 250 rows."), std::string::npos);
}

TEST_F(ReportTest, BadDirectories) {
  auto missing = RenderReport((dir_ / "nope").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("dir:"), std::string::npos);
  Write("notes.txt", "nothing to show");
  auto empty = RenderReport(dir_.string());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
}

TEST(MarkdownTest, CodeFencesAndLists) {
  std::string h = MarkdownToHtml("- one\n- `two`\n\n```\na < b\n```\n");
  EXPECT_NE(h.find("<ul>\n<li>one</li>\n<li><code>two</code></li>\n</ul>"), std::string::npos);
  EXPECT_NE(h.find("<pre><code>a &lt; b\n</code></pre>"), std::string::npos);
}

}  // namespace
}  // namespace laissez::server::dashboard
