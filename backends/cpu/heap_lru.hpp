#pragma once
// HeapLru: what the two heap modes share: an exact LRU index of images held in this process's
// memory, with the capacity counted in exact image bytes (header + payload), so a tier of capacity
// C holds floor(C / image size) equal-sized objects. Where an image's bytes live is the
// subclass's: HeapMode (heap_mode.hpp) gives each its own heap buffer, PinnedHeapMode
// (pinned_heap_mode.hpp) places them in one pinned arena. A stored image is one piece.
//
// Evicted objects are reported with their image (so the stack can demote them), before their
// storage is released. Leased objects (lease()) are skipped by eviction until their lease ends;
// a put that finds only leased objects to evict fails with NoSpace.
//
// Threads: every method may be called from several threads at once. Only the index (map, LRU
// list, byte counts, leases) is under a lock, held for a few instructions: a put reserves its
// bytes and a slot under it, writes the image outside it, and publishes the slot (visible to
// gets from then on; a get or contains of a key whose put is still writing misses, a second put
// of that key waits for the first and then finds it stored); a get marks the slot read and copies
// outside it. An image evicted or removed while a get copies it is freed by the last reader, so
// the bytes a get copies never change under it. Eviction reports go out without the lock.
// allocate() and release() are called with the lock held.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cpu_mode.hpp"
#include "tier/lease.hpp"

namespace tier::cpu {

class HeapLru : public CpuMode {
 public:
  Outcome put(const ObjectKey& key, std::span<const std::byte> image, Stores stores,
              const EvictFn& on_evict) override;
  Outcome put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                   const EvictFn& on_evict) override;
  void make_room_for(std::span<const ObjectKey> keys, std::span<const std::uint64_t> image_bytes,
                     const EvictFn& on_evict) override;
  void refresh(std::span<const ObjectKey> keys) override;
  Outcome get(const ObjectKey& key, std::span<std::byte> out, Stores stores) override;
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
  struct FreeHeap {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  struct Buffer {
    std::byte* data = nullptr;
    std::size_t size = 0;
    std::unique_ptr<std::byte, FreeHeap> heap;  // the allocation holding `data`, if on the heap
  };

  explicit HeapLru(std::uint64_t capacity);

  // Storage for a new image of `bytes`; room was made first (used() + spare <= capacity()).
  // A Buffer without data when there is none. Called with the index lock held.
  virtual Buffer allocate(std::size_t bytes) = 0;
  // Takes back the storage of an image that left the index. Called with the index lock held.
  virtual void release(Buffer b) = 0;

  // Under the index lock (from allocate() or release()), or by a mode that is not concurrent.
  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t used() const noexcept { return used_; }
  // The buffer of every stored image (the pinned arena moves them when it compacts: a mode that
  // does so is not concurrent, so no get copies out of them meanwhile). Under the index lock.
  std::vector<Buffer*> buffers();

 private:
  struct Slot {
    ObjectKey key;
    Buffer image;
    std::list<ObjectKey>::iterator lru;  // position in lru_ (front = most recent), once filled
    std::uint32_t readers = 0;           // gets copying out of `image` without the lock
    bool filled = false;                 // false while its put writes it: not stored yet
    bool parked = false;                 // left the index while read: in gone_
  };
  using SlotPtr = std::unique_ptr<Slot>;

  // The put of `bytes` whose fill(Piece) writes the image into its new storage; deferred when
  // it needs room and `on_evict` is empty.
  template <class Fill>
  Outcome insert(const ObjectKey& key, std::size_t bytes, Fill&& fill, const EvictFn& on_evict);
  // The get whose drain(Piece) copies out the stored image, once `capacity` was found to hold it.
  template <class Drain>
  Outcome read(const ObjectKey& key, std::uint64_t capacity, Drain&& drain);
  // Takes least recently used objects that no lease holds out of the index until `bytes` more
  // fit in the capacity, into `victims`. False when that is not possible (the rest is leased).
  bool make_room(std::size_t bytes, std::vector<SlotPtr>& victims);
  // Reports `victims` through `on_evict` (without the lock), then retires them; returns with the
  // lock held.
  std::unique_lock<std::mutex> evict(std::vector<SlotPtr>& victims, const EvictFn& on_evict);
  // Takes the slot of `it` out of the index (and its bytes out of used_).
  SlotPtr detach(std::unordered_map<ObjectKey, SlotPtr>::iterator it);
  // Frees a slot that left the index, or parks it in gone_ while gets still read it.
  void retire(SlotPtr s);
  // Ends a get's read of `s` (under the lock): frees it when it was parked and this was the last.
  void unread(Slot* s);
  // Gives up the reservation of a put whose storage or fill failed (under the lock).
  void abandon(Slot* s);

  mutable std::mutex mu_;  // every field below
  std::condition_variable filled_cv_;  // a slot was filled or abandoned
  std::uint64_t capacity_;
  std::uint64_t used_ = 0;   // bytes of stored images and of puts still writing theirs
  std::size_t filling_ = 0;  // slots whose put is still writing them
  std::unordered_map<ObjectKey, SlotPtr> map_;
  std::list<ObjectKey> lru_;
  std::vector<SlotPtr> gone_;  // evicted or removed while read; freed by their last reader
  LeaseTable leases_;
  Counter* lease_expiries_ = nullptr;  // the tier's, from the first lease() call
};

}  // namespace tier::cpu
