#pragma once
// Helpers shared by libtier's tests: images, keys, a synchronous request runner, skip codes, a
// temporary directory.

#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <random>
#include <thread>
#include <vector>

#include "tier/backend.hpp"
#include "tier/object.hpp"
#include "tier/registry.hpp"
#include "tier/status.hpp"
#include "tier/tier_stack.hpp"

namespace tier::test {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction; `path`
// is empty when it could not be made.
struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "libtier-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // Where a test's store goes: a directory not made yet.
  std::string store() const { return path + "/store"; }
};

// A codec that hands every call to `inner` (which must outlive it): fault injectors and test
// codecs derive from it and override what they change.
class ForwardingCodec : public Codec {
 public:
  explicit ForwardingCodec(const Codec& inner) : inner_(inner) {}
  std::string_view name() const noexcept override { return inner_.name(); }
  std::uint32_t format_id() const noexcept override { return inner_.format_id(); }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override {
    return inner_.encoded_size(src);
  }
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override {
    return inner_.encode(src, dst);
  }
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override {
    return inner_.decode(payload, dst);
  }
  Result<DirectPayload> direct(RegionList regions) const noexcept override {
    return inner_.direct(regions);
  }

 protected:
  const Codec& inner_;
};

// Meson's exit code for a skipped test.
inline constexpr int kSkip = 77;

// How many threads a verification run of 128 chunks used (tier::for_each_on_verify_threads): the
// caller alone (1), or the caller and workers. Each chunk takes 1 ms, so a free worker joins.
inline std::size_t verify_threads_seen() {
  struct Seen {
    std::mutex mu;
    std::set<std::thread::id> threads;
  } seen;
  for_each_on_verify_threads(
      128,
      [](void* ctx, std::size_t) noexcept {
        auto* s = static_cast<Seen*>(ctx);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::lock_guard lock(s->mu);
        s->threads.insert(std::this_thread::get_id());
      },
      &seen);
  return seen.threads.size();
}

// `n` bytes from a fixed generator seeded with `seed` (inputs for hash and CRC checks).
inline std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

inline ObjectKey key_of(std::uint64_t n, std::uint64_t ns = 1, std::uint32_t rank = 0) {
  return ObjectKey{Key128{ns, ns * 31}, Key128{n, n ^ 0xabcdef}, rank};
}

// A sealed image whose payload is a deterministic pattern of `key` and `seed`.
inline std::vector<std::byte> make_image(const ObjectKey& key, std::size_t payload_bytes,
                                         std::uint64_t seed = 0) {
  std::vector<std::byte> img(kObjectHeaderBytes + payload_bytes);
  std::uint64_t x = key.id.lo * 0x9E3779B97F4A7C15ull + seed + 1;
  for (std::size_t i = 0; i < payload_bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    img[kObjectHeaderBytes + i] = static_cast<std::byte>(x & 0xff);
  }
  seal_object(img, 1 /* identity layout */, 0, key);
  return img;
}

// Submits one request and waits for its completion (up to `timeout`).
inline Completion run(Backend& b, IoRequest req,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto r = b.submit(std::span(&req, 1));
    if (!r) return Completion{0, r.status(), 0};
    if (*r == 1) break;
    Completion sink[8];
    (void)b.poll(sink, 0, std::chrono::microseconds(1000));
    if (std::chrono::steady_clock::now() > deadline)
      return Completion{0, Status(Code::kTimedOut, "submit"), 0};
  }
  Completion c;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = b.poll(std::span(&c, 1), 1, std::chrono::microseconds(100000));
    if (r && *r == 1) return c;
  }
  return Completion{0, Status(Code::kTimedOut, "poll"), 0};
}
inline Completion run(Backend& b, Op op, const ObjectKey& key, Region buf = {},
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  return run(b, IoRequest{op, key, buf, 42}, timeout);
}

// Keeps a copy of every object a backend reports evicted, in order.
struct EvictionRecorder : EvictionHandler {
  std::vector<ObjectKey> keys;
  std::vector<std::vector<std::byte>> images;
  void on_evict(const ObjectKey& k, std::span<const std::byte> image) noexcept override {
    keys.push_back(k);
    images.emplace_back(image.begin(), image.end());
  }
};

// One object of `bytes` bytes saved through `stack` with the identity codec and loaded back.
struct StackRoundTrip {
  Status codec, save_call, save, load_call, load;
  bool same = false;  // the bytes loaded equal the bytes saved
};
inline StackRoundTrip stack_round_trip(TierStack& stack, std::size_t bytes, std::uint64_t n) {
  StackRoundTrip out;
  auto codec = Registry::global().create_codec("identity", Json::object());
  if (!codec) {
    out.codec = codec.status();
    return out;
  }
  std::vector<std::byte> data(bytes, std::byte{7}), back(bytes);
  Region src = host_region(data), dst = host_region(back);
  const ObjectKey k = key_of(n);
  out.save_call = stack.save(std::span<const SaveItem>({SaveItem{k, RegionList(&src, 1)}}),
                             **codec, std::span(&out.save, 1));
  LoadResult lr;
  out.load_call = stack.load(std::span<const LoadItem>({LoadItem{k, RegionList(&dst, 1)}}),
                             **codec, std::span(&lr, 1));
  out.load = lr.status;
  out.same = back == data;
  return out;
}

// Waits for child process `pid`: its exit code, 128 + the signal that killed it, or -1.
inline int wait_child(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace tier::test
