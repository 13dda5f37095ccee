// tierbench: measured throughput of tiers and workloads, each against a baseline of the same run.
#include "cli.hpp"

int main(int argc, char** argv) { return tier::cli::dispatch("tierbench", argc, argv); }
