// tierctl disk inspect|verify|repair|format DIR [--json]: offline tools for a disk tier's store.
//   inspect  summary from the index alone (objects, bytes, namespaces, free and dead space)
//   verify   reads every object and checks it (header, key, length, payload checksum) against
//            its entry; exit 0 when clean, 1 when any object or entry is bad
//   repair   rebuilds the directories of regions the index lost (truncated, or a damaged region
//            header) from the images in the data file, then verifies and drops what is bad (and
//            shadowed duplicates) from the index; needs the store to be closed (exclusive lock)
//   format   makes an empty store (the only way, with repair, to rewrite files that the tier
//            does not recognise as a store)
// Every size and offset read from the files is checked against the files' sizes before it is
// used; an object is read in pieces of at most 8 MiB, so memory stays bounded whatever the files
// say.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "cli.hpp"
#include "disk_format.hpp"
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

// Scans the index of an open store and sorts its entries as the tier would see them.
Status analyse(Store& s) {
  const auto t0 = Clock::now();
  {
    cli::Progress bar("scan index", std::uint64_t{s.geo.region_count} * s.geo.dir_bytes());
    auto progress = [&](std::uint64_t done, std::uint64_t) { bar.update(done); };
    TIER_ASSIGN_OR_RETURN(s.scan, scan_index(s.files.index(), s.geo, s.files.index_bytes(),
                                             s.files.data_bytes(), progress));
  }
  s.scan_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.live.clear();
  s.shadowed.clear();
  s.newest = -1;
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
  return Status::ok();
}

// Opens a store for inspection (shared lock, not required; another user's store may be read) or
// for repair and format (exclusive lock, writable, own files only). `create`: the directory and
// both files (format); `create_index`: a missing index only (repair).
Result<StoreFiles> open_files(const std::string& dir, bool exclusive, bool quiet, bool create,
                              bool create_index = false) {
  OpenOptions oo;
  oo.write = exclusive;
  oo.exclusive = exclusive;
  oo.require_lock = exclusive;
  oo.check_owner = exclusive;
  oo.create = create;
  oo.create_index = create_index;
  if (exclusive) ignore_sigxfsz();
  TIER_ASSIGN_OR_RETURN(StoreFiles f, open_store(dir, oo));
  if (!f.locked() && !quiet)
    fmt::print(stderr, "note: {} is open in a running tier; this is a live snapshot\n", dir);
  return f;
}

Result<Store> load_store(const std::string& dir, bool quiet) {
  Store s;
  TIER_ASSIGN_OR_RETURN(s.files, open_files(dir, false, quiet, false));
  TIER_ASSIGN_OR_RETURN(s.geo, read_superblock(s.files.index()));
  TIER_RETURN_IF_ERROR(analyse(s));
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
              {"lost_regions", s.scan.lost_regions.size()},
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
  if (j["lost_regions"].get<std::uint64_t>() > 0)
    fmt::print(
        "               index truncated: the directories of {} regions are missing "
        "(`tierctl disk repair` rebuilds them from the data file)\n",
        j["lost_regions"].get<std::uint64_t>());
}

constexpr std::size_t kChunk = 8u << 20;  // the most bytes read at once

// Checks the image at `offset` of the data file: header, the key when one is expected, its length
// (`image_bytes` when known; the image must end by `limit`, the end of its region), the payload
// checksum. `have` holds bytes of the file from `offset` already read (possibly none); the rest is
// read in pieces of at most kChunk bytes through `buf` (kChunk bytes, block-aligned), the first
// piece sized to the image when its size is known, so a small image costs one read.
// Returns: its header, ChecksumMismatch (with what is wrong), IoError.
Result<ObjectHeader> check_image_at(int fd, const Geometry& g, AlignedBuffer& buf,
                                    std::uint64_t offset, std::uint64_t limit, const ObjectKey* key,
                                    std::uint64_t image_bytes,
                                    std::span<const std::byte> have = {}) {
  // The bytes [pos, pos + n) of the image: from `have`, or read into `buf`.
  std::span<const std::byte> piece;
  auto bytes_at = [&](std::uint64_t pos, std::uint64_t n) -> Status {
    if (pos + n <= have.size()) {
      piece = have.subspan(pos, n);
      return Status::ok();
    }
    piece = std::span<const std::byte>(buf.data(), n);
    return pread_full(fd, buf.data(), n, offset + pos, "data");
  };
  const std::uint64_t first = std::min<std::uint64_t>(
      kChunk, std::max<std::uint64_t>(g.blocks_for(image_bytes), 1) * g.block_size);
  TIER_RETURN_IF_ERROR(bytes_at(0, first));
  TIER_ASSIGN_OR_RETURN(ObjectHeader h, parse_object_header(piece));
  if (key != nullptr && !(h.key == *key))
    return Status(Code::kChecksumMismatch, "the image holds another key than its entry");
  if (h.payload_bytes > limit - offset - kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch, "the image's size runs past the end of its region");
  const std::uint64_t image = kObjectHeaderBytes + h.payload_bytes;
  if (image_bytes != 0 && image != image_bytes)
    return Status(Code::kChecksumMismatch, "the image's size differs from its entry");
  const std::uint64_t padded = g.blocks_for(image) * g.block_size;
  // The payload checksum of the image's version, fed piece by piece: version 1 hashes the whole
  // payload, version 2 each kChecksumChunkBytes chunk (chunks straddle the pieces), then the list.
  const bool whole = h.version == kObjectVersionWholePayload;
  XXH3_state_t* st = XXH3_createState();
  if (st == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  std::vector<std::uint64_t> chunk_sums;  // version 2; at most region size / 64 KiB entries
  std::uint64_t in_chunk = 0;
  auto feed = [&](const std::byte* p, std::uint64_t n) {
    while (n > 0) {
      const std::uint64_t take =
          whole ? n : std::min<std::uint64_t>(n, kChecksumChunkBytes - in_chunk);
      XXH3_64bits_update(st, p, take);
      p += take;
      n -= take;
      if (whole) continue;
      if ((in_chunk += take) == kChecksumChunkBytes) {
        chunk_sums.push_back(XXH3_64bits_digest(st));
        XXH3_64bits_reset(st);
        in_chunk = 0;
      }
    }
  };
  Status io = Status::ok();
  for (std::uint64_t pos = 0; pos < padded; pos += kChunk) {
    const std::uint64_t n = std::min<std::uint64_t>(kChunk, padded - pos);
    if (pos > 0 || n > first) io = bytes_at(pos, n);
    if (!io) break;
    const std::uint64_t from = std::max<std::uint64_t>(pos, kObjectHeaderBytes);
    const std::uint64_t to = std::min<std::uint64_t>(pos + n, image);
    if (to > from) feed(piece.data() + (from - pos), to - from);
  }
  if (!whole && in_chunk > 0) chunk_sums.push_back(XXH3_64bits_digest(st));
  const std::uint64_t sum = whole ? XXH3_64bits_digest(st) : chunk_list_checksum(chunk_sums);
  XXH3_freeState(st);
  TIER_RETURN_IF_ERROR(io);
  if (sum != h.payload_checksum)
    return Status(Code::kChecksumMismatch, "the payload fails its checksum");
  return h;
}

// Reads and checks every live object. Returns the bad ones (objects and index damage).
std::vector<Bad> verify_objects(const Store& s, std::uint64_t* checked_bytes) {
  const Geometry& g = s.geo;
  std::vector<Bad> bad;
  for (const RecordRef& c : s.scan.corrupt_entries)
    bad.push_back({c.region, c.record, "", "index entry fails its checks"});
  for (std::uint32_t r : s.scan.corrupt_regions)
    bad.push_back({r, 0, "",
                   "region header fails its checksum (repair rebuilds the region's "
                   "directory from the data file)"});
  for (std::uint32_t r : s.scan.lost_regions)
    bad.push_back({r, 0, "",
                   "directory missing: the index is truncated (repair rebuilds it from "
                   "the data file)"});
  std::uint64_t total = 0;
  for (std::size_t i : s.live) total += s.scan.entries[i].entry.image_bytes;
  AlignedBuffer buf(kChunk, g.block_size);
  cli::Progress bar("verify", total);
  std::uint64_t done = 0;
  for (std::size_t i : s.live) {
    const ScannedEntry& e = s.scan.entries[i];
    const std::uint64_t at = g.data_offset(e.region, e.entry.offset_blocks);
    auto h = check_image_at(s.files.data(), g, buf, at, g.data_offset(e.region + 1, 0),
                            &e.entry.key, e.entry.image_bytes);
    Status st = h ? Status::ok() : h.status();
    if (h && static_cast<std::uint32_t>(h->payload_checksum) != e.entry.payload_check)
      st = Status(Code::kChecksumMismatch, "object differs from its index entry");
    if (!st)
      bad.push_back({e.region, e.record, e.entry.key.to_string(), std::string(st.message())});
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
    fmt::print("{}\n", tier::json_text(j));
  else
    print_summary(j);
  return 0;
}

int run_verify(Store& s, bool json) {
  std::uint64_t bytes = 0;
  const auto bad = verify_objects(s, &bytes);
  if (json) {
    fmt::print("{}\n", tier::json_text(Json{{"objects", s.live.size()},
                                            {"bytes", bytes},
                                            {"bad_objects", bad.size()},
                                            {"bad", bad_json(bad)}}));
  } else {
    fmt::print("verified {} objects ({}): {} bad\n", s.live.size(), format_size(bytes), bad.size());
    for (const Bad& b : bad)
      fmt::print("  region {} record {} {}: {}\n", b.region, b.record, b.key, b.reason);
  }
  return bad.empty() ? 0 : 1;
}

// Flags of repair and format that name a geometry.
struct GeometryFlags {
  std::optional<std::uint64_t> capacity, region_size, block_size;
};

Result<Geometry> geometry_from_flags(const GeometryFlags& fl, std::uint64_t capacity) {
  Geometry g;
  g.block_size =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(fl.block_size.value_or(4096), 1u << 30));
  g.region_size = fl.region_size.value_or(16ull << 20);
  g.region_count = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(capacity / std::max<std::uint64_t>(g.region_size, 1), UINT32_MAX));
  if (std::string why = g.check(); !why.empty()) return Status::invalid(why);
  return g;
}

// The geometry of a store to repair: its superblock, else the data file's trailer, else the
// flags (a store formatted before the trailer existed). `*superblock_ok` says which.
Result<Geometry> repair_geometry(const StoreFiles& f, const GeometryFlags& fl,
                                 bool* superblock_ok) {
  *superblock_ok = false;
  if (f.index_bytes() > 0) {
    auto sb = read_superblock(f.index());
    if (sb) {
      *superblock_ok = true;
      return *sb;
    }
    if (!(sb.status() == Code::kNotFound)) return sb.status();
  }
  auto tr = read_data_trailer(f.data(), f.data_bytes());
  if (tr) return *tr;
  if (!(tr.status() == Code::kNotFound)) return tr.status();
  if (!fl.region_size)
    return Status(Code::kBadState,
                  fmt::format("{}: neither a valid superblock in `index` nor a geometry trailer "
                              "in `data`: not recognisably a disk tier store, so nothing is "
                              "changed. If it is one (formatted by an earlier version), name its "
                              "geometry with --region-size SIZE [--block-size SIZE]; `tierctl "
                              "disk format` makes a new store",
                              f.dir()));
  return geometry_from_flags(fl, f.data_bytes());
}

// The images of region `r` found in the data file, scanning block by block (an image's blocks
// are skipped once it checks), and skipping the holes of a sparse file (SEEK_DATA): the work is
// bounded by the bytes the file holds, not by the size a forged geometry claims. Reads at most
// kChunk bytes at a time into each buffer.
std::vector<Entry> images_in_region(const Store& s, std::uint32_t r, std::uint64_t seq,
                                    AlignedBuffer& window, AlignedBuffer& buf) {
  const Geometry& g = s.geo;
  std::vector<Entry> out;
  const std::uint64_t base = g.data_offset(r, 0);
  const std::uint64_t end = std::min<std::uint64_t>(
      base + g.region_size, s.files.data_bytes() / g.block_size * g.block_size);
  if (end <= base) return out;
  const std::uint64_t blocks = (end - base) / g.block_size;
  std::uint64_t win_first = 0, win_blocks = 0;
  for (std::uint64_t b = 0; b < blocks;) {
    if (b < win_first || b >= win_first + win_blocks) {
      const off_t data =
          ::lseek(s.files.data(), static_cast<off_t>(base + b * g.block_size), SEEK_DATA);
      if (data < 0 && errno == ENXIO) break;  // only holes from here to the end of the file
      if (data > 0) {
        const std::uint64_t at = (static_cast<std::uint64_t>(data) - base) / g.block_size;
        if (at >= blocks) break;
        b = std::max(b, at);
      }
      win_first = b;
      win_blocks = std::min<std::uint64_t>(kChunk / g.block_size, blocks - b);
      if (!pread_full(s.files.data(), window.data(), win_blocks * g.block_size,
                      base + b * g.block_size, "data")) {
        win_blocks = 0;
        ++b;
        continue;
      }
    }
    const std::byte* p = window.data() + (b - win_first) * g.block_size;
    std::uint32_t magic;
    std::memcpy(&magic, p, sizeof magic);
    if (magic == kObjectMagic) {
      const std::size_t in_window = (win_first + win_blocks - b) * g.block_size;
      auto h = check_image_at(s.files.data(), g, buf, base + b * g.block_size, base + g.region_size,
                              nullptr, 0, {p, in_window});
      const std::uint64_t image = h ? kObjectHeaderBytes + h->payload_bytes : 0;
      if (h && image <= UINT32_MAX) {
        out.push_back(Entry{h->key, seq, static_cast<std::uint32_t>(image),
                            static_cast<std::uint32_t>(b),
                            static_cast<std::uint32_t>(h->payload_checksum)});
        b += g.blocks_for(image);
        continue;
      }
    }
    ++b;
  }
  return out;
}

struct Rebuild {
  std::size_t regions = 0;  // directories rebuilt
  std::size_t objects = 0;  // images found for them
};

// Rebuilds the directory of every region whose directory is lost (truncated index) or whose
// header is damaged from the images in its part of the data file, each under a new generation;
// completes the files (index size, data size and trailer, superblock last).
Result<Rebuild> rebuild_index(Store& s, bool superblock_ok) {
  const Geometry& g = s.geo;
  const StoreFiles& f = s.files;
  Rebuild out;
  std::vector<std::uint32_t> to_rebuild = s.scan.lost_regions;
  to_rebuild.insert(to_rebuild.end(), s.scan.corrupt_regions.begin(), s.scan.corrupt_regions.end());
  std::sort(to_rebuild.begin(), to_rebuild.end());
  auto sys = [&](const char* what) {
    return Status::io_error(fmt::format("{}/{}: {}", f.dir(), what, std::strerror(errno)));
  };
  if (f.index_bytes() < g.index_file_bytes() &&
      ::ftruncate(f.index(), static_cast<off_t>(g.index_file_bytes())) != 0)
    return sys(kIndexFile);
  std::uint64_t seq = 0;
  for (const ScannedRegion& r : s.scan.regions) seq = std::max(seq, r.seq);
  AlignedBuffer window(kChunk, g.block_size), buf(kChunk, g.block_size);
  AlignedBuffer dir(g.dir_bytes(), g.block_size);
  cli::Progress bar("rebuild", to_rebuild.size());
  const std::uint64_t old_index_bytes = f.index_bytes();
  for (std::uint32_t r : to_rebuild) {
    std::memset(dir.data(), 0, dir.size());
    const std::vector<Entry> found = images_in_region(s, r, seq + 1, window, buf);
    if (!found.empty()) {
      ++seq;
      encode_region_header(dir.data(), RegionHeader{seq, r});
      for (std::size_t i = 0; i < found.size(); ++i)
        encode_entry(dir.data() + (i + 1) * kRecordBytes, found[i]);
      out.objects += found.size();
    }
    // An empty directory past the old end of the index is zeros already (ftruncate above).
    if (!found.empty() || g.dir_offset(r, 0) < old_index_bytes)
      TIER_RETURN_IF_ERROR(
          pwrite_full(f.index(), dir.data(), dir.size(), g.dir_offset(r, 0), "index"));
    ++out.regions;
    bar.update(out.regions);
  }
  if (::fsync(f.index()) != 0) return sys(kIndexFile);
  if (f.data_bytes() < g.data_file_bytes() &&
      ::ftruncate(f.data(), static_cast<off_t>(g.data_file_bytes())) != 0)
    return sys(kDataFile);
  if (f.data_bytes() != g.data_file_bytes_with_trailer())
    TIER_RETURN_IF_ERROR(write_data_trailer(f.data(), g));
  if (::fsync(f.data()) != 0) return sys(kDataFile);
  if (!superblock_ok) {
    AlignedBuffer sb(g.block_size, g.block_size);
    encode_superblock(sb.span(), g);
    TIER_RETURN_IF_ERROR(pwrite_full(f.index(), sb.data(), sb.size(), 0, "index superblock"));
    if (::fsync(f.index()) != 0) return sys(kIndexFile);
  }
  TIER_RETURN_IF_ERROR(s.files.refresh_sizes());
  return out;
}

int run_repair(const std::string& dir, const GeometryFlags& fl, bool json) {
  Store s;
  {
    auto f = open_files(dir, true, json, false, true);
    if (!f) return cli::fail(f.status().to_string());
    s.files = std::move(f).value();
  }
  bool superblock_ok = false;
  auto g = repair_geometry(s.files, fl, &superblock_ok);
  if (!g) {
    s.files.remove_created();  // an index made for a repair that cannot run
    return cli::fail(g.status().to_string());
  }
  s.geo = *g;
  if (!superblock_ok) {
    // Without a superblock every directory is checked as it is found: the data file's size
    // must hold the regions (scan_index refuses a geometry the files cannot hold).
    fmt::print(stderr,
               "note: {}: no valid superblock; using the geometry {} regions of {}, "
               "block {}\n",
               dir, s.geo.region_count, format_size(s.geo.region_size), s.geo.block_size);
  }
  if (Status st = analyse(s); !st) return cli::fail(st.to_string());
  auto rebuilt = rebuild_index(s, superblock_ok);
  if (!rebuilt) return cli::fail(rebuilt.status().to_string());
  if (Status st = analyse(s); !st) return cli::fail(st.to_string());

  std::uint64_t bytes = 0;
  const auto bad = verify_objects(s, &bytes);
  const Geometry& geo = s.geo;
  // Per region: the records to clear (record 0: the whole directory).
  std::map<std::uint32_t, std::vector<std::uint32_t>> clear;
  for (const Bad& b : bad) clear[b.region].push_back(b.record);
  for (std::size_t i : s.shadowed)
    clear[s.scan.entries[i].region].push_back(s.scan.entries[i].record);
  AlignedBuffer dirbuf(geo.dir_bytes(), geo.block_size);
  for (auto& [region, records] : clear) {
    Status rd = pread_full(s.files.index(), dirbuf.data(), dirbuf.size(), geo.dir_offset(region, 0),
                           "index");
    if (!rd) return cli::fail(rd.to_string());
    for (std::uint32_t record : records) {
      if (record == 0)
        std::memset(dirbuf.data(), 0, dirbuf.size());
      else
        std::memset(dirbuf.data() + std::size_t{record} * kRecordBytes, 0, kRecordBytes);
    }
    Status st = pwrite_full(s.files.index(), dirbuf.data(), dirbuf.size(),
                            geo.dir_offset(region, 0), "index");
    if (!st) return cli::fail(st.to_string());
  }
  if (::fsync(s.files.index()) != 0) return cli::fail("fsync of the index failed");
  const std::size_t dropped = bad.size() + s.shadowed.size();
  const std::size_t before = s.live.size();
  // The repaired index, as the tier will see it.
  if (Status st = analyse(s); !st) return cli::fail(st.to_string());
  const std::size_t after = s.live.size();
  if (json) {
    fmt::print("{}\n", tier::json_text(Json{{"objects", before},
                                            {"rebuilt_regions", rebuilt->regions},
                                            {"recovered_objects", rebuilt->objects},
                                            {"bad_objects", bad.size()},
                                            {"dropped_entries", dropped},
                                            {"objects_after", after},
                                            {"bad", bad_json(bad)}}));
  } else {
    if (rebuilt->regions > 0)
      fmt::print("rebuilt the directories of {} regions from the data file: {} objects found\n",
                 rebuilt->regions, rebuilt->objects);
    fmt::print("checked {} objects: dropped {} bad and {} shadowed entries; {} objects remain\n",
               before, bad.size(), s.shadowed.size(), after);
  }
  return 0;
}

// Makes an empty store in `dir` (created when missing): the geometry of the flags, else the one
// the store already names. Refuses symbolic links and another user's files like the tier does.
int run_format(const std::string& dir, const GeometryFlags& fl, bool json) {
  auto f = open_files(dir, true, json, true);
  if (!f) return cli::fail(f.status().to_string());
  Result<Geometry> g = Status::not_found();
  if (fl.capacity) {
    g = geometry_from_flags(fl, *fl.capacity);
  } else {
    bool superblock_ok = false;
    g = repair_geometry(*f, GeometryFlags{}, &superblock_ok);
    if (!g)
      return cli::fail(fmt::format("{}: name the new store's size with --capacity SIZE "
                                   "[--region-size SIZE] [--block-size SIZE]",
                                   dir),
                       2);
  }
  if (!g) return cli::fail(g.status().to_string(), 2);
  if (Status st = format_store(*f, *g, false); !st) return cli::fail(st.to_string());
  if (json)
    fmt::print("{}\n", tier::json_text(Json{{"path", dir},
                                            {"regions", g->region_count},
                                            {"region_size", g->region_size},
                                            {"block_size", g->block_size}}));
  else
    fmt::print("formatted {}: {} regions of {}, block {}\n", dir, g->region_count,
               format_size(g->region_size), g->block_size);
  return 0;
}

int run_disk(cli::Args& args) {
  const bool json = args.flag("json");
  GeometryFlags fl;
  fl.capacity = args.size("capacity");
  fl.region_size = args.size("region-size");
  fl.block_size = args.size("block-size");
  args.finish();
  const auto& pos = args.positional();
  constexpr const char* kUsage =
      "usage: tierctl disk inspect|verify DIR [--json]\n"
      "       tierctl disk repair DIR [--region-size SIZE] [--block-size SIZE] [--json]\n"
      "       tierctl disk format DIR [--capacity SIZE [--region-size SIZE] [--block-size SIZE]] "
      "[--json]";
  if (pos.size() != 2) return cli::fail(kUsage, 2);
  const std::string& cmd = pos[0];
  const std::string& dir = pos[1];
  if (cmd == "format") return run_format(dir, fl, json);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return cli::fail(fmt::format("{}: not a directory", dir), 2);
  if (cmd == "repair") {
    if (fl.capacity) return cli::fail(kUsage, 2);
    return run_repair(dir, fl, json);
  }
  if ((cmd != "inspect" && cmd != "verify") || fl.capacity || fl.region_size || fl.block_size)
    return cli::fail(kUsage, 2);
  auto store = load_store(dir, json);
  if (!store) {
    if (store.status() == Code::kNotFound)
      return cli::fail(
          fmt::format("{}: not a disk tier store ({}); if it is one whose index was "
                      "lost, `tierctl disk repair {}` rebuilds it",
                      dir, store.status().message(), dir));
    return cli::fail(store.status().to_string());
  }
  if (cmd == "inspect") return run_inspect(*store, json);
  return run_verify(*store, json);
}

}  // namespace
}  // namespace tier::disk

TIER_CLI_COMMAND(disk, "disk inspect|verify|repair|format DIR [--json]",
                 "disk tier store: summary; full checksum verification (exit 1 when anything "
                 "is bad); repair (rebuilds lost directories from the data file, drops bad "
                 "objects; the tier must be stopped); format (a new, empty store)",
                 tier::disk::run_disk);
