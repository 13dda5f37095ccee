#pragma once
// tierbench replay --engine dsv4: the replay driven through the offload engine's per-step API
// (engine/) instead of the raw tier stack. See docs/engine.md.

#include <string>

#include "cli.hpp"

namespace tier::bench {

// Runs the engine replay; `engine` is the --engine value (only "dsv4").
int run_replay_engine(cli::Args& args, const std::string& engine);

}  // namespace tier::bench
