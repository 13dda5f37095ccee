#include "disk_backend.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "tier/object.hpp"
#include "tier/options.hpp"

namespace tier::disk {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kFixedData = 0;  // registered file indexes
constexpr int kFixedIndex = 1;

std::uint32_t ring_size_for(std::uint32_t depth) {
  std::uint32_t n = 8;
  while (n < 2 * depth) n <<= 1;
  return n;
}

bool is_no_space(int err) { return err == ENOSPC || err == EFBIG || err == EDQUOT; }

}  // namespace

Result<DiskOptions> parse_disk_options(const BackendContext& ctx) {
  DiskOptions o;
  const Json& j = ctx.options;
  o.path = j.value("path", std::string());
  if (o.path.empty()) return Status::invalid("the disk tier needs a path");
  o.capacity = ctx.capacity_bytes;
  o.region_size = j.value("region_size", o.region_size);
  o.block_size = static_cast<std::uint32_t>(j.value("block_size", std::uint64_t{o.block_size}));
  o.queue_depth = static_cast<std::uint32_t>(j.value("queue_depth", std::uint64_t{o.queue_depth}));
  o.durable = j.value("durable", o.durable);
  o.preallocate = j.value("preallocate", o.preallocate);
  const std::string mode = j.value("mode", std::string("0600"));
  if (mode == "0600")
    o.mode = 0600;
  else if (mode == "0640")
    o.mode = 0640;
  else if (mode == "0644")
    o.mode = 0644;
  else
    return Status::invalid(
        fmt::format("mode \"{}\" is not one of \"0600\", \"0640\", \"0644\"", mode));
  o.lock_timeout_ms = static_cast<std::uint32_t>(
      j.value("lock_timeout", std::uint64_t{o.lock_timeout_ms} * 1000) / 1000);
  if (o.queue_depth == 0) return Status::invalid("queue_depth must be at least 1");
  return o;
}

Result<std::unique_ptr<DiskBackend>> DiskBackend::create(const BackendContext& ctx) {
  TIER_ASSIGN_OR_RETURN(DiskOptions opts, parse_disk_options(ctx));
  return open(ctx.tier_name, opts);
}

Result<std::unique_ptr<DiskBackend>> DiskBackend::open(const std::string& tier_name,
                                                       const DiskOptions& opts) {
  Geometry g;
  g.block_size = opts.block_size;
  g.region_size = opts.region_size;
  g.region_count = opts.region_size == 0 ? 0
                                         : static_cast<std::uint32_t>(std::min<std::uint64_t>(
                                               opts.capacity / opts.region_size, UINT32_MAX));
  if (std::string why = g.check(); !why.empty())
    return Status::invalid(fmt::format("disk tier \"{}\": {}", tier_name, why));
  OpenOptions oo;
  oo.create = true;
  oo.dsync = opts.durable;
  oo.mode = opts.mode;
  oo.lock_wait_ms = static_cast<int>(opts.lock_timeout_ms);
  ignore_sigxfsz();
  TIER_ASSIGN_OR_RETURN(StoreFiles files, open_store(opts.path, oo));
  std::unique_ptr<DiskBackend> b(new DiskBackend(tier_name, opts, g, std::move(files)));
  // The ring first: a kernel that refuses io_uring must not cost the store its contents.
  TIER_RETURN_IF_ERROR(b->init_ring());
  TIER_RETURN_IF_ERROR(b->adopt_store());
  TIER_RETURN_IF_ERROR(b->recover());
  return b;
}

// Formats the store only when its files are recognisably this tier's: both empty (just created,
// or a crash before the first format), a formatting superblock (a crash while formatting), or a
// valid superblock of another geometry (the profile changed). Anything else is refused, never
// overwritten: a truncated or unreadable index is for `tierctl disk repair`, foreign files are
// left alone.
Status DiskBackend::adopt_store() {
  const std::string& dir = files_.dir();
  bool formatting = false;
  auto sb = files_.index_bytes() == 0
                ? Result<Geometry>(Status::not_found())
                : read_superblock(files_.index(), geo_.block_size, &formatting);
  if (!sb && !(sb.status() == Code::kNotFound)) return sb.status();
  const bool empty = files_.index_bytes() == 0 && files_.data_bytes() == 0;
  if (!sb && !empty && !formatting) {
    files_.remove_created();
    if (files_.index_bytes() == 0)
      return Status(Code::kBadState,
                    fmt::format("{}: `{}` holds {} bytes but there is no index; refusing to "
                                "overwrite it. If this is a disk tier store whose index was lost, "
                                "`tierctl disk repair {}` rebuilds it; `tierctl disk format {}` "
                                "makes a new store (dropping what the files hold)",
                                dir, kDataFile, files_.data_bytes(), dir, dir));
    return Status(Code::kBadState,
                  fmt::format("{}: `{}` is not a disk tier index (no valid superblock); refusing "
                              "to overwrite it or `{}`. If this is a damaged store, `tierctl disk "
                              "repair {}` rebuilds the index from the data file; `tierctl disk "
                              "format {}` makes a new store (dropping what the files hold)",
                              dir, kIndexFile, kDataFile, dir, dir));
  }
  if (!sb || !(*sb == geo_)) {
    TIER_RETURN_IF_ERROR(format_store(files_, geo_, opts_.preallocate));
    stats_.formatted = true;
  } else {
    TIER_RETURN_IF_ERROR(check_file_sizes(dir, geo_, files_.index_bytes(), files_.data_bytes()));
    // A store formatted before the data file had its trailer gets one (the file grows a block).
    if (files_.data_bytes() == geo_.data_file_bytes())
      TIER_RETURN_IF_ERROR(write_data_trailer(files_.data(), geo_));
  }
  // Recognised as ours: the files get the configured mode (a store of an earlier version was
  // created 0644).
  if (::fchmod(files_.index(), opts_.mode) != 0 || ::fchmod(files_.data(), opts_.mode) != 0)
    return Status::io_error(fmt::format("{}: chmod: {}", dir, std::strerror(errno)));
  return Status::ok();
}

DiskBackend::DiskBackend(std::string tier_name, const DiskOptions& opts, const Geometry& g,
                         StoreFiles files)
    : Backend(std::move(tier_name)), opts_(opts), geo_(g), files_(std::move(files)) {}

DiskBackend::~DiskBackend() {
  if (!ring_ready_) return;
  // Requests still in the ring reference buffers and regions: let them finish (bounded).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((ring_inflight_ > 0 || !backlog_.empty()) && Clock::now() < deadline) {
    reap();
    pump();
    if (ring_inflight_ == 0) continue;
    __kernel_timespec ts{0, 10'000'000};
    io_uring_cqe* cqe = nullptr;
    (void)io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
  }
  if (fixed_files_) (void)io_uring_unregister_files(&ring_);
  if (registered_buffers_) (void)io_uring_unregister_buffers(&ring_);
  io_uring_queue_exit(&ring_);
}

Status DiskBackend::init_ring() {
  ring_entries_ = ring_size_for(opts_.queue_depth);
  io_uring_params p{};
  p.flags = IORING_SETUP_COOP_TASKRUN;
  int rc = io_uring_queue_init_params(ring_entries_, &ring_, &p);
  if (rc == -EINVAL) {  // kernels before 5.19 lack COOP_TASKRUN
    p = io_uring_params{};
    rc = io_uring_queue_init_params(ring_entries_, &ring_, &p);
  }
  if (rc < 0)
    return Status(Code::kNotSupported,
                  fmt::format("disk tier \"{}\": the kernel refused io_uring ({}): it may be too "
                              "old (5.6+ needed), disabled (/proc/sys/kernel/io_uring_disabled, "
                              "seccomp in containers) or short of locked memory (ulimit -l)",
                              tier_name(), std::strerror(-rc)));
  ring_ready_ = true;
  io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
  bool ops_ok = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ) &&
                io_uring_opcode_supported(probe, IORING_OP_WRITE);
  bool write_fixed = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!ops_ok)
    return Status(Code::kNotSupported,
                  fmt::format("disk tier \"{}\": io_uring lacks IORING_OP_READ/WRITE (kernel "
                              "5.6+ needed)",
                              tier_name()));
  (void)io_uring_ring_dontfork(&ring_);  // a forked child must not see the rings' memory
  int fds[2] = {files_.data(), files_.index()};
  // Registered files also tie the lock's lifetime to the ring's in-flight I/O (OpenOptions).
  rc = io_uring_register_files(&ring_, fds, 2);
  if (rc < 0)
    return Status(Code::kNotSupported, fmt::format("disk tier \"{}\": io_uring cannot register "
                                                   "files ({})",
                                                   tier_name(), std::strerror(-rc)));
  fixed_files_ = true;

  // Directory blocks are written from a registered pool (WRITE_FIXED skips the page pinning).
  const std::size_t n = ring_entries_;
  const std::size_t bs = geo_.block_size;
  void* pool = std::aligned_alloc(bs, n * bs);
  if (pool == nullptr) return Status(Code::kNoSpace, "out of memory for directory buffers");
  std::memset(pool, 0, n * bs);
  dir_pool_ =
      std::unique_ptr<std::byte[], void (*)(void*)>(static_cast<std::byte*>(pool), &std::free);
  std::vector<iovec> iov(n);
  for (std::size_t i = 0; i < n; ++i) iov[i] = iovec{dir_pool_.get() + i * bs, bs};
  registered_buffers_ =
      write_fixed && io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(n)) == 0;
  for (std::size_t i = 0; i < n; ++i)
    free_dir_bufs_.push_back(
        DirBuffer{dir_pool_.get() + i * bs, registered_buffers_ ? static_cast<int>(i) : -1});
  return Status::ok();
}

Status DiskBackend::recover() {
  const auto t0 = Clock::now();
  TIER_ASSIGN_OR_RETURN(ScanResult scan, scan_index(files_.index(), geo_, geo_.index_file_bytes(),
                                                    geo_.data_file_bytes()));
  regions_.assign(geo_.region_count, DiskRegion{});
  std::vector<std::uint32_t> used;
  for (std::uint32_t r = 0; r < geo_.region_count; ++r) {
    if (!scan.regions[r].in_use) continue;
    DiskRegion& R = regions_[r];
    R.state = RegionState::kReady;
    R.seq = scan.regions[r].seq;
    R.records.resize(1);
    next_seq_ = std::max(next_seq_, R.seq + 1);
    used.push_back(r);
  }
  for (const ScannedEntry& e : scan.entries) {
    DiskRegion& R = regions_[e.region];
    if (R.records.size() <= e.record) R.records.resize(e.record + 1);
    R.records[e.record] = Record{e.entry.key, e.entry.offset_blocks, e.entry.image_bytes,
                           e.entry.payload_check, RecordState::kLive};
    R.write_blocks = std::max<std::uint32_t>(
        R.write_blocks,
        e.entry.offset_blocks + static_cast<std::uint32_t>(geo_.blocks_for(e.entry.image_bytes)));
  }
  // Oldest generation first, so that of two copies of a key (a crash between a remove and a new
  // put of it) the newer one wins.
  std::sort(used.begin(), used.end(),
            [&](std::uint32_t a, std::uint32_t b) { return regions_[a].seq < regions_[b].seq; });
  index_.reserve(scan.entries.size());
  for (std::uint32_t r : used) {
    DiskRegion& R = regions_[r];
    for (std::uint32_t s = 1; s < R.records.size(); ++s) {
      Record& sl = R.records[s];
      if (sl.state != RecordState::kLive) continue;
      auto [it, fresh] = index_.try_emplace(sl.key, Location{r, s});
      if (!fresh) {
        Record& old = regions_[it->second.region].records[it->second.record];
        old.state = RecordState::kDead;
        used_bytes_ -= geo_.blocks_for(old.image_bytes) * geo_.block_size;
        it->second = Location{r, s};
      }
      used_bytes_ += geo_.blocks_for(sl.image_bytes) * geo_.block_size;
    }
  }
  // The newest region keeps receiving appends; the others are sealed.
  if (!used.empty()) {
    open_ = used.back();
    used.pop_back();
  }
  // Recency after a restart: the regions' age.
  for (std::uint32_t r : used) regions_[r].touched = ++clock_;
  if (open_ >= 0) regions_[static_cast<std::size_t>(open_)].touched = ++clock_;
  sealed_.assign(used.begin(), used.end());
  for (std::uint32_t r = 0; r < geo_.region_count; ++r)
    if (!scan.regions[r].in_use) free_.push_back(r);
  stats_.recovered_objects = index_.size();
  stats_.recovery_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return Status::ok();
}

Capabilities DiskBackend::capabilities() const noexcept {
  Capabilities c;
  c.memory_kinds = kHostKinds;
  c.io_alignment = geo_.block_size;
  c.max_object_bytes = geo_.region_size;
  c.persistent = true;
  return c;
}

Usage DiskBackend::usage() const noexcept {
  return Usage{geo_.data_file_bytes(), used_bytes_, index_.size()};
}

std::string DiskBackend::describe() const {
  return fmt::format(
      "disk tier \"{}\" at {}: {} objects, {} of {} used, {} regions of {}, block {}, queue depth "
      "{}{}{}; {} {} objects in {:.1f} ms",
      tier_name(), opts_.path, index_.size(), format_size(used_bytes_),
      format_size(geo_.data_file_bytes()), geo_.region_count, format_size(geo_.region_size),
      geo_.block_size, opts_.queue_depth, registered_buffers_ ? ", registered buffers" : "",
      opts_.durable ? ", O_DSYNC" : "", stats_.formatted ? "formatted; indexed" : "recovered",
      stats_.recovered_objects, stats_.recovery_ms);
}

// ---- requests ---------------------------------------------------------------------------------

void DiskBackend::complete(std::uint64_t user_data, Status s, std::size_t bytes) {
  ready_.push_back(Completion{user_data, std::move(s), bytes});
}

Status DiskBackend::error_status(int err, const char* what) {
  const bool full = is_no_space(err);
  ++(full ? stats_.no_space : stats_.io_errors);
  return Status(full ? Code::kNoSpace : Code::kIoError,
                fmt::format("disk tier \"{}\": {}: {}", tier_name(), what, std::strerror(err)));
}

Result<std::size_t> DiskBackend::do_submit(std::span<const IoRequest> reqs) noexcept {
  std::size_t i = 0;
  try {
    for (; i < reqs.size(); ++i) {
      const IoRequest& r = reqs[i];
      if (r.op == Op::kContains) {
        auto it = index_.find(r.key);
        if (it == index_.end())
          complete(r.user_data, Status::not_found(), 0);
        else
          complete(r.user_data, Status::ok(),
                   regions_[it->second.region].records[it->second.record].image_bytes);
        continue;
      }
      if (user_inflight_ >= opts_.queue_depth) break;  // full: the caller polls and retries
      switch (r.op) {
        case Op::kPut:
          accept_put(r);
          break;
        case Op::kGet:
          accept_get(r);
          break;
        case Op::kRemove:
          accept_remove(r);
          break;
        case Op::kContains:
          break;
      }
    }
    place_puts();
    pump();
  } catch (const std::bad_alloc&) {
    // Requests before `i` are accepted and complete normally; the rest can be retried.
    return i;
  }
  return i;
}

void DiskBackend::accept_put(const IoRequest& r) {
  if (auto it = index_.find(r.key); it != index_.end()) {
    regions_[it->second.region].touched = ++clock_;
    complete(r.user_data, Status(Code::kAlreadyExists, ""),
             regions_[it->second.region].records[it->second.record].image_bytes);
    return;
  }
  if (writing_.count(r.key) != 0) {
    complete(r.user_data, Status(Code::kAlreadyExists, "a put of this key is in flight"), 0);
    return;
  }
  auto h = parse_object_header(r.buf.bytes());  // checked by Backend::submit already
  if (!h) {
    complete(r.user_data, h.status(), 0);
    return;
  }
  const std::uint64_t image = kObjectHeaderBytes + h->payload_bytes;
  writing_.insert(r.key);
  ++user_inflight_;
  unplaced_.push_back(PutWait{r.user_data, r.key, r.buf.data, static_cast<std::uint32_t>(image),
                              static_cast<std::uint32_t>(h->payload_checksum)});
}

std::optional<DiskBackend::Location> DiskBackend::locate_or_complete(const IoRequest& r) {
  auto it = index_.find(r.key);
  if (it != index_.end()) return it->second;
  complete(r.user_data, Status::not_found(), 0);
  return std::nullopt;
}

void DiskBackend::accept_get(const IoRequest& r) {
  auto found = locate_or_complete(r);
  if (!found) return;
  const Location loc = *found;
  const Record& s = regions_[loc.region].records[loc.record];
  regions_[loc.region].touched = ++clock_;
  const std::uint64_t need = geo_.blocks_for(s.image_bytes) * geo_.block_size;
  if (r.buf.size < need) {
    complete(r.user_data,
             Status::invalid(fmt::format("get buffer of {} bytes is too small for {} (the image "
                                         "rounded up to the {}-byte block)",
                                         r.buf.size, need, geo_.block_size)),
             need);
    return;
  }
  std::uint32_t id = new_io(IoKind::kRead, loc.region);
  Io& io = ios_[id];
  io.record = loc.record;
  io.buf = r.buf.data;
  io.offset = geo_.data_offset(loc.region, s.offset_blocks);
  io.len = static_cast<std::uint32_t>(need);
  io.user_data = r.user_data;
  ++user_inflight_;
  queue_io(id);
}

void DiskBackend::accept_remove(const IoRequest& r) {
  auto found = locate_or_complete(r);
  if (!found) return;
  const Location loc = *found;
  Record& s = regions_[loc.region].records[loc.record];
  s.state = RecordState::kDead;
  used_bytes_ -= geo_.blocks_for(s.image_bytes) * geo_.block_size;
  index_.erase(r.key);
  ++user_inflight_;
  schedule_dir(loc.region, loc.record / geo_.records_per_block(),
               Waiter{WaitKind::kRemove, r.user_data, loc.record});
}

// Gives every accepted put a place in the open region, opening (and if need be evicting) regions.
// A put waits here only while every region that could be evicted still has I/O in flight.
void DiskBackend::place_puts() {
  while (!unplaced_.empty()) {
    const PutWait& p = unplaced_.front();
    const auto blocks = static_cast<std::uint32_t>(geo_.blocks_for(p.image_bytes));
    if (open_ >= 0) {
      const auto r = static_cast<std::uint32_t>(open_);
      DiskRegion& R = regions_[r];
      if (R.write_blocks + blocks <= geo_.region_blocks() && R.records.size() < geo_.dir_records()) {
        const auto record = static_cast<std::uint32_t>(R.records.size());
        R.records.push_back(
            Record{p.key, R.write_blocks, p.image_bytes, p.payload_check, RecordState::kWriting});
        std::uint32_t id = new_io(IoKind::kWrite, r);
        Io& io = ios_[id];
        io.record = record;
        io.buf = p.buf;
        io.offset = geo_.data_offset(r, R.write_blocks);
        io.len = blocks * geo_.block_size;
        io.user_data = p.user_data;
        R.write_blocks += blocks;
        if (R.state == RegionState::kReady)
          queue_io(id);
        else
          R.waiting.push_back(id);
        unplaced_.pop_front();
        continue;
      }
      sealed_.push_back(r);  // full
      open_ = -1;
    }
    if (spare_ >= 0) {
      open_ = spare_;
      spare_ = -1;
      continue;
    }
    auto next = take_region();
    if (!next) break;
    open_ = *next;
  }
  prepare_spare();
}

// A region for a new generation, its header write started: a free one, else the least recently
// used sealed region without I/O in flight, evicted. None when every candidate has I/O in flight
// (release_io retries when a region's I/O drains).
std::optional<std::uint32_t> DiskBackend::take_region() {
  if (!free_.empty()) {
    const std::uint32_t r = free_.front();
    free_.pop_front();
    begin_reset(r);
    return r;
  }
  if (leases_.active() > 0) metrics().lease_expiries.add(leases_.expire(Clock::now(), unlease()));
  auto victim_it = sealed_.end();
  for (auto it = sealed_.begin(); it != sealed_.end(); ++it)
    if (regions_[*it].pending == 0 && regions_[*it].leased == 0 &&
        (victim_it == sealed_.end() || regions_[*it].touched < regions_[*victim_it].touched))
      victim_it = it;
  if (victim_it == sealed_.end()) return std::nullopt;
  const std::uint32_t victim = *victim_it;
  sealed_.erase(victim_it);
  evict_region(victim);
  begin_reset(victim);
  return victim;
}

// Once the open region is half full, the next one is readied (evicted if need be, its header
// written), so that appends never wait for a header write. It costs at most one region of
// capacity, so only stores of kSpareMinRegions regions or more do it.
void DiskBackend::prepare_spare() {
  if (spare_ >= 0 || open_ < 0 || geo_.region_count < kSpareMinRegions) return;
  if (regions_[static_cast<std::size_t>(open_)].write_blocks < geo_.region_blocks() / 2) return;
  if (auto r = take_region()) spare_ = *r;
}

void DiskBackend::evict_region(std::uint32_t r) {
  DiskRegion& R = regions_[r];
  ++stats_.region_evictions;
  for (std::uint32_t s = 1; s < R.records.size(); ++s) {
    Record& sl = R.records[s];
    if (sl.state != RecordState::kLive) continue;
    index_.erase(sl.key);
    used_bytes_ -= geo_.blocks_for(sl.image_bytes) * geo_.block_size;
    sl.state = RecordState::kDead;
    notify_evicted(sl.key, {}, sl.image_bytes);
  }
  R.records.clear();
  R.state = RegionState::kFree;
}

// A new generation: the header (with the new sequence number, no entries) must be on disk before
// any image of the generation is written, so that no entry of an earlier one can name them.
void DiskBackend::begin_reset(std::uint32_t r) {
  DiskRegion& R = regions_[r];
  R.seq = next_seq_++;
  R.write_blocks = 0;
  R.records.assign(1, Record{});
  R.state = RegionState::kResetting;
  R.touched = ++clock_;
  schedule_dir(r, 0, Waiter{WaitKind::kReset, 0, 0});
}

// ---- directory writes ------------------------------------------------------------------------

void DiskBackend::schedule_dir(std::uint32_t region, std::uint32_t block, Waiter w) {
  DirBlock& db = dir_blocks_[block_key(region, block)];
  db.next.push_back(w);
  if (!db.in_flight) start_dir_write(region, block);
}

// At most one write per directory block is in flight (two could land in either order); waiters
// that arrive meanwhile ride on the next write, which then carries every entry ready by then.
void DiskBackend::start_dir_write(std::uint32_t region, std::uint32_t block) {
  DirBlock& db = dir_blocks_[block_key(region, block)];
  db.in_flight = true;
  db.flying.swap(db.next);
  db.next.clear();
  DirBuffer b = take_dir_buffer();
  fill_dir_block(region, block, b.data);
  std::uint32_t id = new_io(IoKind::kDir, region);
  Io& io = ios_[id];
  io.record = block;
  io.buf = b.data;
  io.fixed_buf = b.fixed;
  io.offset = geo_.dir_offset(region, block);
  io.len = geo_.block_size;
  ++stats_.dir_writes;
  queue_io(id);
}

void DiskBackend::fill_dir_block(std::uint32_t region, std::uint32_t block, std::byte* out) const {
  std::memset(out, 0, geo_.block_size);
  const DiskRegion& R = regions_[region];
  const std::uint32_t per = geo_.records_per_block();
  for (std::uint32_t i = 0; i < per; ++i) {
    const std::uint32_t s = block * per + i;
    if (s >= geo_.dir_records()) break;
    std::byte* p = out + std::size_t{i} * kRecordBytes;
    if (s == 0) {
      encode_region_header(p, RegionHeader{R.seq, region});
      continue;
    }
    if (s >= R.records.size()) break;
    const Record& sl = R.records[s];
    if (sl.state == RecordState::kLive || sl.state == RecordState::kPublishing)
      encode_entry(p, Entry{sl.key, R.seq, sl.image_bytes, sl.offset_blocks, sl.payload_check});
  }
}

void DiskBackend::finish_dir(std::uint32_t region, std::uint32_t block, int err) {
  std::vector<Waiter> flying;
  {
    DirBlock& db = dir_blocks_[block_key(region, block)];
    flying.swap(db.flying);
    db.in_flight = false;
  }
  DiskRegion& R = regions_[region];
  for (const Waiter& w : flying) {
    switch (w.kind) {
      case WaitKind::kPublish: {
        Record& s = R.records[w.record];
        writing_.erase(s.key);
        --user_inflight_;
        if (err == 0) {
          s.state = RecordState::kLive;
          index_[s.key] = Location{region, w.record};
          used_bytes_ += geo_.blocks_for(s.image_bytes) * geo_.block_size;
          complete(w.user_data, Status::ok(), s.image_bytes);
        } else {
          s.state = RecordState::kDead;
          complete(w.user_data, error_status(err, "directory write"), 0);
        }
        break;
      }
      case WaitKind::kRemove:
        --user_inflight_;
        // On failure the object stays removed here; it may reappear after a restart.
        complete(w.user_data, err == 0 ? Status::ok() : error_status(err, "directory write"), 0);
        break;
      case WaitKind::kReset: {
        std::vector<std::uint32_t> waiting;
        waiting.swap(R.waiting);
        if (err == 0) {
          R.state = RegionState::kReady;
          for (std::uint32_t id : waiting) queue_io(id);
          break;
        }
        // The old generation may still be on disk, intact (none of the new writes was issued).
        Status s = error_status(err, "region header write");
        for (std::uint32_t id : waiting) {
          Record& sl = R.records[ios_[id].record];
          sl.state = RecordState::kDead;
          writing_.erase(sl.key);
          --user_inflight_;
          complete(ios_[id].user_data, s, 0);
        }
        R.state = RegionState::kFree;
        R.records.clear();
        if (open_ == static_cast<std::int64_t>(region)) open_ = -1;
        if (spare_ == static_cast<std::int64_t>(region)) spare_ = -1;
        sealed_.erase(std::remove(sealed_.begin(), sealed_.end(), region), sealed_.end());
        free_.push_back(region);
        // Last: releasing may place waiting puts, which must find the region's new state.
        for (std::uint32_t id : waiting) release_io(id);
        break;
      }
    }
  }
  auto it = dir_blocks_.find(block_key(region, block));
  if (it == dir_blocks_.end()) return;
  if (!it->second.next.empty())
    start_dir_write(region, block);
  else if (!it->second.in_flight)
    dir_blocks_.erase(it);
}

DiskBackend::DirBuffer DiskBackend::take_dir_buffer() {
  if (free_dir_bufs_.empty()) {
    extra_dir_bufs_.emplace_back(geo_.block_size, geo_.block_size);
    return DirBuffer{extra_dir_bufs_.back().data(), -1};
  }
  DirBuffer b = free_dir_bufs_.back();
  free_dir_bufs_.pop_back();
  return b;
}

// ---- the ring --------------------------------------------------------------------------------

std::uint32_t DiskBackend::new_io(IoKind kind, std::uint32_t region) {
  std::uint32_t id;
  if (!free_ios_.empty()) {
    id = free_ios_.back();
    free_ios_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(ios_.size());
    ios_.emplace_back();
  }
  ios_[id] = Io{};
  ios_[id].kind = kind;
  ios_[id].region = region;
  ++regions_[region].pending;
  return id;
}

void DiskBackend::release_io(std::uint32_t id) {
  DiskRegion& R = regions_[ios_[id].region];
  --R.pending;
  free_ios_.push_back(id);
  if (R.pending == 0 && !unplaced_.empty()) place_puts();
}

// Moves queued I/O into submission queue entries, as many as the ring has room for, then
// submits them with one system call.
void DiskBackend::pump() {
  unsigned queued = 0;
  while (!backlog_.empty() && ring_inflight_ < ring_entries_) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      (void)io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
    }
    const std::uint32_t id = backlog_.front();
    backlog_.pop_front();
    const Io& io = ios_[id];
    const bool to_index = io.kind == IoKind::kDir;
    const int fd = fixed_files_ ? (to_index ? kFixedIndex : kFixedData)
                                : (to_index ? files_.index() : files_.data());
    std::byte* p = io.buf + io.done;
    const unsigned n = io.len - io.done;
    const std::uint64_t off = io.offset + io.done;
    if (io.kind == IoKind::kRead)
      io_uring_prep_read(sqe, fd, p, n, off);
    else if (io.fixed_buf >= 0)
      io_uring_prep_write_fixed(sqe, fd, p, n, off, io.fixed_buf);
    else
      io_uring_prep_write(sqe, fd, p, n, off);
    if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, id);
    ++ring_inflight_;
    ++queued;
  }
  // A failed submit leaves the entries in the queue; every later call submits them again.
  if (queued > 0 || io_uring_sq_ready(&ring_) > 0) (void)io_uring_submit(&ring_);
}

// Consumes every completion available, errors included, and advances the queue past all of them.
void DiskBackend::reap() {
  unsigned head;
  unsigned seen = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    on_cqe(static_cast<std::uint32_t>(io_uring_cqe_get_data64(cqe)), cqe->res);
    ++seen;
  }
  if (seen > 0) io_uring_cq_advance(&ring_, seen);
}

void DiskBackend::on_cqe(std::uint32_t id, int res) {
  --ring_inflight_;
  Io& io = ios_[id];
  if (res == -EAGAIN || res == -EINTR) {
    ++stats_.resubmits;
    queue_io(id);
    return;
  }
  if (res < 0) {
    finish_io(id, -res);
    return;
  }
  if (res == 0) {  // no progress: the file is shorter than its geometry says
    finish_io(id, EIO);
    return;
  }
  io.done += static_cast<std::uint32_t>(res);
  if (io.done < io.len) {  // short transfer: continue where it stopped
    ++stats_.resubmits;
    queue_io(id);
    return;
  }
  finish_io(id, 0);
}

void DiskBackend::finish_io(std::uint32_t id, int err) {
  const Io io = ios_[id];
  DiskRegion& R = regions_[io.region];
  switch (io.kind) {
    case IoKind::kRead:
      --user_inflight_;
      if (err != 0)
        complete(io.user_data, error_status(err, "read"), 0);
      else
        complete(io.user_data, Status::ok(), R.records[io.record].image_bytes);
      break;
    case IoKind::kWrite: {
      Record& s = R.records[io.record];
      if (err != 0) {
        s.state = RecordState::kDead;
        writing_.erase(s.key);
        --user_inflight_;
        complete(io.user_data, error_status(err, "write"), 0);
        break;
      }
      ++stats_.data_writes;
      s.state = RecordState::kPublishing;
      schedule_dir(io.region, io.record / geo_.records_per_block(),
                   Waiter{WaitKind::kPublish, io.user_data, io.record});
      break;
    }
    case IoKind::kDir:
      free_dir_bufs_.push_back(DirBuffer{io.buf, io.fixed_buf});
      finish_dir(io.region, io.record, err);
      break;
  }
  release_io(id);
}

LeaseTable::OnEnd DiskBackend::unlease() {
  return [this](const LeaseTable::Hold& h) { --regions_[h.tag].leased; };
}

Result<LeaseId> DiskBackend::do_lease(std::span<const ObjectKey> keys,
                                      std::chrono::milliseconds ttl,
                                      std::span<std::uint8_t> held) noexcept {
  try {
    const auto now = Clock::now();
    metrics().lease_expiries.add(leases_.expire(now, unlease()));
    std::vector<LeaseTable::Hold> holds;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto it = index_.find(keys[i]);
      if (it == index_.end()) continue;
      held[i] = 1;
      ++regions_[it->second.region].leased;
      holds.push_back({keys[i], it->second.region});
    }
    return leases_.add(now + ttl, std::move(holds));
  } catch (const std::bad_alloc&) {
    return Status(Code::kBadState, "lease: out of memory");
  }
}

LeaseEnd DiskBackend::do_release(LeaseId id) noexcept {
  const LeaseEnd end = leases_.end(id, Clock::now(), unlease());
  if (end != LeaseEnd::kUnknown && !unplaced_.empty()) {
    try {
      place_puts();  // a region may be free now
    } catch (const std::bad_alloc&) {
      // The next submit or poll places them.
    }
  }
  return end;
}

Result<std::size_t> DiskBackend::do_poll(std::span<Completion> out, std::size_t min,
                                         std::chrono::microseconds wait) noexcept {
  const auto deadline = Clock::now() + wait;
  try {
    for (;;) {
      reap();
      place_puts();
      pump();
      if (ready_.size() >= min || ready_.size() >= out.size()) break;
      if (ring_inflight_ == 0) break;  // nothing left that could complete
      const auto now = Clock::now();
      if (now >= deadline) break;
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
      __kernel_timespec ts{static_cast<long long>(left.count() / 1'000'000'000),
                           static_cast<long long>(left.count() % 1'000'000'000)};
      io_uring_cqe* cqe = nullptr;
      (void)io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kRetry, "out of memory while reaping completions");
  }
  const std::size_t n = std::min(out.size(), ready_.size());
  for (std::size_t i = 0; i < n; ++i) out[i] = std::move(ready_[i]);
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

Result<std::vector<ObjectKey>> DiskBackend::do_list_keys(const Key128& ns) {
  std::vector<ObjectKey> out;
  for (const auto& [k, loc] : index_)
    if (k.ns == ns) out.push_back(k);
  return out;
}

}  // namespace tier::disk
