#include <fcntl.h>
#include <pty.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fusetune/metrics/progress_bar.h"
#include "fusetune/metrics/step_logger.h"
#include "fusetune/util/error.h"
#include "test_support.h"

using namespace fusetune;
using fusetune::testing::TempDir;

namespace {

StepMetrics example_step() {
  StepMetrics m;
  m.step = 12;
  m.epoch = 1;
  m.loss = 1.97456;
  m.lr = 3.6e-05;
  m.tokens_per_second_per_gpu = 1044.7812;
  m.peak_memory_alloc_bytes = int64_t(0.41 * 1024 * 1024 * 1024);
  return m;
}

std::vector<std::string> read_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// Everything written to the pipe's write end so far (the write end is closed here).
std::string drain(int fds[2]) {
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  ::close(fds[0]);
  return out;
}

}  // namespace

TEST(MetricsStepLogger, StepLineIsTorchtunes) {
  StepMetrics m = example_step();
  EXPECT_EQ(format_step_line(m),
            "Step 12 | loss:1.9746 lr:3.6e-05 tokens_per_second_per_gpu:1044.78 "
            "peak_memory_alloc:0.41");
  m.grad_norm = 0.53124;
  m.extra.push_back({"compile_s", 1.234, 2});
  m.lr = 2e-05;
  EXPECT_EQ(format_step_line(m),
            "Step 12 | loss:1.9746 lr:2e-05 tokens_per_second_per_gpu:1044.78 "
            "peak_memory_alloc:0.41 grad_norm:0.5312 compile_s:1.23");
  m.peak_memory_alloc_bytes.reset();
  m.grad_norm.reset();
  m.extra.clear();
  m.lr = 0.0001;
  m.loss = std::nan("");
  EXPECT_EQ(format_step_line(m), "Step 12 | loss:nan lr:0.0001 tokens_per_second_per_gpu:1044.78");
}

// A schedule's learning rate reads as a person writes it (4 significant digits); metrics.jsonl
// keeps every digit.
TEST(MetricsStepLogger, StepLineRoundsTheLearningRate) {
  StepMetrics m = example_step();
  m.lr = 0.0024000000000000002;
  EXPECT_EQ(format_step_line(m),
            "Step 12 | loss:1.9746 lr:0.0024 tokens_per_second_per_gpu:1044.78 "
            "peak_memory_alloc:0.41");
  m.lr = 1.1827948028283354e-05;
  EXPECT_NE(format_step_line(m).find(" lr:1.183e-05 "), std::string::npos) << format_step_line(m);
  m.lr = 0;
  EXPECT_NE(format_step_line(m).find(" lr:0.0 "), std::string::npos) << format_step_line(m);
  m.lr = 0.0028144600200657953;
  const auto j = nlohmann::json::parse(format_metrics_json(m, 0, 0));
  EXPECT_EQ(j["lr"].get<double>(), 0.0028144600200657953);
}

TEST(MetricsStepLogger, HeaderBlock) {
  RunHeader h;
  h.recipe = "lora_finetune_single_device";
  h.model = "llama3_2_1b";
  h.params_total = 1235814400;
  h.params_trainable = 5636096;
  h.threads = 16;
  h.dtype = "fp32";
  h.compile_mode = "true";
  h.extra.push_back({"seed", "42"});
  const std::string s = format_run_header(h);
  EXPECT_NE(s.find("recipe:  lora_finetune_single_device\n"), std::string::npos) << s;
  EXPECT_NE(s.find("params:  1235814400 (1.24B), trainable 5636096 (5.64M, 0.46%)\n"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("threads: 16\n"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype:   fp32\n"), std::string::npos) << s;
  EXPECT_NE(s.find("compile: true\n"), std::string::npos) << s;
  EXPECT_NE(s.find("seed:    42\n"), std::string::npos) << s;
}

TEST(MetricsStepLogger, WritesStdoutLogFileAndJsonl) {
  TempDir dir;
  std::ostringstream out;
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  {
    StepLoggerOptions o;
    o.output_dir = dir.path() / "run";
    o.out = &out;
    o.total_steps = 30;
    o.progress_fd = fds[1];
    StepLogger log(o);
    EXPECT_FALSE(log.progress_enabled());  // a pipe is not a terminal
    EXPECT_EQ(log.log_path().parent_path(), dir.path() / "run" / "logs");
    EXPECT_EQ(log.log_path().filename().string().rfind("log_", 0), 0u);
    EXPECT_EQ(log.log_path().extension(), ".txt");
    RunHeader h;
    h.recipe = "full_finetune_single_device";
    log.header(h);
    StepMetrics m = example_step();
    log.progress(1, 12, m.loss);
    log.log(m);
    m.step = 13;
    m.grad_norm = 0.5;
    m.loss = std::nan("");
    m.extra.push_back({"compile_s", 1.5, 2});
    log.progress(1, 13, 1.5);
    log.log(m);
    log.message("saved checkpoint");
    log.close();

    const std::string expected_out = format_run_header(h) +
                                     "Step 12 | loss:1.9746 lr:3.6e-05 "
                                     "tokens_per_second_per_gpu:1044.78 peak_memory_alloc:0.41\n" +
                                     format_step_line(m) + "\nsaved checkpoint\n";
    EXPECT_EQ(out.str(), expected_out);
    std::ifstream in(log.log_path());
    std::stringstream file;
    file << in.rdbuf();
    EXPECT_EQ(file.str(), expected_out);

    const auto lines = read_lines(log.metrics_path());
    ASSERT_EQ(lines.size(), 2u);
    const auto j0 = nlohmann::json::parse(lines[0]);
    EXPECT_EQ(j0["step"], 12);
    EXPECT_EQ(j0["epoch"], 1);
    EXPECT_EQ(j0["loss"].get<double>(), 1.97456);
    EXPECT_EQ(j0["lr"].get<double>(), 3.6e-05);
    EXPECT_EQ(j0["tokens_per_second_per_gpu"].get<double>(), 1044.7812);
    EXPECT_EQ(j0["peak_memory_alloc_bytes"].get<int64_t>(), int64_t(0.41 * 1024 * 1024 * 1024));
    EXPECT_TRUE(j0["grad_norm"].is_null());
    EXPECT_GT(j0["time"].get<double>(), 1.6e9);
    EXPECT_GE(j0["elapsed_s"].get<double>(), 0.0);
    const auto j1 = nlohmann::json::parse(lines[1]);
    EXPECT_EQ(j1["step"], 13);
    EXPECT_TRUE(j1["loss"].is_null());  // nan has no JSON spelling
    EXPECT_EQ(j1["grad_norm"].get<double>(), 0.5);
    EXPECT_EQ(j1["compile_s"].get<double>(), 1.5);
  }
  EXPECT_EQ(drain(fds), "");  // no progress bar, no escape codes on a pipe
}

TEST(MetricsStepLogger, AppendsAcrossRunsToMetricsJsonl) {
  TempDir dir;
  std::ostringstream out;
  for (int run = 0; run < 2; ++run) {
    StepLoggerOptions o;
    o.output_dir = dir.path();
    o.out = &out;
    o.progress = ProgressBar::Mode::Never;
    StepLogger log(o);
    log.log(example_step());
  }
  EXPECT_EQ(read_lines(dir / "logs/metrics.jsonl").size(), 2u);  // a resumed run appends
}

TEST(MetricsStepLogger, NoFilesWithoutOutputDirAndQuietMode) {
  std::ostringstream out;
  StepLoggerOptions o;
  o.out = &out;
  o.print = false;
  StepLogger log(o);
  log.log(example_step());
  EXPECT_EQ(out.str(), "");
  EXPECT_TRUE(log.log_path().empty());
  EXPECT_TRUE(log.metrics_path().empty());
}

TEST(MetricsStepLogger, UnwritableOutputDirIsAClearError) {
  TempDir dir;
  const auto blocker = dir / "not_a_dir";
  std::ofstream(blocker) << "x";
  StepLoggerOptions o;
  o.output_dir = blocker;  // output_dir/logs cannot be created under a file
  try {
    StepLogger log(o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot create log directory '" + (blocker / "logs").string() + "'"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("output_dir is writable"), std::string::npos) << msg;
  }
  // A directory in the place of metrics.jsonl: the open fails and names the file.
  std::filesystem::create_directories(dir / "out/logs/metrics.jsonl");
  StepLoggerOptions o2;
  o2.output_dir = dir / "out";
  try {
    StepLogger log(o2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl' for appending"), std::string::npos)
        << e.what();
  }
}

TEST(MetricsProgressBar, Rendering) {
  EXPECT_EQ(format_progress_bar("1|12|Loss: 1.9746", 12, 30, 10.0),
            "1|12|Loss: 1.9746:  40%|████      | 12/30 [00:10<00:15,  1.20it/s]");
  EXPECT_EQ(format_progress_bar("d", 0, 30, 0.0), "d:   0%|          | 0/30 [00:00<?, ?it/s]");
  EXPECT_EQ(format_progress_bar("d", 30, 30, 3725.0),
            "d: 100%|██████████| 30/30 [1:02:05<00:00, 124.17s/it]");
  // Eighth blocks for partial cells: 0.45 * 10 cells = 4 full + 4/8 of the fifth.
  EXPECT_EQ(format_progress_bar("", 9, 20, 0.0), " 45%|████▌     | 9/20 [00:00<?, ?it/s]");
  EXPECT_EQ(format_progress_bar("d", 5, 0, 2.0), "d: 5it [00:02,  2.50it/s]");
}

TEST(MetricsProgressBar, DrawnOnlyWhenForcedOrATerminal) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  {
    ProgressBar auto_bar(10, fds[1], ProgressBar::Mode::Auto);
    EXPECT_FALSE(auto_bar.enabled());
    auto_bar.update(3, "x");
    auto_bar.close();
  }
  EXPECT_EQ(drain(fds), "");

  ASSERT_EQ(::pipe(fds), 0);
  {
    ProgressBar bar(10, fds[1], ProgressBar::Mode::Always);
    bar.update(3, "1|3|Loss: 2.0000");
    bar.clear();
    bar.redraw();
    bar.close();
    bar.close();  // idempotent
  }
  const std::string s = drain(fds);
  EXPECT_EQ(s.rfind("\r1|3|Loss: 2.0000:  30%|███       | 3/10 [", 0), 0u) << s;
  EXPECT_NE(s.find("\r\033[K\r1|3|Loss"), std::string::npos) << s;  // cleared, then redrawn
  EXPECT_EQ(s.back(), '\n');
}

// A pseudo-terminal of its own (openpty): no controlling terminal or stdin needed, so it runs
// in CI; a machine without /dev/ptmx fails it there (FUSETUNE_REQUIRE_ASSETS=1) rather than
// skipping. tests/unit/cli_progress_terminal_test.cpp runs `fusetune run` on one.
TEST(MetricsProgressBar, AutoModeDrawsOnATerminal) {
  int master = -1, slave = -1;
  if (::openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) {
    FT_SKIP_UNLESS_REQUIRED(std::string("no pseudo-terminal available: openpty: ") +
                            std::strerror(errno));
  }
  ASSERT_EQ(::isatty(slave), 1);
  std::ostringstream out;
  {
    StepLoggerOptions o;
    o.out = &out;
    o.total_steps = 4;
    o.progress_fd = slave;
    StepLogger log(o);
    EXPECT_TRUE(log.progress_enabled());
    log.progress(1, 1, 2.5);
    log.close();
  }
  ::close(slave);
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) s.append(buf, size_t(n));
  ::close(master);
  EXPECT_NE(s.find("1|1|Loss: 2.5000:  25%|"), std::string::npos) << s;
  EXPECT_EQ(out.str(), "");  // the bar never goes to the step-line stream
}
