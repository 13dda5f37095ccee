#pragma once
// shm::find_problems: the read-only check behind `tierctl shm verify` (docs/shm.md "Corrupt
// segments"). It walks every structure of a segment's index (header, entries and their block
// chains, hash chains, LRU list, free-entry and free-block lists, counters, client pins) with
// every index checked and every walk bounded, and names each problem it finds: which field of
// which slot, the value found and the range or value expected. It changes nothing; the repair is
// Recovery::rebuild. Lock held. Memory: O(entries + blocks) bytes.

#include <string>
#include <vector>

#include "shm/format.hpp"

namespace tier::cpu::shm {

// Each problem as one line; empty for a sound index.
std::vector<std::string> find_problems(const Tables& t);

}  // namespace tier::cpu::shm
