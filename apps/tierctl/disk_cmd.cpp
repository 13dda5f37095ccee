// tierctl disk inspect|verify|repair DIR [--json]: offline tools for a disk tier's store.
//   inspect  summary from the index alone (objects, bytes, namespaces, free and dead space)
//   verify   reads every object and checks it (header, key, length, payload checksum) against
//            its entry; exit 0 when clean, 1 when any object or entry is bad
//   repair   verify, then drop what is bad (and shadowed duplicates) from the index; needs the
//            store to be closed (exclusive lock)
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <unordered_map>

#include "cli.hpp"
#include "disk_layout.hpp"
#include "tier/object.hpp"
#include "tier/options.hpp"

namespace tier::disk {
namespace {

using Clock = std::chrono::steady_clock;

struct Bad {
  std::uint32_t region;
  std::uint32_t record;
  std::string key;
  std::string reason;
};

struct Store {
  StoreFiles files;
  Geometry geo;
  ScanResult scan;
  double scan_ms = 0;
  std::vector<std::size_t> live;      // indexes into scan.entries, by region then offset
  std::vector<std::size_t> shadowed;  // older copies of a key held twice (the tier ignores them)
  std::int64_t newest = -1;           // the region that receives appends
};

Result<Store> load_store(const std::string& dir, bool exclusive, bool quiet) {
  Store s;
  OpenOptions oo;
  oo.write = exclusive;
  oo.exclusive = exclusive;
  oo.require_lock = exclusive;
  TIER_ASSIGN_OR_RETURN(s.files, open_store(dir, oo));
  if (!s.files.locked() && !quiet)
    fmt::print(stderr, "note: {} is open in a running tier; this is a live snapshot\n", dir);
  TIER_ASSIGN_OR_RETURN(s.geo, read_superblock(s.files.index()));
  const auto t0 = Clock::now();
  {
    cli::Progress bar("scan index", std::uint64_t{s.geo.region_count} * s.geo.dir_bytes());
    auto progress = [&](std::uint64_t done, std::uint64_t) { bar.update(done); };
    TIER_ASSIGN_OR_RETURN(s.scan, scan_index(s.files.index(), s.geo, progress));
  }
  s.scan_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  // As the tier does on start-up: of two entries for one key, the newer generation wins.
  std::vector<std::size_t> order(s.scan.entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto seq_of = [&](std::size_t i) { return s.scan.regions[s.scan.entries[i].region].seq; };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return seq_of(a) < seq_of(b); });
  std::unordered_map<ObjectKey, std::size_t> by_key;
  for (std::size_t i : order) {
    auto [it, fresh] = by_key.try_emplace(s.scan.entries[i].entry.key, i);
    if (!fresh) {
      s.shadowed.push_back(it->second);
      it->second = i;
    }
  }
  for (auto& [key, i] : by_key) s.live.push_back(i);
  std::sort(s.live.begin(), s.live.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = s.scan.entries[a];
    const auto& y = s.scan.entries[b];
    return std::tie(x.region, x.entry.offset_blocks) < std::tie(y.region, y.entry.offset_blocks);
  });
  std::uint64_t best = 0;
  for (std::uint32_t r = 0; r < s.geo.region_count; ++r)
    if (s.scan.regions[r].in_use && s.scan.regions[r].seq > best) {
      best = s.scan.regions[r].seq;
      s.newest = r;
    }
  return s;
}

Json summary_json(const Store& s) {
  const Geometry& g = s.geo;
  std::uint64_t bytes = 0;
  std::vector<std::uint64_t> live_blocks(g.region_count, 0), end_blocks(g.region_count, 0);
  std::set<std::pair<std::uint64_t, std::uint64_t>> namespaces;
  for (std::size_t i : s.live) {
    const ScannedEntry& e = s.scan.entries[i];
    bytes += e.entry.image_bytes;
    live_blocks[e.region] += g.blocks_for(e.entry.image_bytes);
    namespaces.insert({e.entry.key.ns.lo, e.entry.key.ns.hi});
  }
  for (const ScannedEntry& e : s.scan.entries)
    end_blocks[e.region] = std::max<std::uint64_t>(
        end_blocks[e.region], e.entry.offset_blocks + g.blocks_for(e.entry.image_bytes));
  std::uint64_t used_regions = 0, free_bytes = 0, dead_bytes = 0;
  for (std::uint32_t r = 0; r < g.region_count; ++r) {
    if (!s.scan.regions[r].in_use) {
      free_bytes += g.region_size;
      continue;
    }
    ++used_regions;
    const std::uint64_t written =
        static_cast<std::int64_t>(r) == s.newest ? end_blocks[r] : g.region_blocks();
    free_bytes += (g.region_blocks() - written) * g.block_size;
    dead_bytes += (written - live_blocks[r]) * g.block_size;
  }
  return Json{{"path", s.files.dir()},
              {"block_size", g.block_size},
              {"region_size", g.region_size},
              {"regions", g.region_count},
              {"regions_in_use", used_regions},
              {"capacity_bytes", g.data_file_bytes()},
              {"objects", s.live.size()},
              {"bytes", bytes},
              {"namespaces", namespaces.size()},
              {"free_bytes", free_bytes},
              {"dead_bytes", dead_bytes},
              {"shadowed_entries", s.shadowed.size()},
              {"stale_entries", s.scan.stale_entries},
              {"corrupt_entries", s.scan.corrupt_entries.size()},
              {"corrupt_regions", s.scan.corrupt_regions.size()},
              {"index_scan_ms", s.scan_ms}};
}

void print_summary(const Json& j) {
  fmt::print("store          {}\n", j["path"].get<std::string>());
  fmt::print("geometry       {} regions of {}, block {} ({} in use)\n",
             j["regions"].get<std::uint64_t>(), format_size(j["region_size"].get<std::uint64_t>()),
             j["block_size"].get<std::uint64_t>(), j["regions_in_use"].get<std::uint64_t>());
  fmt::print("objects        {} ({}) in {} namespace(s)\n", j["objects"].get<std::uint64_t>(),
             format_size(j["bytes"].get<std::uint64_t>()), j["namespaces"].get<std::uint64_t>());
  fmt::print("capacity       {}: {} free, {} dead (removed, evicted or padding)\n",
             format_size(j["capacity_bytes"].get<std::uint64_t>()),
             format_size(j["free_bytes"].get<std::uint64_t>()),
             format_size(j["dead_bytes"].get<std::uint64_t>()));
  fmt::print(
      "index          scanned in {:.1f} ms; {} corrupt entries, {} corrupt region headers, "
      "{} shadowed, {} stale\n",
      j["index_scan_ms"].get<double>(), j["corrupt_entries"].get<std::uint64_t>(),
      j["corrupt_regions"].get<std::uint64_t>(), j["shadowed_entries"].get<std::uint64_t>(),
      j["stale_entries"].get<std::uint64_t>());
}

// Reads and checks every live object. Returns the bad ones (objects and index damage).
std::vector<Bad> verify_objects(const Store& s, std::uint64_t* checked_bytes) {
  const Geometry& g = s.geo;
  std::vector<Bad> bad;
  for (const RecordRef& c : s.scan.corrupt_entries)
    bad.push_back({c.region, c.record, "", "index entry fails its checksum"});
  for (std::uint32_t r : s.scan.corrupt_regions)
    bad.push_back({r, 0, "", "region header fails its checksum (all its objects are lost)"});
  std::uint64_t total = 0;
  for (std::size_t i : s.live) total += s.scan.entries[i].entry.image_bytes;
  AlignedBuffer buf(g.region_size, g.block_size);
  cli::Progress bar("verify", total);
  std::uint64_t done = 0;
  for (std::size_t i : s.live) {
    const ScannedEntry& e = s.scan.entries[i];
    const std::uint64_t n = g.blocks_for(e.entry.image_bytes) * g.block_size;
    Status st = pread_full(s.files.data(), buf.data(), n,
                           g.data_offset(e.region, e.entry.offset_blocks), "data");
    if (st) {
      auto image = std::span<const std::byte>(buf.data(), e.entry.image_bytes);
      st = verify_object(image, e.entry.key);
      if (st) {
        auto h = parse_object_header(image);
        if (static_cast<std::uint32_t>(h->payload_checksum) != e.entry.payload_check)
          st = Status(Code::kChecksumMismatch, "object differs from its index entry");
      }
    }
    if (!st) bad.push_back({e.region, e.record, e.entry.key.to_string(), std::string(st.message())});
    done += e.entry.image_bytes;
    bar.update(done);
  }
  *checked_bytes = done;
  return bad;
}

Json bad_json(const std::vector<Bad>& bad) {
  Json list = Json::array();
  for (std::size_t i = 0; i < bad.size() && i < 1000; ++i)
    list.push_back({{"region", bad[i].region},
                    {"record", bad[i].record},
                    {"key", bad[i].key},
                    {"reason", bad[i].reason}});
  return list;
}

int run_inspect(Store& s, bool json) {
  Json j = summary_json(s);
  if (json)
    fmt::print("{}\n", j.dump());
  else
    print_summary(j);
  return 0;
}

int run_verify(Store& s, bool json) {
  std::uint64_t bytes = 0;
  const auto bad = verify_objects(s, &bytes);
  if (json) {
    fmt::print("{}\n", Json{{"objects", s.live.size()},
                            {"bytes", bytes},
                            {"bad_objects", bad.size()},
                            {"bad", bad_json(bad)}}
                           .dump());
  } else {
    fmt::print("verified {} objects ({}): {} bad\n", s.live.size(), format_size(bytes), bad.size());
    for (const Bad& b : bad)
      fmt::print("  region {} record {} {}: {}\n", b.region, b.record, b.key, b.reason);
  }
  return bad.empty() ? 0 : 1;
}

int run_repair(Store& s, bool json) {
  std::uint64_t bytes = 0;
  const auto bad = verify_objects(s, &bytes);
  const Geometry& g = s.geo;
  // Per region: the records to clear (record 0: the whole directory).
  std::map<std::uint32_t, std::vector<std::uint32_t>> clear;
  for (const Bad& b : bad) clear[b.region].push_back(b.record);
  for (std::size_t i : s.shadowed)
    clear[s.scan.entries[i].region].push_back(s.scan.entries[i].record);
  AlignedBuffer dir(g.dir_bytes(), g.block_size);
  for (auto& [region, records] : clear) {
    Status rd =
        pread_full(s.files.index(), dir.data(), dir.size(), g.dir_offset(region, 0), "index");
    if (!rd) return cli::fail(rd.to_string());
    for (std::uint32_t record : records) {
      if (record == 0)
        std::memset(dir.data(), 0, dir.size());
      else
        std::memset(dir.data() + std::size_t{record} * kRecordBytes, 0, kRecordBytes);
    }
    Status st =
        pwrite_full(s.files.index(), dir.data(), dir.size(), g.dir_offset(region, 0), "index");
    if (!st) return cli::fail(st.to_string());
  }
  if (::fsync(s.files.index()) != 0) return cli::fail("fsync of the index failed");
  const std::size_t dropped = bad.size() + s.shadowed.size();
  const std::size_t before = s.live.size();
  // The rebuilt index, as the tier will see it.
  auto again = load_store(s.files.dir(), false, true);
  std::size_t after = again ? again->live.size() : 0;
  if (json) {
    fmt::print("{}\n", Json{{"objects", before},
                            {"bad_objects", bad.size()},
                            {"dropped_entries", dropped},
                            {"objects_after", after},
                            {"bad", bad_json(bad)}}
                           .dump());
  } else {
    fmt::print("checked {} objects: dropped {} bad and {} shadowed entries; {} objects remain\n",
               before, bad.size(), s.shadowed.size(), after);
  }
  return 0;
}

int run_disk(cli::Args& args) {
  bool json = args.flag("json");
  args.finish();
  const auto& pos = args.positional();
  if (pos.size() != 2 || (pos[0] != "inspect" && pos[0] != "verify" && pos[0] != "repair"))
    return cli::fail("usage: tierctl disk inspect|verify|repair DIR [--json]", 2);
  const bool repair = pos[0] == "repair";
  struct stat st {};
  if (::stat(pos[1].c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return cli::fail(fmt::format("{}: not a directory", pos[1]), 2);
  auto store = load_store(pos[1], repair, json);
  if (!store) {
    if (store.status() == Code::kNotFound)
      return cli::fail(
          fmt::format("{}: not a disk tier store ({})", pos[1], store.status().message()));
    return cli::fail(store.status().to_string());
  }
  if (pos[0] == "inspect") return run_inspect(*store, json);
  if (pos[0] == "verify") return run_verify(*store, json);
  return run_repair(*store, json);
}

}  // namespace
}  // namespace tier::disk

TIER_CLI_COMMAND(disk, "disk inspect|verify|repair DIR [--json]",
                 "disk tier store: summary; full checksum verification (exit 1 when anything "
                 "is bad); repair (drops bad objects and rebuilds the index; the tier must be "
                 "stopped)",
                 tier::disk::run_disk);
