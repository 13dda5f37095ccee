#include "tier/engine/worker.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <thread>

#include "tier/registry.hpp"

namespace tier::engine {
namespace {

// The persisted commit record of one boundary (identity codec payload, little-endian):
//   "LTCR" | u32 version 1 | u64 boundary tokens | u64 key.lo | u64 key.hi | u32 tp_size | u32 0
constexpr std::size_t kCommitRecordBytes = 40;
constexpr std::uint32_t kCommitRecordVersion = 1;

void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void put_u64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

std::array<std::byte, kCommitRecordBytes> commit_record(const Boundary& b, std::uint32_t tp) {
  std::array<std::byte, kCommitRecordBytes> r{};
  std::memcpy(r.data(), "LTCR", 4);
  put_u32(r.data() + 4, kCommitRecordVersion);
  put_u64(r.data() + 8, b.tokens);
  put_u64(r.data() + 16, b.key.lo);
  put_u64(r.data() + 24, b.key.hi);
  put_u32(r.data() + 32, tp);
  return r;
}

// Stores a payload some codec already made (the SLOT frame snapshotted at submit) under that
// codec's layout id, so a load decodes it with the codec itself. Save only.
class PreEncoded final : public Codec {
 public:
  explicit PreEncoded(std::uint32_t format_id) : format_id_(format_id) {}
  std::string_view name() const noexcept override { return "pre_encoded"; }
  std::uint32_t format_id() const noexcept override { return format_id_; }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override {
    return total_bytes(src);
  }
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override {
    if (dst.size() < total_bytes(src)) return Status::invalid("pre_encoded: buffer too small");
    std::size_t off = 0;
    for (const Region& r : src) {
      std::memcpy(dst.data() + off, r.data, r.size);
      off += r.size;
    }
    return off;
  }
  Status decode(std::span<const std::byte>, RegionList) const noexcept override {
    return Status(Code::kNotSupported, "pre_encoded payloads are decoded by their own codec");
  }

 private:
  std::uint32_t format_id_;
};

// A layout codec whose calls hold the worker's layout lock, so that the TierStack's encodes and
// decodes (on the progress() thread) never overlap a snapshot taken by submit().
class LockedCodec final : public Codec {
 public:
  LockedCodec(const Codec& inner, std::mutex& mu) : inner_(inner), mu_(mu) {}
  std::string_view name() const noexcept override { return inner_.name(); }
  std::uint32_t format_id() const noexcept override { return inner_.format_id(); }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_.encoded_size(src);
  }
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_.encode(src, dst);
  }
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_.decode(payload, dst);
  }
  Result<DirectPayload> direct(RegionList regions) const noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_.direct(regions);
  }

 private:
  const Codec& inner_;
  std::mutex& mu_;
};

std::string fingerprint_hex(const std::array<std::byte, 16>& f) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::byte b : f) {
    out += kHex[std::to_integer<unsigned>(b) >> 4];
    out += kHex[std::to_integer<unsigned>(b) & 0xf];
  }
  return out;
}

}  // namespace

std::string_view outcome_name(WorkerOutcome o) noexcept {
  switch (o) {
    case WorkerOutcome::kOk:
      return "";
    case WorkerOutcome::kPageUnavailable:
      return "page_unavailable";
    case WorkerOutcome::kMissingDestinationGroup:
      return "missing_destination_group";
    case WorkerOutcome::kSidecarCodec:
      return "sidecar_codec";
    case WorkerOutcome::kSidecarUnavailable:
      return "sidecar_unavailable";
    case WorkerOutcome::kSidecarCorrupt:
      return "sidecar_corrupt";
    case WorkerOutcome::kMaxPendingSaves:
      return "max_pending_saves";
    case WorkerOutcome::kDeviceOrder:
      return "device_order";
    case WorkerOutcome::kRankLost:
      return "rank_lost";
    case WorkerOutcome::kSnapshot:
      return "snapshot";
    case WorkerOutcome::kPageStore:
      return "page_store";
    case WorkerOutcome::kPageVisibility:
      return "page_visibility";
    case WorkerOutcome::kPageVisibilityTimeout:
      return "page_visibility_timeout";
    case WorkerOutcome::kSidecarInvalidation:
      return "sidecar_invalidation";
    case WorkerOutcome::kSidecarSubmission:
      return "sidecar_submission";
    case WorkerOutcome::kSidecarVisibility:
      return "sidecar_visibility";
    case WorkerOutcome::kSidecarVisibilityTimeout:
      return "sidecar_visibility_timeout";
  }
  return "unknown";
}

std::optional<WorkerOutcome> outcome_from_name(std::string_view name) noexcept {
  for (std::uint8_t i = 0; i < kWorkerOutcomeCount; ++i)
    if (outcome_name(static_cast<WorkerOutcome>(i)) == name) return static_cast<WorkerOutcome>(i);
  return std::nullopt;
}

Worker::Worker(const EngineConfig& config, std::uint32_t rank, TierStack& stack, KvLayout& layout,
               PluginPtr<Codec> identity)
    : config_(config),
      rank_(rank),
      stack_(stack),
      layout_(layout),
      identity_(std::move(identity)),
      loaded_by_tier_(stack.tier_count(), 0) {
  // Sidecars are keyed by the layout that frames them (this rank's fingerprint) and the TP size;
  // commit records by rank 0's fingerprint, so every rank names the same record.
  const std::string ns = config.page_namespace.hex();
  slot_ns_ = namespace_id(Json{{"page_namespace", ns},
                               {"object", "slot-sidecar"},
                               {"tp_size", config.tp_size},
                               {"fingerprint", fingerprint_hex(layout.slot_fingerprint(rank))}})
                 .value();
  commit_ns_ = namespace_id(Json{{"page_namespace", ns},
                                 {"object", "slot-commit"},
                                 {"tp_size", config.tp_size},
                                 {"fingerprint", fingerprint_hex(layout.slot_fingerprint(0))}})
                   .value();
}

Result<std::unique_ptr<Worker>> Worker::create(const EngineConfig& config, std::uint32_t rank,
                                               TierStack& stack, KvLayout& layout) {
  TIER_RETURN_IF_ERROR(config.validate());
  if (rank >= config.tp_size)
    return Status::invalid("worker rank " + std::to_string(rank) + " >= tp_size " +
                           std::to_string(config.tp_size));
  if (layout.block_tokens() != 0 && layout.block_tokens() != config.block_tokens)
    return Status::invalid("engine block_tokens " + std::to_string(config.block_tokens) +
                           " does not match the KV layout's " +
                           std::to_string(layout.block_tokens()) +
                           " tokens per block id (block_size x dcp_size)");
  auto identity = Registry::global().create_codec("identity", Json::object());
  if (!identity) return identity.status();
  return std::unique_ptr<Worker>(
      new Worker(config, rank, stack, layout, std::move(identity).value()));
}

ObjectKey Worker::page_key(const Key128& chunk) const noexcept {
  return ObjectKey{config_.page_namespace, chunk, rank_};
}
// Sidecar and commit ids are derived from the boundary key within their own namespace, so they
// never equal a PAGE chunk id (some tiers key by id alone).
ObjectKey Worker::slot_key(const Boundary& b) const noexcept {
  return ObjectKey{slot_ns_, chunk_key(slot_ns_, b.key, {}), rank_};
}
ObjectKey Worker::commit_key(const Boundary& b) const noexcept {
  return ObjectKey{commit_ns_, chunk_key(commit_ns_, b.key, {}), 0};
}

bool Worker::fenced(const ObjectKey& key) const { return is_fenced(key); }

void Worker::report(Channel c, const OperationId& id, WorkerOutcome outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  reports_.push_back(OpReport{c, id, rank_, outcome});
}

bool Worker::is_fenced(const ObjectKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return fenced_.count(key) != 0;
}

void Worker::submit(const StepPlan& plan, const DeviceOrder& after) {
  Status ordered = Status::ok();
  if (!after.empty()) {
    std::lock_guard<std::mutex> lock(layout_mu_);
    ordered = layout_.order_after(after);
  }
  if (!ordered.is_ok()) {
    // Nothing of this step may read or write its KV: the transfers would race the forward.
    std::lock_guard<std::mutex> lock(mu_);
    const WorkerOutcome why = WorkerOutcome::kDeviceOrder;
    for (const LoadOp& op : plan.loads) {
      counters_.loads_failed.add();
      reports_.push_back(OpReport{Channel::kLoad, op.id, rank_, why});
    }
    for (const SaveOp& op : plan.saves) {
      counters_.saves_failed.add();
      reports_.push_back(OpReport{Channel::kPageSave, op.id, rank_, why});
      if (op.slot) reports_.push_back(OpReport{Channel::kSlotSave, op.id, rank_, why});
    }
    return;
  }
  // Admission first, under the short lock: max_pending_saves bounds queued and running saves
  // before any snapshot is taken.
  std::vector<QueuedSave> accepted;
  accepted.reserve(plan.saves.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const SaveOp& op : plan.saves) {
      if (saves_pending_ >= config_.max_pending_saves) {
        counters_.saves_rejected.add();
        counters_.saves_failed.add();
        reports_.push_back(
            OpReport{Channel::kPageSave, op.id, rank_, WorkerOutcome::kMaxPendingSaves});
        if (op.slot)
          reports_.push_back(
              OpReport{Channel::kSlotSave, op.id, rank_, WorkerOutcome::kMaxPendingSaves});
        continue;
      }
      ++saves_pending_;
      accepted.emplace_back().op = op;
    }
  }
  for (QueuedSave& q : accepted)
    if (q.op.slot) snapshot(q, after);
  // Every rank holds what its load will read: rank 0 from the lookup on (the op's lease is its
  // own), the other ranks from the plan's arrival here until their load ends.
  std::vector<QueuedLoad> queued(plan.loads.size());
  for (std::size_t i = 0; i < plan.loads.size(); ++i) {
    QueuedLoad& q = queued[i];
    q.op = plan.loads[i];
    if (config_.lease_timeout_ms == 0) continue;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (q.op.lease != 0 && leases_.count(q.op.lease) != 0) continue;
    }
    q.destinations = page_destinations(q.op);
    if (!q.destinations) continue;  // malformed: its load refuses it, no tier is asked
    auto l =
        lease(q.op.chunk_keys, q.op.slot, std::chrono::milliseconds(config_.lease_timeout_ms));
    if (l) q.lease = l->id;  // best effort: a tier that cannot lease holds nothing
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (QueuedLoad& q : queued) loads_.push_back(std::move(q));
  for (QueuedSave& q : accepted) saves_.push_back(std::move(q));
}

void Worker::snapshot(QueuedSave& q, const DeviceOrder& after) {
  // Now: the next forward may change the live state group.
  const SaveOp& op = q.op;
  const SlotIdentity id{op.slot->tokens, op.slot->key.lo, config_.tp_size, rank_};
  auto started = layout_.snapshot_slot(id, op.slot_group, after);  // without the layout lock
  if (started) {
    q.format_id = (*started)->format_id();
    q.snapshot = std::move(started).value();
    return;
  }
  if (started.status() != Code::kNotSupported) {
    q.early_failure = WorkerOutcome::kSnapshot;
    return;
  }
  // The layout frames it here, under the lock its codecs' other calls take.
  std::lock_guard<std::mutex> lock(layout_mu_);
  auto codec = layout_.slot_codec(id);
  auto regions = layout_.slot_regions(op.slot_group);
  q.early_failure = WorkerOutcome::kSnapshot;
  if (!codec || !regions) return;
  q.format_id = (*codec)->format_id();
  auto size = (*codec)->encoded_size(*regions);
  if (!size) return;
  q.staging.resize(*size);
  auto n = (*codec)->encode(*regions, q.staging);
  if (!n) return;
  q.staging.resize(*n);
  q.early_failure = WorkerOutcome::kOk;
}

std::size_t Worker::progress(std::size_t max_saves) {
  std::lock_guard<std::mutex> run(run_mu_);
  std::deque<QueuedLoad> loads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    loads.swap(loads_);
  }
  std::size_t done = 0;
  for (QueuedLoad& q : loads) {
    const LoadOp& op = q.op;
    const WorkerOutcome outcome = run_load(q);
    release_lease(op.lease);  // the load ended: its lookup lease is no longer needed
    release_lease(q.lease);   // and the one this rank took at submit()
    (outcome == WorkerOutcome::kOk ? counters_.loads_ok : counters_.loads_failed).add();
    report(Channel::kLoad, op.id, outcome);
    ++done;
  }
  while (max_saves-- > 0) {
    QueuedSave q;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (saves_.empty()) break;
      q = std::move(saves_.front());
      saves_.pop_front();
    }
    run_save(q);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --saves_pending_;
    }
    ++done;
  }
  stack_.progress();
  return done;
}

std::vector<OpReport> Worker::take_reports() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OpReport> out;
  out.swap(reports_);
  return out;
}

std::size_t Worker::queued_saves() const {
  std::lock_guard<std::mutex> lock(mu_);
  return saves_pending_;
}
std::size_t Worker::queued_loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_.size();
}

std::vector<std::uint64_t> Worker::loaded_bytes_by_tier() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaded_by_tier_;
}

std::optional<Worker::PageDestinations> Worker::page_destinations(const LoadOp& op) {
  const std::uint64_t chunk = config_.chunk_tokens;
  if (op.page_start % chunk != 0 || op.page_end <= op.page_start) return std::nullopt;
  const std::size_t blocks_per_chunk = chunk / config_.block_tokens;
  if (op.block_ids.size() != op.chunk_keys.size() * blocks_per_chunk) return std::nullopt;
  // Every destination block is distinct, across chunks too (the layout checks one chunk at a
  // time): a block named twice would end up holding the wrong chunk.
  std::vector<std::uint32_t> ids = op.block_ids;
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) return std::nullopt;
  PageDestinations regions(op.chunk_keys.size());
  std::lock_guard<std::mutex> lock(layout_mu_);
  for (std::size_t i = 0; i < op.chunk_keys.size(); ++i) {
    auto r = layout_.page_regions(
        std::span(op.block_ids).subspan(i * blocks_per_chunk, blocks_per_chunk));
    if (!r) return std::nullopt;
    regions[i] = std::move(r).value();
  }
  return regions;
}

WorkerOutcome Worker::run_load(QueuedLoad& q) {
  const LoadOp& op = q.op;
  // PAGE first: the SLOT reaches its state group only when every chunk loaded. A layout with
  // staging rows has the sidecar fetched in the same call as the chunks, into a row committed
  // after them (its transfer then runs with theirs instead of after them); otherwise it is
  // fetched once they loaded.
  if (!q.destinations) q.destinations = page_destinations(op);
  const auto& regions = q.destinations;
  if (!regions) return WorkerOutcome::kPageUnavailable;
  std::optional<SlotIdentity> slot_id;
  ObjectKey key;  // the sidecar's
  if (op.slot) {
    slot_id = SlotIdentity{op.slot->tokens, op.slot->key.lo, config_.tp_size, rank_};
    key = slot_key(*op.slot);
  }
  std::unique_ptr<SlotStaging> staged;
  if (slot_id) {
    std::lock_guard<std::mutex> lock(layout_mu_);
    // Any refusal (no rows, all in use, a bad group) leaves it to the path after the chunks,
    // which reports it as before.
    if (auto s = layout_.stage_slot(*slot_id, op.slot_group)) staged = std::move(s).value();
  }
  std::optional<LockedCodec> staged_codec;
  std::vector<LoadItem> items;
  items.reserve(op.chunk_keys.size() + 1);
  if (staged) {  // first: its transfer starts with the load, its checks overlap the chunks'
    staged_codec.emplace(staged->codec(), layout_mu_);
    items.push_back(LoadItem{key, staged->regions(), &*staged_codec});
  }
  const std::size_t first_chunk = items.size();
  for (std::size_t i = 0; i < op.chunk_keys.size(); ++i)
    items.push_back(LoadItem{page_key(op.chunk_keys[i]), (*regions)[i]});
  std::vector<LoadResult> results(items.size());
  if (!stack_.load(items, LockedCodec(layout_.page_codec(), layout_mu_), results).is_ok())
    return WorkerOutcome::kPageUnavailable;
  bool all = true;
  for (std::size_t i = first_chunk; i < results.size(); ++i) {
    const Status& st = results[i].status;
    if (!st.is_ok()) {
      all = false;
      // A chunk that fails its checks, or that another layout stored, would block the
      // recomputed chunk in put-if-absent tiers: invalidate it like a corrupt sidecar.
      if (st == Code::kChecksumMismatch || st == Code::kInvalidArgument)
        invalidate(items[i].key, counters_.page_invalidations);
      continue;
    }
    counters_.page_chunks_loaded.add();
    std::lock_guard<std::mutex> lock(mu_);
    loaded_by_tier_[static_cast<std::size_t>(results[i].tier)] +=
        total_bytes((*regions)[i - first_chunk]);
  }
  // A staged sidecar is dropped uncommitted: the state group never saw it.
  if (!all) return WorkerOutcome::kPageUnavailable;
  if (!slot_id) return WorkerOutcome::kOk;
  if (staged) {
    LoadResult& res = results[0];
    // A failed copy into the state group is a device failure, not a corrupt sidecar.
    if (res.status.is_ok() && !staged->commit().is_ok()) return WorkerOutcome::kSidecarUnavailable;
    return slot_outcome(key, res, total_bytes(staged->regions()));
  }
  std::vector<Region> dst;
  std::unique_ptr<Codec> codec;
  {
    std::lock_guard<std::mutex> lock(layout_mu_);
    auto group = layout_.slot_regions(op.slot_group);
    if (!group) return WorkerOutcome::kMissingDestinationGroup;
    auto bound = layout_.slot_codec(*slot_id);
    if (!bound) return WorkerOutcome::kSidecarCodec;
    dst = std::move(group).value();
    codec = std::move(bound).value();
  }
  LoadItem item{key, dst};
  LoadResult res;
  if (!stack_.load(std::span(&item, 1), LockedCodec(*codec, layout_mu_), std::span(&res, 1)).is_ok())
    return WorkerOutcome::kSidecarUnavailable;
  return slot_outcome(key, res, total_bytes(dst));
}

WorkerOutcome Worker::slot_outcome(const ObjectKey& key, const LoadResult& res,
                                   std::uint64_t bytes) {
  if (res.status.is_ok()) {
    counters_.slot_restores.add();
    std::lock_guard<std::mutex> lock(mu_);
    loaded_by_tier_[static_cast<std::size_t>(res.tier)] += bytes;
    return WorkerOutcome::kOk;
  }
  if (res.status == Code::kNotFound) return WorkerOutcome::kSidecarUnavailable;
  if (res.status == Code::kChecksumMismatch || res.status == Code::kInvalidArgument) {
    invalidate(key, counters_.slot_invalidations);
    return WorkerOutcome::kSidecarCorrupt;
  }
  return WorkerOutcome::kSidecarUnavailable;
}

bool Worker::invalidate(const ObjectKey& key, Counter& removed) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fenced_.insert(key);  // fence first: no put of this key until the corrupt copy is gone
  }
  if (!stack_.remove(key).is_ok()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fenced_.erase(key);
  }
  removed.add();
  return true;
}

void Worker::run_save(QueuedSave& q) {
  const SaveOp& op = q.op;
  const std::uint64_t chunk = config_.chunk_tokens;
  const std::size_t blocks_per_chunk = chunk / config_.block_tokens;
  WorkerOutcome page_failure = WorkerOutcome::kOk;
  if (op.block_ids.size() != op.chunk_keys.size() * blocks_per_chunk) {
    page_failure = WorkerOutcome::kPageStore;
  } else if (!op.chunk_keys.empty()) {
    std::vector<std::vector<Region>> regions(op.chunk_keys.size());
    std::vector<SaveItem> items;
    {
      std::lock_guard<std::mutex> lock(layout_mu_);
      for (std::size_t i = 0; i < op.chunk_keys.size(); ++i) {
        auto r = layout_.page_regions(
            std::span(op.block_ids).subspan(i * blocks_per_chunk, blocks_per_chunk));
        if (!r) {
          page_failure = WorkerOutcome::kPageStore;
          break;
        }
        regions[i] = std::move(r).value();
        items.push_back(SaveItem{page_key(op.chunk_keys[i]), regions[i]});
      }
    }
    // A fenced chunk is stored only once its corrupt copy is gone (as a sidecar, below).
    for (const SaveItem& item : items) {
      if (page_failure == WorkerOutcome::kOk && is_fenced(item.key) &&
          !invalidate(item.key, counters_.page_invalidations)) {
        counters_.fenced_refusals.add();
        page_failure = WorkerOutcome::kPageStore;
      }
    }
    if (page_failure == WorkerOutcome::kOk) {
      std::vector<Status> out(items.size());
      if (!stack_.save(items, LockedCodec(layout_.page_codec(), layout_mu_), out).is_ok())
        page_failure = WorkerOutcome::kPageStore;
      for (const Status& st : out) {
        if (st.is_ok()) {
          counters_.page_chunks_saved.add();
        } else {
          page_failure = WorkerOutcome::kPageStore;
        }
      }
    }
  }
  report(Channel::kPageSave, op.id, page_failure);
  WorkerOutcome slot_failure = page_failure;
  if (op.slot) {
    if (slot_failure == WorkerOutcome::kOk) slot_failure = save_slot(q);
    if (slot_failure == WorkerOutcome::kOk) counters_.slot_publishes.add();
    report(Channel::kSlotSave, op.id, slot_failure);
  }
  (slot_failure == WorkerOutcome::kOk ? counters_.saves_ok : counters_.saves_failed).add();
}

WorkerOutcome Worker::save_slot(QueuedSave& q) {
  const SaveOp& op = q.op;
  if (q.early_failure != WorkerOutcome::kOk) return q.early_failure;
  // PAGE must be visible through the boundary before the SLOT may be published.
  if (op.prefix_keys.size() * config_.chunk_tokens != op.slot->tokens)
    return WorkerOutcome::kPageVisibility;
  std::vector<ObjectKey> prefix;
  prefix.reserve(op.prefix_keys.size());
  for (const Key128& k : op.prefix_keys) prefix.push_back(page_key(k));
  const WorkerOutcome page = await_visible(
      [&]() -> Result<bool> {
        TIER_ASSIGN_OR_RETURN(std::size_t n, stack_.lookup_prefix(prefix));
        return n == prefix.size();
      },
      WorkerOutcome::kPageVisibility, WorkerOutcome::kPageVisibilityTimeout);
  if (page != WorkerOutcome::kOk) return page;
  const ObjectKey key = slot_key(*op.slot);
  if (is_fenced(key) && !invalidate(key, counters_.slot_invalidations)) {
    counters_.fenced_refusals.add();
    return WorkerOutcome::kSidecarInvalidation;
  }
  const PreEncoded codec(q.format_id);
  Region src = host_region(q.staging);
  if (q.snapshot) {  // the copy started at submit(): landed and framed now
    auto frame = q.snapshot->frame();
    if (!frame) return WorkerOutcome::kSnapshot;
    src = Region{const_cast<std::byte*>(frame->data()), frame->size(), MemoryKind::kHost, -1};
  }
  SaveItem item{key, std::span(&src, 1)};
  Status st;
  if (!stack_.save(std::span(&item, 1), codec, std::span(&st, 1)).is_ok() || !st.is_ok())
    return WorkerOutcome::kSidecarSubmission;
  return await_visible(
      [&]() -> Result<bool> {
        TIER_ASSIGN_OR_RETURN(int where, stack_.locate(key));
        return where >= 0;
      },
      WorkerOutcome::kSidecarVisibility, WorkerOutcome::kSidecarVisibilityTimeout);
}

WorkerOutcome Worker::await_visible(const std::function<Result<bool>()>& probe,
                                    WorkerOutcome failed, WorkerOutcome timed_out) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(config_.publication_timeout_ms);
  const auto interval = std::chrono::milliseconds(config_.publication_poll_interval_ms);
  for (;;) {
    counters_.visibility_probes.add();
    Result<bool> seen = probe();
    if (!seen) return failed;  // a tier error fails at once: waiting cannot fix it
    if (*seen) return WorkerOutcome::kOk;
    const auto now = Clock::now();
    if (now >= deadline) break;
    stack_.progress();
    std::this_thread::sleep_for(std::min<Clock::duration>(interval, deadline - now));
  }
  return timed_out;
}

Result<std::size_t> Worker::lookup_prefix(std::span<const Key128> chunk_keys) {
  std::vector<ObjectKey> keys;
  keys.reserve(chunk_keys.size());
  for (const Key128& k : chunk_keys) keys.push_back(page_key(k));
  return stack_.lookup_prefix(keys);
}

Result<ViewLease> Worker::lease(std::span<const Key128> chunk_keys,
                                const std::optional<Boundary>& slot,
                                std::chrono::milliseconds ttl) {
  std::vector<ObjectKey> keys;
  keys.reserve(chunk_keys.size() + 1);
  for (const Key128& k : chunk_keys) keys.push_back(page_key(k));
  if (slot) keys.push_back(slot_key(*slot));
  std::vector<std::uint8_t> held(keys.size(), 0);
  TIER_ASSIGN_OR_RETURN(LeaseId id, stack_.lease(keys, ttl, held));
  ViewLease out;
  while (out.chunks < chunk_keys.size() && held[out.chunks]) ++out.chunks;
  out.slot = slot && held.back();
  out.id = id;
  if (id != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    leases_.insert(id);
  }
  return out;
}

void Worker::release_lease(std::uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id == 0 || leases_.erase(id) == 0) return;
  }
  stack_.release(id);  // outside mu_, which is held for a few instructions only
}

std::size_t Worker::active_leases() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leases_.size();
}

Result<bool> Worker::has_commit(const Boundary& b) {
  std::array<std::byte, kCommitRecordBytes> buf{};
  Region dst = host_region(buf);
  LoadItem item{commit_key(b), std::span(&dst, 1)};
  LoadResult res;
  TIER_RETURN_IF_ERROR(stack_.load(std::span(&item, 1), *identity_, std::span(&res, 1)));
  if (!res.status.is_ok()) return false;
  return buf == commit_record(b, config_.tp_size);
}

Status Worker::put_commit(const Boundary& b) {
  auto rec = commit_record(b, config_.tp_size);
  Region src = host_region(rec);
  SaveItem item{commit_key(b), std::span(&src, 1)};
  Status st;
  TIER_RETURN_IF_ERROR(stack_.save(std::span(&item, 1), *identity_, std::span(&st, 1)));
  return st;
}

Status Worker::remove_commit(const Boundary& b) { return stack_.remove(commit_key(b)); }

}  // namespace tier::engine
