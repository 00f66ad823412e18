#include "fusetune/distributed/launcher.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "fusetune/util/error.h"

namespace fusetune::dist {

std::vector<std::string> mpirun_command(int nproc, const std::string& executable,
                                        const std::vector<std::string>& fusetune_args) {
  std::vector<std::string> cmd = {"mpirun", "-np", std::to_string(nproc)};
  // Open MPI refuses to run as root unless told (containers often run as root).
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  // Each rank runs its own OpenMP team (OMP_NUM_THREADS below): binding every rank to one
  // core would put the whole team there.
  cmd.insert(cmd.end(), {"--bind-to", "none"});
  cmd.push_back(executable);
  cmd.insert(cmd.end(), fusetune_args.begin(), fusetune_args.end());
  return cmd;
}

void exec_mpirun(int nproc, const std::vector<std::string>& fusetune_args) {
  FT_CHECK(nproc >= 1, "--nproc_per_node must be >= 1, got " + std::to_string(nproc));
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  FT_CHECK(!ec, "--nproc_per_node: cannot find this executable's path (/proc/self/exe)");
  // As torchrun: the cores are shared among the ranks unless OMP_NUM_THREADS says otherwise
  // (num_threads in the config still wins).
  if (!std::getenv("OMP_NUM_THREADS")) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const std::string per_rank = std::to_string(std::max(1u, cores / unsigned(nproc)));
    ::setenv("OMP_NUM_THREADS", per_rank.c_str(), 1);
  }
  const std::vector<std::string> cmd = mpirun_command(nproc, self, fusetune_args);
  std::vector<char*> argv;
  for (const std::string& s : cmd) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  throw Error(std::string("--nproc_per_node: cannot run mpirun (") + std::strerror(errno) +
              "); install Open MPI (openmpi-bin; scripts/install_deps.sh does) or start the "
              "ranks with your own launcher (mpirun -np N fusetune run ..., srun)");
}

}  // namespace fusetune::dist
