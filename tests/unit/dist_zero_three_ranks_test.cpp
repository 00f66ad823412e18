// ZeRO over 3 ranks (oversubscribed on small machines, 1 thread each), where the parameters
// cannot be shared out evenly (whole tensors, by element count: the ranks own different
// amounts): ZeRO-1, 2 and 3 (and ZeRO-1 with overlap_grad_allreduce) give bitwise ZeRO-0's
// losses and checkpoints (weights and the optimizer state gathered to rank 0), though each sums
// the gradients in differently packed messages (over 2 ranks any order gives the same bits, over
// 3 only the communicator's rank-ordered sum does), 3 ranks x 2 rows follow one process x 6
// rows within 1e-5, and a 3-rank checkpoint resumes on 2 ranks x 3 rows, continuing the same
// curve.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "fusetune/distributed/sharded_optimizer.h"
#include "fusetune/io/safetensors.h"
#include "resume_runs.h"

using namespace fusetune::testing;
namespace fs = std::filesystem;

namespace {

const std::string kOversubscribe = "--oversubscribe";

// 6 steps of the demo model on the uneven corpus, `batch` rows per rank, a checkpoint at step 3.
Overrides three_rank_run(const fs::path& out, const fs::path& corpus, int batch,
                         const Overrides& extra = {}) {
  return rank_run_overrides(out, corpus, batch, 6, with_keys({{"save_every_n_steps", "3"}}, extra));
}

}  // namespace

TEST(DistZeroThreeRanks, UnevenShardsMatchZero0BitwiseOneProcessAndResumeOnTwoRanks) {
  FT_REQUIRE_MPIRUN();
  const auto t0 = std::chrono::steady_clock::now();
  const TempDir tmp;
  const fs::path corpus = write_uneven_corpus(tmp.path());
  const std::string config = "demo/tiny_full";
  // One process x 6 rows.
  const fs::path ref = tmp / "ref";
  run_ok(run_command("full_finetune_single_device", config, three_rank_run(ref, corpus, 6)),
         tmp / "io_ref");
  const std::vector<double> want = losses_of(logged_steps(ref));
  ASSERT_EQ(want.size(), 6u);

  // The partition of the trainable parameters (all, in name order) over 3 ranks is uneven.
  {
    const auto st = fusetune::SafetensorsFile::open(ref / "epoch_0" / "model.safetensors");
    std::vector<std::string> names = st.names();
    std::sort(names.begin(), names.end());
    std::vector<int64_t> numels;
    for (const std::string& n : names) numels.push_back(st.tensor(n).numel());
    const std::vector<int> owner = fusetune::dist::partition_by_elements(numels, 3);
    std::vector<int64_t> owned(3, 0);
    for (size_t i = 0; i < owner.size(); ++i) owned[size_t(owner[i])] += numels[i];
    std::printf("elements per rank: %lld %lld %lld\n", (long long)owned[0], (long long)owned[1],
                (long long)owned[2]);
    for (int64_t n : owned) EXPECT_GT(n, 0);
    EXPECT_TRUE(owned[0] != owned[1] || owned[1] != owned[2]);
    EXPECT_NE(std::accumulate(numels.begin(), numels.end(), int64_t(0)) % 3, 0)
        << "the element count should not divide by 3 either";
  }

  // 3 ranks x 2 rows at ZeRO-0..3.
  std::vector<fs::path> z;
  for (int stage = 0; stage <= 3; ++stage) {
    z.push_back(tmp / ("z" + std::to_string(stage)));
    run_ok(
        mpirun_command(3, "full_finetune_distributed", config,
                       three_rank_run(z.back(), corpus, 2, {{"zero_stage", std::to_string(stage)}}),
                       kOversubscribe),
        tmp / ("io_z" + std::to_string(stage)));
  }
  // ZeRO-1 with the gradients summed in buckets during the backward (another packing again).
  const fs::path overlap = tmp / "z1_overlap";
  run_ok(mpirun_command(3, "full_finetune_distributed", config,
                        three_rank_run(overlap, corpus, 2,
                                       {{"zero_stage", "1"}, {"overlap_grad_allreduce", "true"}}),
                        kOversubscribe),
         tmp / "io_z1_overlap");
  const std::vector<double> got = losses_of(logged_steps(z[0]));
  expect_same_curve(got, want, "3 ranks x 2 (ZeRO-0) vs 1 x 6");
  for (int stage = 1; stage <= 3; ++stage) {
    const std::string what = "ZeRO-" + std::to_string(stage) + " vs ZeRO-0, 3 ranks";
    EXPECT_EQ(losses_of(logged_steps(z[size_t(stage)])), got) << what;
    expect_same_tensor_files(z[size_t(stage)] / "step_3", z[0] / "step_3", what);
    expect_same_tensor_files(z[size_t(stage)] / "epoch_0", z[0] / "epoch_0", what);
  }

  EXPECT_EQ(losses_of(logged_steps(overlap)), got) << "ZeRO-1, overlap_grad_allreduce";
  expect_same_tensor_files(overlap / "epoch_0", z[0] / "epoch_0", "ZeRO-1, overlap_grad_allreduce");

  // ZeRO-3's step_3 resumed on 2 ranks x 3 rows at ZeRO-2 (another partition, each rank loading
  // the state of the parameters it now owns).
  const fs::path two = tmp / "two";
  fs::create_directories(two);
  fs::copy(z[3] / "step_3", two / "step_3", fs::copy_options::recursive);
  run_ok(mpirun_command(2, "full_finetune_distributed", config,
                        three_rank_run(two, corpus, 3,
                                       {{"zero_stage", "2"}, {"resume_from_checkpoint", "true"}})),
         tmp / "io_two");
  const std::vector<double> resumed = losses_of(logged_steps(two));
  expect_same_curve(resumed, std::vector<double>(want.begin() + 3, want.end()),
                    "resumed 3 -> 2 ranks vs 1 x 6");
  expect_same_curve(resumed, std::vector<double>(got.begin() + 3, got.end()),
                    "resumed 3 -> 2 ranks vs 3 ranks");
  std::printf("wall: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}
