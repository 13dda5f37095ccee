// tierbench disk_recovery --dir D [--objects N] [--object-size SIZE] [--depth D] [--json]
// Fills a disk tier store with N objects (unless it holds them already), closes it, and reopens
// it: reports the time the tier takes to rebuild its index (scan of every region directory plus
// the in-memory index), as a restart after a crash would.
#include <fmt/format.h>

#include "bench_util.hpp"
#include "cli.hpp"
#include "disk_backend.hpp"
#include "tier/codec.hpp"
#include "tier/object.hpp"
#include "tier/options.hpp"

namespace tier::bench {
namespace {

disk::DiskOptions options_for(const std::string& dir, std::uint64_t objects, std::uint64_t padded,
                              std::uint32_t depth) {
  disk::DiskOptions o;
  o.path = dir;
  o.region_size = 16ull << 20;
  // Room for every object plus two regions, so that nothing is evicted.
  o.capacity = (objects * padded / o.region_size + 3) * o.region_size;
  o.queue_depth = depth;
  return o;
}

Status fill(disk::DiskBackend& b, std::uint64_t objects, std::size_t payload, std::size_t padded,
            std::uint32_t depth, const Key128& ns) {
  // One buffer per request in flight, sealed again for each key.
  std::vector<AlignedBuffer> bufs;
  std::vector<std::uint32_t> free;
  for (std::uint32_t i = 0; i < depth; ++i) {
    bufs.push_back(aligned_buffer(padded, 4096));
    free.push_back(i);
  }
  cli::Progress bar("fill", objects);
  std::uint64_t next = 0, done = 0;
  std::vector<Completion> out(depth);
  while (done < objects) {
    std::vector<IoRequest> reqs;
    while (next + reqs.size() < objects && !free.empty()) {
      std::uint32_t record = free.back();
      free.pop_back();
      ObjectKey k{ns, Key128{next + reqs.size(), 0}, 0};
      seal_object({bufs[record].get(), kObjectHeaderBytes + payload}, kIdentityLayoutId, 0, k);
      reqs.push_back(
          IoRequest{Op::kPut, k, Region{bufs[record].get(), padded, MemoryKind::kHost, -1}, record});
    }
    if (!reqs.empty()) {
      auto r = b.submit(reqs);
      if (!r) return r.status();
      for (std::size_t i = *r; i < reqs.size(); ++i)
        free.push_back(static_cast<std::uint32_t>(reqs[i].user_data));
      next += *r;
    }
    auto n = b.poll(out, 1, std::chrono::microseconds(100'000));
    if (!n) return n.status();
    for (std::size_t i = 0; i < *n; ++i) {
      if (!out[i].status.is_ok() && !(out[i].status == Code::kAlreadyExists)) return out[i].status;
      free.push_back(static_cast<std::uint32_t>(out[i].user_data));
    }
    done += *n;
    bar.update(done);
  }
  return Status::ok();
}

int run_disk_recovery(cli::Args& args) {
  auto dir = args.get("dir");
  std::uint64_t objects = args.uint("objects", 1, 1ull << 32).value_or(1'000'000);
  std::uint64_t object_size = args.size("object-size", 1, 4ull << 30).value_or(4096);
  auto depth = static_cast<std::uint32_t>(args.uint("depth", 1, 4096).value_or(64));
  bool json = args.flag("json");
  args.finish();
  if (!dir)
    return cli::fail(
        "usage: tierbench disk_recovery --dir D [--objects N] "
        "[--object-size SIZE] [--depth D] [--json]",
        2);
  if (objects == 0 || depth == 0 || object_size <= kObjectHeaderBytes)
    return cli::fail("--objects and --depth must be > 0, --object-size > 96", 2);
  if (object_size > (16ull << 20))
    return cli::fail("--object-size must be at most 16MiB (the store's region size)", 2);
  // The store holds every object on disk; in memory only `depth` images are in flight.
  std::uint64_t store_bytes = 0;
  if (__builtin_mul_overflow(objects, object_size + 4096, &store_bytes) ||
      store_bytes > (1ull << 50))
    return cli::fail(
        fmt::format("--objects {} of --object-size {} is more than 1PiB", objects, object_size), 2);
  if (std::string why = check_memory(depth, object_size + 4096, 1, "--depth images in flight");
      !why.empty())
    return cli::fail(why, 2);
  const std::size_t payload = object_size - kObjectHeaderBytes;
  const std::size_t padded = (object_size + 4095) / 4096 * 4096;
  const Key128 ns = *namespace_id(Json{{"bench", "disk_recovery"}});
  const auto opts = options_for(*dir, objects, padded, depth);
  double fill_s = 0;
  {
    auto b = disk::DiskBackend::open("disk", opts);
    if (!b) return cli::fail(b.status().to_string());
    if ((*b)->usage().objects < objects) {
      auto t0 = Clock::now();
      Status s = fill(**b, objects, payload, padded, depth, ns);
      if (!s) return cli::fail(s.to_string());
      fill_s = seconds_since(t0);
    }
  }
  auto b = disk::DiskBackend::open("disk", opts);
  if (!b) return cli::fail(b.status().to_string());
  const disk::DiskStats& st = (*b)->stats();
  const auto& g = (*b)->geometry();
  Json j = {{"objects", st.recovered_objects}, {"object_bytes", padded},
            {"regions", g.region_count},       {"index_bytes", g.index_file_bytes()},
            {"recovery_ms", st.recovery_ms},   {"fill_seconds", fill_s}};
  if (json)
    fmt::print("{}\n", tier::json_text(j));
  else
    fmt::print(
        "rebuilt the index of {} objects ({} each; {} regions, index file {}) in {:.1f} ms{}\n",
        st.recovered_objects, format_size(padded), g.region_count,
        format_size(g.index_file_bytes()), st.recovery_ms,
        fill_s > 0 ? fmt::format(" (filled in {:.1f} s)", fill_s) : "");
  return st.recovered_objects >= objects ? 0 : 1;
}

}  // namespace
}  // namespace tier::bench

TIER_CLI_COMMAND(disk_recovery,
                 "disk_recovery --dir D [--objects N] [--object-size SIZE] [--depth D] [--json]",
                 "fill a disk tier store with N objects (default 1M of 4KiB), reopen it and report "
                 "the index rebuild time",
                 tier::bench::run_disk_recovery);
