// tierctl: check and explain profiles, derive keys, inspect tiers.
#include "cli.hpp"

int main(int argc, char** argv) { return tier::cli::dispatch("tierctl", argc, argv); }
