#pragma once
// `fusetune run --nproc_per_node N RECIPE ...` (torchtune's spelling): the command starts
// itself again as N ranks through mpirun, on this host. Many hosts: call mpirun (with a
// hostfile) or srun directly (docs/distributed.md).
#include <string>
#include <vector>

namespace fusetune::dist {

// The mpirun command line that runs `fusetune_args` (the words after `fusetune`, without
// --nproc_per_node) as `nproc` ranks of `executable`.
std::vector<std::string> mpirun_command(int nproc, const std::string& executable,
                                        const std::vector<std::string>& fusetune_args);

// Replaces this process with that command (never returns; throws when mpirun cannot run).
[[noreturn]] void exec_mpirun(int nproc, const std::vector<std::string>& fusetune_args);

}  // namespace fusetune::dist
