#pragma once
// The CPU tier: objects in process heap memory, bounded by capacity, exact LRU eviction.
//
// Every request completes synchronously inside submit(); poll() hands the completions out.
// Capacity counts image bytes (header + payload) exactly, so a tier of capacity C holds
// floor(C / image size) equal-sized objects. Freed buffers are kept for reuse (bounded by the
// capacity) so a warm cache does not page-fault on every put.

#include <cstddef>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "tier/backend.hpp"

namespace tier::cpu {

class CpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CpuBackend>> create(const BackendContext& ctx);
  CpuBackend(std::string tier_name, std::uint64_t capacity);

  Capabilities capabilities() const noexcept override;
  Usage usage() const noexcept override;
  std::string describe() const override;

 protected:
  Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept override;
  Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                              std::chrono::microseconds wait) noexcept override;

 private:
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    std::size_t size = 0;
  };
  struct Entry {
    Buffer image;
    std::list<ObjectKey>::iterator lru;  // position in lru_ (front = most recent)
  };
  Completion put(const IoRequest& r);
  Completion get(const IoRequest& r);
  Buffer allocate(std::size_t bytes);
  void release(Buffer b);

  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t spare_bytes_ = 0;
  std::unordered_map<ObjectKey, Entry> map_;
  std::list<ObjectKey> lru_;
  std::unordered_multimap<std::size_t, Buffer> spare_;  // freed buffers by size, for reuse
  std::vector<Completion> ready_;
};

}  // namespace tier::cpu
