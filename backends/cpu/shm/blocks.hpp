#pragma once
// shm::Blocks: a segment's object arena as block chains (docs/shm.md "Layout"): an object of n
// bytes takes ceil(n / block_size) blocks chained through `next`, and the free blocks form one
// more chain. Taking and giving blocks needs the segment lock; copying an image through its chain
// does not (the chain is reserved by a put or pinned by a get). Physically consecutive blocks are
// copied as one run. The first copy through a chunk of the arena in this process maps the whole
// chunk first (docs/shm.md "Performance"), so copies do not page-fault page by page.
//
// Every block number read from `next` is checked before it is followed, and no walk goes past the
// blocks it was asked for; a corrupt link is recorded in the segment's FaultLog and the call
// fails (take: kNone; give: the chain is left for the repair; copies: ChecksumMismatch naming
// the link, with `out` holding no valid header).

#include <cstdint>
#include <span>
#include <vector>

#include "shm/format.hpp"
#include "tier/object.hpp"
#include "tier/status.hpp"

namespace tier::cpu::shm {

// Maps chunk `c` (kMapChunk bytes) of `t`'s arena into this process unless t.mapped says it is
// already, then marks it, keeping the bytes: MADV_POPULATE_READ, or a read per page where the
// kernel lacks it (unless `populate_only`). False only when `populate_only` and the kernel refused
// (before Linux 5.14, or the file was truncated under the mapping). Any thread: a chunk mapped
// twice costs time.
bool map_chunk(const Tables& t, std::uint64_t c, bool populate_only = false) noexcept;

class Blocks {
 public:
  explicit Blocks(const Tables& t) noexcept : t_(t) {}

  // Takes `n` blocks off the free list as one chain; returns its first block. Requires
  // free_blocks >= n >= 1. Lock held.
  std::uint32_t take(std::uint32_t n) noexcept;
  // Puts the chain of `n` blocks starting at `first` back on the free list. Lock held.
  void give(std::uint32_t first, std::uint32_t n) noexcept;

  // Copies `image` into the chain starting at `first`, with `stores` (tier/object.hpp). Returns:
  // Ok, ChecksumMismatch (corrupt chain).
  Status write_image(std::uint32_t first, std::span<const std::byte> image, Stores stores) const;
  // Copies the image of `nblocks` blocks from `first` into `out` (exactly the image) and
  // verifies it (header, key, length, payload checksum) on the way; on failure `out` holds no
  // valid header. A chain of consecutive blocks is copied by copy_verified in one pass; a
  // fragmented one run by run, then verified. `first` < blocks and `out` no larger than
  // `nblocks` blocks (Index::sane). `out` is written with `stores`. Returns: Ok, ChecksumMismatch
  // (bytes or chain corrupt).
  Status read_image(const ObjectKey& key, std::uint32_t first, std::uint32_t nblocks,
                    std::span<std::byte> out, Stores stores) const;
  // The bytes [0, bytes) of the image stored from `first`, as runs of consecutive blocks.
  // Returns: the runs, ChecksumMismatch (corrupt chain).
  Result<std::vector<std::span<std::byte>>> pieces(std::uint32_t first, std::uint64_t bytes) const;

 private:
  // Calls f(image_offset, arena_pointer, length) for the bytes [begin, end) of the image stored
  // in the chain starting at `first`, merging physically consecutive blocks into one call; false
  // (a fault recorded) at a link out of range.
  template <class F>
  bool for_each_run(std::uint32_t first, std::uint64_t begin, std::uint64_t end, F&& f) const;
  // Maps the chunks of the arena holding [p, p + n) into this process, those not mapped yet.
  void map(const std::byte* p, std::uint64_t n) const noexcept;
  // Walks `n` blocks from `first` (`what` names the chain in the fault); `last` is the n-th.
  bool walk(std::uint32_t first, std::uint32_t n, std::uint32_t& last, const char* what) const;
  // ChecksumMismatch naming the fault recorded.
  Status corrupt() const;

  Tables t_;
};

}  // namespace tier::cpu::shm
