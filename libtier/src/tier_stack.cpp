#include "tier/tier_stack.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tier/checked.hpp"
#include "tier/log.hpp"
#include "tier/object.hpp"

namespace tier {

using Clock = std::chrono::steady_clock;

class TierStack::EvictSink final : public EvictionHandler {
 public:
  EvictSink(TierStack* stack, int tier) : stack_(stack), tier_(tier) {}
  void on_evict(const ObjectKey& key, std::span<const std::byte> image) noexcept override {
    stack_->on_evict(tier_, key, image);
  }

 private:
  TierStack* stack_;
  int tier_;
};

namespace {

// The payload bytes of a caller's region list: InvalidArgument when a region wraps the address
// space, the sum overflows, or it exceeds kMaxPayloadBytes (so that every size computed from it,
// header and padding included, fits).
Result<std::size_t> caller_payload_bytes(RegionList regions) {
  TIER_ASSIGN_OR_RETURN(std::size_t n, checked_total(regions));
  if (n > kMaxPayloadBytes)
    return Status::invalid(
        fmt::format("an object of {} bytes: at most {} bytes are stored", n, kMaxPayloadBytes));
  return n;
}

}  // namespace

Json StackCounters::to_json() const {
  return {{"saves", saves.get()},
          {"saved_bytes", saved_bytes.get()},
          {"save_failures", save_failures.get()},
          {"loads", loads.get()},
          {"loaded_bytes", loaded_bytes.get()},
          {"load_misses", load_misses.get()},
          {"decode_failures", decode_failures.get()},
          {"writethrough_dropped", writethrough_dropped.get()},
          {"demotions_dropped", demotions_dropped.get()}};
}

TierStack::TierStack(const Profile& profile)
    : max_inflight_bytes_(profile.max_inflight_bytes),
      op_timeout_(std::chrono::microseconds(profile.op_timeout_us)) {}

TierStack::Entry::Entry(TierStack& s) : stack_(s) { s.lock_counted(); }

TierStack::Entry::~Entry() {
  stack_.note_usage();
  stack_.mu_.unlock();
}

void TierStack::lock_counted() {
  entering_.fetch_add(1);
  mu_.lock();
  entering_.fetch_sub(1);
  entries_.fetch_add(1);
}

void TierStack::let_others_in() {
  if (entering_.load() == 0) return;
  const std::uint64_t seen = entries_.load();
  mu_.unlock();
  while (entering_.load() > 0 && entries_.load() == seen) std::this_thread::yield();
  lock_counted();  // counted: the thread that got in hands mu_ back the same way
}

TierStack::~TierStack() {
  metrics_server_.reset();  // its thread reads the counters below
  flush(std::chrono::duration_cast<std::chrono::milliseconds>(op_timeout_)).ignore();
  // Backends go first: after their destructors no request can touch a pending image.
  for (auto& t : tiers_) t.backend.reset();
  pending_.clear();
}

Result<std::unique_ptr<TierStack>> TierStack::open(const Profile& profile, Registry& registry) {
  std::unique_ptr<TierStack> stack(new TierStack(profile));
  for (std::size_t i = 0; i < profile.tiers.size(); ++i) {
    const TierSpec& spec = profile.tiers[i];
    Tier t;
    t.spec = spec;
    BackendContext ctx{spec.name, spec.capacity_bytes, spec.backend_options};
    auto backend = registry.create_backend(spec.backend_type, ctx);
    if (!backend && spec.optional && backend.status().code() == Code::kNotSupported) {
      stack->skipped_.push_back(fmt::format("{}: {}", spec.name, backend.status().message()));
      continue;
    }
    if (!backend)
      return Status(backend.status().code(),
                    fmt::format("/tiers/{}/backend: {}", i, backend.status().message()));
    t.backend = std::move(backend).value();
    if (!spec.stage_type.empty()) {
      auto stage = registry.create_stage(spec.stage_type, spec.stage_options);
      if (!stage)
        return Status(stage.status().code(),
                      fmt::format("/tiers/{}/stage: {}", i, stage.status().message()));
      t.stage = std::move(stage).value();
    }
    t.sink = std::make_unique<EvictSink>(stack.get(), static_cast<int>(stack->tiers_.size()));
    t.backend->set_eviction_handler(t.sink.get());
    stack->tiers_.push_back(std::move(t));
  }
  if (std::none_of(stack->tiers_.begin(), stack->tiers_.end(),
                   [](const Tier& t) { return t.spec.write; }))
    return Status(Code::kNotSupported,
                  fmt::format("no writable tier can run here ({})", fmt::join(stack->skipped_, "; ")));
  for (const std::string& why : stack->skipped_)
    log(LogLevel::kInfo, fmt::format("{}: optional tier left out: {}", profile.source, why));
  for (std::size_t i = 0; i < stack->tiers_.size(); ++i) {
    if (stack->tiers_[i].spec.on_evict != EvictPolicy::kDemote) continue;
    for (std::size_t j = i + 1; j < stack->tiers_.size(); ++j) {
      if (stack->tiers_[j].spec.write) {
        stack->tiers_[i].demote_to = static_cast<int>(j);
        break;
      }
    }
  }
  TIER_RETURN_IF_ERROR(stack->start_metrics(profile));
  return stack;
}

int TierStack::find_tier(std::string_view name) const {
  for (std::size_t i = 0; i < tiers_.size(); ++i)
    if (tiers_[i].spec.name == name) return static_cast<int>(i);
  return -1;
}

std::uint64_t TierStack::image_bytes(std::uint64_t payload_bytes) noexcept {
  return kObjectHeaderBytes + payload_bytes;
}

std::size_t TierStack::max_image_bytes(int t, std::size_t raw_bytes) const {
  const auto& stage = tiers_[static_cast<std::size_t>(t)].stage;
  return kObjectHeaderBytes + (stage ? stage->max_encoded_size(raw_bytes) : raw_bytes);
}

TierStack::Buffer::Buffer(std::size_t bytes) : size_(bytes), cap_(bytes) {
  const std::size_t padded = (std::max<std::size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kPage, padded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p + bytes, 0, padded - bytes);  // the padding a rounded-up region writes out
  data_.reset(p);
}

void TierStack::Buffer::Free::operator()(std::byte* p) const noexcept { std::free(p); }

Region TierStack::io_region(int t, Buffer& image) const {
  const std::size_t align = std::min<std::size_t>(
      tiers_[static_cast<std::size_t>(t)].backend->capabilities().io_alignment, Buffer::kPage);
  const std::size_t n = align > 1 ? (image.size() + align - 1) / align * align : image.size();
  return Region{image.data(), n, MemoryKind::kHost, -1};
}

TierStack::Image TierStack::acquire(std::size_t bytes) {
  for (std::size_t i = pool_.size(); i-- > 0;) {
    if (pool_[i].capacity() >= bytes && pool_[i].capacity() <= 2 * bytes + 4096) {
      auto b = std::make_shared<Buffer>(std::move(pool_[i]));
      pool_bytes_ -= b->capacity();
      pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(i));
      b->resize(bytes);
      return b;
    }
  }
  return std::make_shared<Buffer>(bytes);
}

void TierStack::recycle(Image& image) noexcept {
  constexpr std::size_t kMaxPooled = 64;
  if (image && image.use_count() == 1 && pool_.size() < kMaxPooled &&
      pool_bytes_ + image->capacity() <= max_inflight_bytes_) {
    pool_bytes_ += image->capacity();
    pool_.push_back(std::move(*image));
  }
  image.reset();
}

Result<TierStack::Image> TierStack::make_image(int t, const ObjectKey& key,
                                               std::uint32_t format_id,
                                               std::span<const std::byte> raw) {
  const auto& stage = tiers_[static_cast<std::size_t>(t)].stage;
  if (!stage) {
    Image img = acquire(kObjectHeaderBytes + raw.size());
    std::memcpy(img->data() + kObjectHeaderBytes, raw.data(), raw.size());
    seal_object(img->span(), format_id, 0, key);
    return img;
  }
  Image img = acquire(kObjectHeaderBytes + stage->max_encoded_size(raw.size()));
  auto n = stage->encode(format_id, raw, img->span().subspan(kObjectHeaderBytes));
  if (!n) return n.status();
  img->resize(kObjectHeaderBytes + *n);
  seal_object(img->span(), format_id, stage->stage_id(), key);
  return img;
}

Result<TierStack::RawPayload> TierStack::raw_payload(int t, std::span<const std::byte> image) {
  auto h = parse_object_header(image);
  if (!h) return h.status();
  RawPayload raw{.bytes = image.subspan(kObjectHeaderBytes, h->payload_bytes),
                 .format_id = h->format_id};
  if (h->stage_id == 0) return raw;
  const auto& stage = tiers_[static_cast<std::size_t>(t)].stage;
  if (!stage || stage->stage_id() != h->stage_id)
    return Status(Code::kChecksumMismatch,
                  fmt::format("object was written by stage {}, which tier {} does not use",
                              h->stage_id, tiers_[static_cast<std::size_t>(t)].spec.name));
  auto size = stage->decoded_size(raw.bytes, h->format_id);
  if (!size) return size.status();
  raw.holder = acquire(*size);
  auto n = stage->decode(raw.bytes, h->format_id, raw.holder->span());
  if (!n) {
    recycle(raw.holder);
    return n.status();
  }
  raw.bytes = std::span<const std::byte>(raw.holder->data(), *n);
  return raw;
}

Result<std::uint64_t> TierStack::submit_one(int t, Op op, const ObjectKey& key, Region buf,
                                            Pending p, RegionList tail, std::size_t skip,
                                            const PayloadCheck* check) {
  Backend& b = *tiers_[static_cast<std::size_t>(t)].backend;
  std::uint64_t id = next_id_++;
  IoRequest req{op, key, buf, id, tail, skip, check};
  p.tier = t;
  p.op = op;
  p.submitted = Clock::now();
  pending_.emplace(id, std::move(p));
  const auto deadline = Clock::now() + op_timeout_;
  for (;;) {
    auto r = b.submit(std::span(&req, 1));
    if (r && *r == 1) break;
    if (!r || Clock::now() > deadline) {
      pending_.erase(id);
      return r ? Status(Code::kTimedOut, "tier queue stayed full") : r.status();
    }
    reap(t, 1, std::chrono::microseconds(1000));  // queue full: make room
    let_others_in();
  }
  drain_evictions();
  return id;
}

void TierStack::reap(int t, std::size_t min, std::chrono::microseconds wait) {
  Backend& b = *tiers_[static_cast<std::size_t>(t)].backend;
  Completion batch[64];
  auto r = b.poll(batch, std::min<std::size_t>(min, 64), wait);
  if (!r) return;
  const auto now = Clock::now();
  for (std::size_t i = 0; i < *r; ++i) {
    auto it = pending_.find(batch[i].user_data);
    if (it == pending_.end()) continue;
    Pending& p = it->second;
    p.reaped = now;
    if (p.op == Op::kPut || p.op == Op::kGet)
      note_duration(p.op == Op::kPut ? StackOp::kPut : StackOp::kGet, t, p.submitted, now);
    if (!p.background) {
      p.done = std::move(batch[i]);
      p.finished = true;
      // A reaped put no longer reads its image: back to the pool now, while still in cache.
      if (p.op == Op::kPut) recycle(p.image);
      continue;
    }
    bg_bytes_ -= p.charged;
    --bg_count_;
    if (p.op == Op::kPut && !batch[i].status.is_ok() && !(batch[i].status == Code::kAlreadyExists))
      b.metrics().dropped_saves.add();
    recycle(p.image);
    pending_.erase(it);
  }
  drain_evictions();
}

void TierStack::on_evict(int t, const ObjectKey& key, std::span<const std::byte> image) noexcept {
  const Tier& tier = tiers_[static_cast<std::size_t>(t)];
  if (tier.demote_to < 0 || image.empty()) return;
  try {
    Image copy = acquire(image.size());
    std::memcpy(copy->data(), image.data(), image.size());
    evicted_.push_back({t, {key, std::move(copy)}});
  } catch (...) {
    counters_.demotions_dropped.add();
  }
}

void TierStack::drain_evictions() {
  while (!evicted_.empty()) {
    auto [t, entry] = std::move(evicted_.back());
    evicted_.pop_back();
    auto& [key, bytes] = entry;
    Tier& from = tiers_[static_cast<std::size_t>(t)];
    int to = from.demote_to;
    if (bg_bytes_ + bytes->size() > max_inflight_bytes_) {
      counters_.demotions_dropped.add();
      tiers_[static_cast<std::size_t>(to)].backend->metrics().dropped_saves.add();
      continue;
    }
    Image image;
    bool same_stage = (from.stage ? from.stage->stage_id() : 0) ==
                      (tiers_[static_cast<std::size_t>(to)].stage
                           ? tiers_[static_cast<std::size_t>(to)].stage->stage_id() : 0);
    if (same_stage) {
      image = std::move(bytes);
    } else {
      auto raw = raw_payload(t, bytes->span());
      if (!raw) {
        counters_.demotions_dropped.add();
        continue;
      }
      auto img = make_image(to, key, raw->format_id, raw->bytes);
      recycle(raw->holder);
      if (!img) {
        counters_.demotions_dropped.add();
        continue;
      }
      image = std::move(img).value();
    }
    from.backend->metrics().demotions.add();
    put_background(to, key, std::move(image), true);
  }
}

void TierStack::put_background(int t, const ObjectKey& key, Image image, bool demotion) {
  std::uint64_t bytes = image->size();
  if (bg_bytes_ + bytes > max_inflight_bytes_) {
    (demotion ? counters_.demotions_dropped : counters_.writethrough_dropped).add();
    tiers_[static_cast<std::size_t>(t)].backend->metrics().dropped_saves.add();
    return;
  }
  Region buf = io_region(t, *image);
  Pending p;
  p.background = true;
  p.image = std::move(image);
  p.charged = bytes;
  bg_bytes_ += bytes;
  ++bg_count_;
  if (!submit_one(t, Op::kPut, key, buf, std::move(p))) {
    bg_bytes_ -= bytes;
    --bg_count_;
    tiers_[static_cast<std::size_t>(t)].backend->metrics().dropped_saves.add();
  }
}

void TierStack::wait_for(const std::vector<std::uint64_t>& ids) {
  const auto deadline = Clock::now() + op_timeout_;
  for (;;) {
    int waiting_tier = -1;
    for (std::uint64_t id : ids) {
      auto it = pending_.find(id);
      if (it != pending_.end() && !it->second.finished) {
        waiting_tier = it->second.tier;
        break;
      }
    }
    if (waiting_tier < 0) return;
    auto now = Clock::now();
    if (now >= deadline) break;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    reap(waiting_tier, 1, std::min(left, std::chrono::microseconds(10'000)));
    let_others_in();
  }
  // Timed out: the tier still owns the buffers, so the requests become background work whose
  // late completions are discarded; the caller sees TimedOut.
  for (std::uint64_t id : ids) {
    auto it = pending_.find(id);
    if (it == pending_.end() || it->second.finished) continue;
    it->second.background = true;
    it->second.charged = 0;
    ++bg_count_;
    timed_out_.insert(id);
  }
}

Completion TierStack::take(std::uint64_t id, Clock::time_point* reaped) {
  if (reaped != nullptr) *reaped = Clock::now();
  if (timed_out_.erase(id) > 0)
    return Completion{id, Status(Code::kTimedOut, "the tier did not answer in time"), 0};
  auto it = pending_.find(id);
  if (it == pending_.end() || !it->second.finished)
    return Completion{id, Status(Code::kBadState, "completion taken twice"), 0};
  if (reaped != nullptr) *reaped = it->second.reaped;
  Completion c = std::move(it->second.done);
  recycle(it->second.image);
  pending_.erase(it);
  return c;
}

Result<std::size_t> TierStack::lookup_prefix(std::span<const ObjectKey> keys) {
  Entry entry(*this);
  std::vector<char> found(keys.size(), 0);
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t].spec.read) continue;
    std::vector<std::uint64_t> ids(keys.size(), 0);
    bool any = false;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (found[i]) continue;
      ids[i] = submit_one(static_cast<int>(t), Op::kContains, keys[i], Region{}, Pending{})
                   .value_or(0);
      any |= ids[i] != 0;
    }
    if (!any) continue;
    wait_for(ids);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (ids[i] != 0 && take(ids[i]).status.is_ok()) found[i] = 1;
  }
  std::size_t n = 0;
  while (n < keys.size() && found[n]) ++n;
  return n;
}

Result<LeaseId> TierStack::lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                                 std::span<std::uint8_t> held) {
  if (held.size() != keys.size()) return Status::invalid("lease: held.size() != keys.size()");
  Entry entry(*this);
  std::fill(held.begin(), held.end(), std::uint8_t{0});
  const auto now = Clock::now();
  for (auto it = leases_.begin(); it != leases_.end();) {  // end leases past their deadline
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    for (auto [t, id] : it->second.parts) tiers_[static_cast<std::size_t>(t)].backend->release(id);
    it = leases_.erase(it);
  }
  if (ttl > kMaxLeaseTtl) ttl = kMaxLeaseTtl;  // also keeps now + ttl from overflowing
  StackLease lease{now + ttl, {}};
  std::vector<ObjectKey> want;
  std::vector<std::size_t> where;  // want[j] is keys[where[j]]
  std::vector<std::uint8_t> got;
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t].spec.read) continue;
    want.clear();
    where.clear();
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!held[i]) {
        want.push_back(keys[i]);
        where.push_back(i);
      }
    if (want.empty()) break;
    got.assign(want.size(), 0);
    auto id = tiers_[t].backend->lease(want, ttl, got);
    if (!id && id.status() == Code::kNotSupported) {
      // Best effort: present now, not held.
      std::vector<std::uint64_t> ids(want.size(), 0);
      for (std::size_t j = 0; j < want.size(); ++j)
        ids[j] = submit_one(static_cast<int>(t), Op::kContains, want[j], Region{}, Pending{})
                     .value_or(0);
      wait_for(ids);
      for (std::size_t j = 0; j < want.size(); ++j)
        if (ids[j] != 0 && take(ids[j]).status.is_ok()) got[j] = 1;
    } else if (id && *id != 0) {
      lease.parts.emplace_back(static_cast<int>(t), *id);
    }
    for (std::size_t j = 0; j < want.size(); ++j)
      if (got[j]) held[where[j]] = 1;
  }
  if (lease.parts.empty()) return LeaseId{0};
  const LeaseId id = next_lease_++;
  leases_.emplace(id, std::move(lease));
  return id;
}

void TierStack::release(LeaseId id) {
  Entry entry(*this);
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  for (auto [t, tid] : it->second.parts) tiers_[static_cast<std::size_t>(t)].backend->release(tid);
  leases_.erase(it);
}

std::size_t TierStack::active_leases() {
  Entry entry(*this);
  return leases_.size();
}

Result<int> TierStack::locate(const ObjectKey& key) {
  Entry entry(*this);
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t].spec.read) continue;
    auto id = submit_one(static_cast<int>(t), Op::kContains, key, Region{}, Pending{});
    if (!id) continue;
    wait_for({*id});
    if (take(*id).status.is_ok()) return static_cast<int>(t);
  }
  return -1;
}

void TierStack::save_gathered(int first, const SaveItem& item, const Codec& codec,
                              std::uint64_t& id, Status& out) {
  auto size = codec.encoded_size(item.src);  // host regions only
  if (!size) {
    out = size.status();
    return;
  }
  // The tier has copied the header and the regions when submit returns (gather_puts).
  alignas(64) std::array<std::byte, kObjectHeaderBytes> header;
  write_object_header(
      header, ObjectHeader{codec.format_id(), 0, item.key, *size, payload_checksum(item.src)});
  auto r = submit_one(first, Op::kPut, item.key, host_region(header), Pending{}, item.src);
  if (r) id = *r;
  else out = r.status();
}

void TierStack::save_one(int first, const SaveItem& item, const Codec& codec, std::uint64_t& id,
                         Status& out) {
  auto size = codec.encoded_size(item.src);
  if (!size) {
    out = size.status();
    return;
  }
  // Encode once into a raw image; stage tiers transcode from its payload.
  Image raw = acquire(kObjectHeaderBytes + *size);
  auto n = codec.encode(item.src, raw->span().subspan(kObjectHeaderBytes));
  if (!n) {
    out = n.status();
    recycle(raw);
    return;
  }
  raw->resize(kObjectHeaderBytes + *n);
  seal_object(raw->span(), codec.format_id(), 0, item.key);
  std::span<const std::byte> payload(raw->data() + kObjectHeaderBytes, *n);
  for (std::size_t t = static_cast<std::size_t>(first); t < tiers_.size(); ++t) {
    if (!tiers_[t].spec.write) continue;
    Image image = raw;
    if (tiers_[t].stage) {
      auto img = make_image(static_cast<int>(t), item.key, codec.format_id(), payload);
      if (!img) {
        if (static_cast<int>(t) == first) out = img.status();
        continue;
      }
      image = std::move(img).value();
    }
    if (static_cast<int>(t) == first) {
      Pending p;
      p.image = std::move(image);
      Region buf = io_region(first, *p.image);
      auto r = submit_one(first, Op::kPut, item.key, buf, std::move(p));
      if (r) id = *r;
      else out = r.status();
    } else {
      put_background(static_cast<int>(t), item.key, std::move(image), false);
    }
  }
}

Status TierStack::save(std::span<const SaveItem> items, const Codec& codec,
                       std::span<Status> out) {
  if (out.size() != items.size()) return Status::invalid("save: out.size() != items.size()");
  Entry entry(*this);
  const auto start = Clock::now();
  int first = -1;
  for (std::size_t t = 0; t < tiers_.size(); ++t)
    if (tiers_[t].spec.write) {
      first = static_cast<int>(t);
      break;
    }
  // The first tier stores straight from the caller's regions when it copies puts inside submit
  // (gather_puts, any alignment, host regions of kinds it takes), keeps raw payloads, the
  // payload is the regions' bytes (Codec::direct) and no other tier needs an image: only the
  // header is built here.
  const Tier& to = tiers_[static_cast<std::size_t>(first)];
  const Capabilities caps = to.backend->capabilities();
  const bool gather =
      caps.gather_puts && caps.io_alignment <= 1 && !to.stage &&
      std::count_if(tiers_.begin(), tiers_.end(), [](const Tier& t) { return t.spec.write; }) == 1;
  auto direct = [&](RegionList src) {
    if (!std::all_of(src.begin(), src.end(), [&](const Region& r) {
          return r.host_accessible() && (caps.memory_kinds & kind_bit(r.kind)) != 0;
        }))
      return false;
    auto form = codec.direct(src);
    return form && form->framing == 0;  // a framed payload is written by encode()
  };
  std::vector<std::uint64_t> ids(items.size(), 0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    counters_.saves.add();
    if (auto bytes = caller_payload_bytes(items[i].src); !bytes)
      out[i] = bytes.status();  // not submitted: counted as a failure below
    else if (gather && direct(items[i].src))
      save_gathered(first, items[i], codec, ids[i], out[i]);
    else
      save_one(first, items[i], codec, ids[i], out[i]);
    // Puts the first tier finished already (a cpu tier copies inside submit) return their
    // images to the pool, so the next item encodes into a buffer that is still in cache.
    reap(first, 0, {});
  }
  wait_for(ids);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (ids[i] == 0) {
      if (out[i].is_ok()) out[i] = Status(Code::kBadState, "not submitted");
      counters_.save_failures.add();
      note_duration(StackOp::kSave, first, start, Clock::now());
      continue;
    }
    Clock::time_point reaped;
    Completion c = take(ids[i], &reaped);
    note_duration(StackOp::kSave, first, start, reaped);
    if (c.status.is_ok() || c.status == Code::kAlreadyExists) {
      out[i] = Status::ok();
      counters_.saved_bytes.add(c.bytes);
    } else {
      out[i] = c.status;
      counters_.save_failures.add();
    }
  }
  return Status::ok();
}

Status TierStack::load(std::span<const LoadItem> items, const Codec& codec,
                       std::span<LoadResult> out) {
  if (out.size() != items.size()) return Status::invalid("load: out.size() != items.size()");
  Entry entry(*this);
  const auto start = Clock::now();
  std::vector<std::size_t> raw_size(items.size(), 0);
  std::vector<char> unserved(items.size(), 1);
  for (std::size_t i = 0; i < items.size(); ++i) {
    counters_.loads.add();
    out[i] = LoadResult{Status::not_found(), -1};
    auto size = caller_payload_bytes(items[i].dst);
    if (size) size = codec.encoded_size(items[i].dst);
    if (!size) {
      out[i].status = size.status();
      unserved[i] = 0;
      continue;
    }
    raw_size[i] = *size;
  }
  bool above_writable = false;  // a faster writable tier that a hit would be promoted into
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (t > 0 && tiers_[t - 1].spec.write) above_writable = true;
    if (!tiers_[t].spec.read) continue;
    const int tier = static_cast<int>(t);
    // A tier that takes scattered gets writes the payload straight into the caller's regions
    // (host or device memory) when that is all a hit needs: a codec whose payload is the regions'
    // bytes (Codec::direct), no stage, nothing to promote into.
    const Capabilities caps = tiers_[t].backend->capabilities();
    const bool scatter =
        caps.scatter_gets && caps.io_alignment <= 1 && !tiers_[t].stage && !above_writable;
    // The codec's direct form for `dst` when this tier can take it: the framing plus the regions
    // make the whole payload.
    auto direct = [&](RegionList dst, std::size_t raw) -> std::optional<DirectPayload> {
      if (!tail_on_one_side(dst) ||
          !std::all_of(dst.begin(), dst.end(), [&](const Region& r) {
            return r.size == 0 || (caps.memory_kinds & kind_bit(r.kind)) != 0;
          }))
        return std::nullopt;
      auto form = codec.direct(dst);
      if (!form || form->framing + total_bytes(dst) != raw) return std::nullopt;
      return *form;
    };
    std::vector<std::uint64_t> ids(items.size(), 0);
    std::vector<Image> bufs(items.size());
    // Gets are served in item order as they finish: a tier that completes inside submit (the
    // cpu tier) has its image decoded while still in cache and the buffer reused by the next get.
    std::size_t served = 0;
    auto finished = [&](std::size_t i) {
      auto it = pending_.find(ids[i]);
      return ids[i] == 0 || (it != pending_.end() && it->second.finished);
    };
    for (std::size_t i = 0; i < items.size(); ++i) {
      std::optional<DirectPayload> form;
      if (unserved[i] && scatter && raw_size[i] > 0) form = direct(items[i].dst, raw_size[i]);
      if (form) {
        // The header of what this load accepts; the tier overwrites it with the stored one. It
        // is the pending request's image, so it lives as long as the request (poll reads it),
        // also when the get times out and turns into background work; bufs[i] stays null.
        Pending p;
        p.image = acquire(kObjectHeaderBytes);
        write_object_header(p.image->span(), ObjectHeader{codec.format_id(), 0, items[i].key,
                                                          raw_size[i], 0});
        const Region head = host_region(p.image->span());
        ids[i] = submit_one(tier, Op::kGet, items[i].key, head, std::move(p), items[i].dst,
                            form->framing, form->check)
                     .value_or(0);
        reap(tier, 0, {});
      } else if (unserved[i]) {
        bufs[i] = acquire(max_image_bytes(tier, raw_size[i]));
        Pending p;
        p.image = bufs[i];
        ids[i] = submit_one(tier, Op::kGet, items[i].key, io_region(tier, *bufs[i]), std::move(p))
                     .value_or(0);
        reap(tier, 0, {});
      }
      for (; served <= i && finished(served); ++served)
        serve_get(tier, items[served], codec, ids[served], bufs[served], out[served],
                  unserved[served], start);
    }
    wait_for({ids.begin() + static_cast<std::ptrdiff_t>(served), ids.end()});
    for (; served < items.size(); ++served)
      serve_get(tier, items[served], codec, ids[served], bufs[served], out[served],
                unserved[served], start);
  }
  const auto end = Clock::now();
  std::size_t refused = 0, first_refused = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (out[i].status.is_ok()) continue;
    counters_.load_misses.add();
    note_duration(StackOp::kLoad, -1, start, end);
    if (out[i].status == Code::kInvalidArgument && refused++ == 0) first_refused = i;
  }
  if (refused > 0 && log_enabled(LogLevel::kWarn))  // a caller's mistake, reported per key only
    log(LogLevel::kWarn,
        fmt::format("load: {} of {} items refused; item {} (key {}): {}", refused, items.size(),
                    first_refused, items[first_refused].key.to_string(),
                    out[first_refused].status.message()));
  return Status::ok();
}

Status TierStack::wrong_size(int t, const LoadItem& item, const Codec& codec,
                             std::size_t image_bytes) const {
  const std::size_t want = codec.encoded_size(item.dst).value_or(0);
  const auto& stage = tiers_[static_cast<std::size_t>(t)].stage;
  if (stage)
    return Status::invalid(fmt::format(
        "tier {} stores an image of {} bytes (stage {}), more than a payload of {} bytes takes: "
        "the regions do not match the stored object; nothing written",
        tiers_[static_cast<std::size_t>(t)].spec.name, image_bytes, stage->name(), want));
  return Status::invalid(
      fmt::format("stored payload is {} bytes, these regions take {}: nothing written",
                  image_bytes - kObjectHeaderBytes, want));
}

void TierStack::serve_get(int t, const LoadItem& item, const Codec& codec, std::uint64_t id,
                          Image& buf, LoadResult& out, char& unserved, Clock::time_point start) {
  if (id == 0) return;
  Completion c = take(id);
  if (!c.status.is_ok()) {
    // The tier refused the image for its size (a buffer too small, a scattered get's payload
    // of another size): say both sizes.
    const bool wrong_sized =
        c.status == Code::kInvalidArgument && c.bytes > kObjectHeaderBytes &&
        (tiers_[static_cast<std::size_t>(t)].stage
             ? buf && c.bytes > buf->size()
             : c.bytes - kObjectHeaderBytes != codec.encoded_size(item.dst).value_or(0));
    if (c.status == Code::kChecksumMismatch) {
      // Never served; drop the corrupt copy so a recomputed object can be stored again.
      remove_background(t, item.key);
      out.status = c.status;
    } else if (wrong_sized) {
      out.status = wrong_size(t, item, codec, c.bytes);
    } else if (!(c.status == Code::kNotFound) && out.status == Code::kNotFound) {
      out.status = c.status;
    }
    recycle(buf);
    return;
  }
  Status st;
  if (buf) {
    st = serve_load(t, item, codec, std::span<const std::byte>(buf->data(), c.bytes));
    recycle(buf);
  } else {  // a scattered get: the tier verified and wrote the payload into item.dst
    counters_.loaded_bytes.add(c.bytes - kObjectHeaderBytes);
  }
  if (!st) {
    out.status = st;
    return;
  }
  out = LoadResult{Status::ok(), t};
  unserved = 0;
  note_duration(StackOp::kLoad, t, start, Clock::now());
}

Status TierStack::serve_load(int t, const LoadItem& item, const Codec& codec,
                             std::span<const std::byte> image) {
  auto raw = raw_payload(t, image);
  Status st = raw ? Status::ok() : raw.status();
  if (st && raw->format_id != codec.format_id())
    st = Status(Code::kInvalidArgument, fmt::format("object has layout {}, the codec expects {}",
                                                    raw->format_id, codec.format_id()));
  if (st) st = codec.decode(raw->bytes, item.dst);
  if (!st) {
    counters_.decode_failures.add();
    // A payload that fails its codec's own checks is as corrupt as a failed checksum.
    if (st == Code::kChecksumMismatch) remove_background(t, item.key);
    if (raw) recycle(raw->holder);
    return st;
  }
  counters_.loaded_bytes.add(raw->bytes.size());
  promote(t, item.key, raw->format_id, raw->bytes);
  recycle(raw->holder);
  return Status::ok();
}

void TierStack::promote(int t, const ObjectKey& key, std::uint32_t format_id,
                        std::span<const std::byte> raw) {
  for (int u = 0; u < t; ++u) {
    if (!tiers_[static_cast<std::size_t>(u)].spec.write) continue;
    auto img = make_image(u, key, format_id, raw);
    if (!img) continue;
    tiers_[static_cast<std::size_t>(t)].backend->metrics().promotions.add();
    put_background(u, key, std::move(img).value(), false);
  }
}

void TierStack::remove_background(int t, const ObjectKey& key) {
  Pending p;
  p.background = true;
  ++bg_count_;
  if (!submit_one(t, Op::kRemove, key, Region{}, std::move(p))) --bg_count_;
}

Status TierStack::remove(const ObjectKey& key) {
  Entry entry(*this);
  std::vector<std::uint64_t> ids;
  Status result;
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    auto id = submit_one(static_cast<int>(t), Op::kRemove, key, Region{}, Pending{});
    if (!id) {
      if (result.is_ok()) result = id.status();
      continue;
    }
    ids.push_back(*id);
  }
  wait_for(ids);
  for (std::uint64_t id : ids) {
    Completion c = take(id);
    if (!c.status.is_ok() && !(c.status == Code::kNotFound) && result.is_ok()) result = c.status;
  }
  return result;
}

Result<std::uint64_t> TierStack::clear(const Key128& ns) {
  Entry entry(*this);
  Status result;
  std::uint64_t removed = 0;
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    auto keys = tiers_[t].backend->list_keys(ns);
    if (!keys) {
      if (result.is_ok()) result = keys.status();
      continue;
    }
    std::vector<std::uint64_t> ids;
    for (const ObjectKey& k : *keys) {
      if (!(k.ns == ns)) continue;
      auto id = submit_one(static_cast<int>(t), Op::kRemove, k, Region{}, Pending{});
      if (!id) {
        if (result.is_ok()) result = id.status();
        continue;
      }
      ids.push_back(*id);
    }
    wait_for(ids);
    for (std::uint64_t id : ids) {
      Completion c = take(id);
      if (c.status.is_ok()) {
        ++removed;
      } else if (!(c.status == Code::kNotFound) && result.is_ok()) {
        result = c.status;
      }
    }
  }
  if (!result.is_ok()) return result;
  return removed;
}

void TierStack::progress() {
  Entry entry(*this);
  for (std::size_t t = 0; t < tiers_.size(); ++t)
    if (tiers_[t].backend->in_flight() > 0) reap(static_cast<int>(t), 0, {});
  drain_evictions();
}

Status TierStack::flush(std::chrono::milliseconds timeout) {
  Entry entry(*this);
  const auto deadline = Clock::now() + timeout;
  while (bg_count_ > 0) {
    if (Clock::now() >= deadline)
      return Status(Code::kTimedOut, fmt::format("{} background requests still in flight",
                                                 bg_count_));
    for (std::size_t t = 0; t < tiers_.size(); ++t)
      if (tiers_[t].backend->in_flight() > 0) reap(static_cast<int>(t), 1, std::chrono::microseconds(1000));
    drain_evictions();
    let_others_in();
  }
  return Status::ok();
}

}  // namespace tier
