#pragma once
// Subcommand dispatch: fusetune run | ls | cp | validate | plan | bench | generate ...
namespace fusetune::cli {
int dispatch(int argc, char** argv);
}
