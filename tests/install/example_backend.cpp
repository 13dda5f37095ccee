// A third party's backend plugin, written from docs/plugins.md alone and built out of tree
// against the installed files (tests/install/installed_test.sh): one file per object under a
// directory, least-recently-used eviction to stay within the tier's capacity. It completes
// every request inside submit() and hands the completions out in poll(), which is the simplest
// way to honour the contract; a real backend would overlap I/O.
//
//   g++ -std=c++20 -O2 -fPIC -shared -DTIER_BUILD_AS_PLUGIN -fvisibility=hidden
//     $(pkg-config --cflags libtier) example_backend.cpp $(pkg-config --libs libtier)
//     -o libtier_backend_files.so
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <string>
#include <vector>

#include "tier/plugin.hpp"

namespace {

namespace fs = std::filesystem;

class FilesBackend final : public tier::Backend {
 public:
  // Called by the core with the tier's validated options (the profile loader has already made a
  // relative `path` absolute against the profile's directory). No exception may escape: errors
  // are returned as a Status.
  static tier::Result<std::unique_ptr<FilesBackend>> create(const tier::BackendContext& ctx) {
    fs::path dir = ctx.options.at("path").get<std::string>();
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return tier::Status::io_error("cannot create " + dir.string() + ": " + ec.message());
    for (const auto& entry : fs::directory_iterator(dir, ec)) fs::remove(entry.path(), ec);
    return std::make_unique<FilesBackend>(ctx, dir);
  }
  FilesBackend(const tier::BackendContext& ctx, fs::path dir)
      : Backend(ctx.tier_name), dir_(std::move(dir)), capacity_(ctx.capacity_bytes) {}

  // Host buffers of any alignment; nothing survives the process (the directory is emptied at
  // start); not shared between processes.
  tier::Capabilities capabilities() const noexcept override { return {}; }
  tier::Usage usage() const noexcept override { return {capacity_, used_, index_.size()}; }

 protected:
  // Each request's user_data is the base class's id for it: return it unchanged in the
  // Completion. Every accepted request yields exactly one completion.
  tier::Result<std::size_t> do_submit(std::span<const tier::IoRequest> reqs) noexcept override {
    for (const auto& r : reqs) {
      tier::Completion c{r.user_data, tier::Status::ok(), 0};
      c.status = execute(r, c.bytes);
      ready_.push_back(std::move(c));
    }
    return reqs.size();
  }
  // Nothing is in flight outside ready_, so there is nothing to wait for: return what is there.
  tier::Result<std::size_t> do_poll(std::span<tier::Completion> out, std::size_t,
                                    std::chrono::microseconds) noexcept override {
    std::size_t n = std::min(out.size(), ready_.size());
    std::copy(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n), out.begin());
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
    return n;
  }

 private:
  struct Entry {
    tier::ObjectKey key;
    std::uint64_t bytes;
    std::list<std::string>::iterator lru;
  };

  // Runs one request; `bytes` receives the Completion's byte count.
  tier::Status execute(const tier::IoRequest& r, std::size_t& bytes) noexcept {
    std::string name = r.key.to_string();
    auto it = index_.find(name);
    switch (r.op) {
      case tier::Op::kPut: {
        if (it != index_.end()) {
          touch(it->second);
          return tier::Status(tier::Code::kAlreadyExists, "");
        }
        if (r.buf.size > capacity_)
          return tier::Status(tier::Code::kNoSpace, "larger than the tier");
        while (used_ + r.buf.size > capacity_) evict_oldest();
        std::ofstream f(dir_ / name, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(r.buf.data),
                static_cast<std::streamsize>(r.buf.size));
        if (!f) return tier::Status::io_error("cannot write " + name);
        lru_.push_front(name);
        index_[name] = Entry{r.key, r.buf.size, lru_.begin()};
        used_ += r.buf.size;
        bytes = r.buf.size;
        return tier::Status::ok();
      }
      case tier::Op::kGet: {
        if (it == index_.end()) return tier::Status::not_found();
        bytes = it->second.bytes;
        if (r.buf.size < bytes) return tier::Status::invalid("buffer too small");
        std::ifstream f(dir_ / name, std::ios::binary);
        f.read(reinterpret_cast<char*>(r.buf.data), static_cast<std::streamsize>(bytes));
        if (!f) return tier::Status::io_error("cannot read " + name);
        touch(it->second);
        return tier::Status::ok();  // the base class verifies the image before handing it out
      }
      case tier::Op::kContains:
        if (it == index_.end()) return tier::Status::not_found();
        bytes = it->second.bytes;
        return tier::Status::ok();
      case tier::Op::kRemove:
        if (it == index_.end()) return tier::Status::not_found();
        drop(it);
        return tier::Status::ok();
    }
    return tier::Status::invalid("unknown op");
  }
  void touch(Entry& e) { lru_.splice(lru_.begin(), lru_, e.lru); }
  void drop(std::map<std::string, Entry>::iterator it) {
    std::error_code ec;
    fs::remove(dir_ / it->first, ec);
    used_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    index_.erase(it);
  }
  // Evicts the least recently used object and tells the stack (which may demote it). The image
  // may be passed empty when reading it back is not cheap; here it is read.
  void evict_oldest() {
    auto it = index_.find(lru_.back());
    std::vector<std::byte> image(it->second.bytes);
    std::ifstream f(dir_ / it->first, std::ios::binary);
    f.read(reinterpret_cast<char*>(image.data()), static_cast<std::streamsize>(image.size()));
    if (!f) image.clear();
    notify_evicted(it->second.key, image, it->second.bytes);
    drop(it);
  }

  fs::path dir_;
  std::uint64_t capacity_, used_ = 0;
  std::list<std::string> lru_;  // most recent first
  std::map<std::string, Entry> index_;
  std::vector<tier::Completion> ready_;
};

constexpr const char kOptions[] = R"JSON([
  {"name": "path", "type": "path",
   "doc": "directory holding one file per object, emptied at start; relative to the profile's directory"}
])JSON";
constexpr tier_plugin kFiles = tier::make_backend_plugin<FilesBackend>(
    "files", "one file per object, LRU eviction (example third-party plugin)", kOptions);

}  // namespace

TIER_REGISTER_PLUGIN(files, kFiles)
