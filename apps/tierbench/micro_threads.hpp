#pragma once
// tierbench micro --threads N[,N...]: N threads on one TierStack (the profile's tier --tier alone)
// save, then load, their own host objects of --object-size bytes through the identity codec,
// beside N threads copying the same bytes with memcpy in the same run (the baseline). One warm-up
// round, then --rounds measured rounds, each running every N in turn (a drift of the host's load
// falls on all of them alike). Per N: each round's ratio to that round's memcpy, and its
// throughput against N/2's in the same round, reported as the median and its min-max.

#include <cstdint>
#include <string>
#include <vector>

namespace tier::bench {

struct ThreadsOptions {
  std::string profile_path;
  std::string tier_name;
  std::uint64_t object_size = 1 << 20;  // payload bytes of each object
  std::uint64_t objects = 64;           // per thread
  std::uint64_t rounds = 3;
  std::vector<std::uint64_t> threads;   // the thread counts, in order
  bool json = false;
};

// Returns the process exit status: 0, or 1 when a save or load failed or a load's bytes differ.
int run_micro_threads(const ThreadsOptions& o);

}  // namespace tier::bench
