#pragma once
// HeapLru: what the two heap modes share: an exact LRU index of images held in this process's
// memory, with the capacity counted in exact image bytes (header + payload), so a tier of capacity
// C holds floor(C / image size) equal-sized objects. Where an image's bytes live is the
// subclass's: HeapMode (heap_mode.hpp) gives each its own heap buffer, PinnedHeapMode
// (pinned_heap_mode.hpp) places them in one pinned arena. A stored image is one piece.
//
// Evicted objects are reported with their image (so the stack can demote them), before their
// storage is released. Leased objects (lease()) are skipped by eviction until their lease ends;
// a put that finds only leased objects to evict fails with NoSpace. Threads: the tier's owner
// thread only.

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cpu_mode.hpp"
#include "tier/lease.hpp"

namespace tier::cpu {

class HeapLru : public CpuMode {
 public:
  Outcome put(const ObjectKey& key, std::span<const std::byte> image,
              const EvictFn& on_evict) override;
  Outcome put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                   const EvictFn& on_evict) override;
  Outcome get(const ObjectKey& key, std::span<std::byte> out) override;
  Outcome get_with(const ObjectKey& key, std::uint64_t capacity, const PiecesFn& drain) override;
  Result<std::uint64_t> contains(const ObjectKey& key) override;
  Status remove(const ObjectKey& key) override;
  Result<LeaseId> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                        std::span<std::uint8_t> held, Counter& expiries) override;
  LeaseEnd release_lease(LeaseId id, Counter& expiries) override;
  Result<std::vector<ObjectKey>> list_keys(const Key128& ns) override;

  Usage usage() const noexcept override;
  bool shared() const noexcept override { return false; }

 protected:
  // The storage of one image.
  struct Buffer {
    std::byte* data = nullptr;
    std::size_t size = 0;
    std::unique_ptr<std::byte[]> heap;  // owns `data` when it was allocated on the heap
  };

  explicit HeapLru(std::uint64_t capacity);

  // Storage for a new image of `bytes`; room was made first (used() + bytes <= capacity()).
  // A Buffer without data when there is none.
  virtual Buffer allocate(std::size_t bytes) = 0;
  // Takes back the storage of an image that left the index.
  virtual void release(Buffer b) = 0;

  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t used() const noexcept { return used_; }
  std::size_t objects() const noexcept { return map_.size(); }
  // The buffer of every stored image (the pinned arena moves them when it compacts).
  std::vector<Buffer*> buffers();

 private:
  struct Entry {
    Buffer image;
    std::list<ObjectKey>::iterator lru;  // position in lru_ (front = most recent)
  };

  // The put of `bytes` whose fill(Piece) writes the image into its new storage.
  template <class Fill>
  Outcome insert(const ObjectKey& key, std::size_t bytes, Fill&& fill, const EvictFn& on_evict);
  // The get whose drain(Piece) copies out the stored image, once `capacity` was found to hold it.
  template <class Drain>
  Outcome read(const ObjectKey& key, std::uint64_t capacity, Drain&& drain);
  // Evicts least recently used objects that no lease holds until `bytes` more fit in the
  // capacity. False when that is not possible (the rest is leased).
  bool make_room(std::size_t bytes, const EvictFn& on_evict);

  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::unordered_map<ObjectKey, Entry> map_;
  std::list<ObjectKey> lru_;
  LeaseTable leases_;
  Counter* lease_expiries_ = nullptr;  // the tier's, from the first lease() call
};

}  // namespace tier::cpu
