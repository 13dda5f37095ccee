#include "tier/tier_stack.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tier/checked.hpp"
#include "tier/log.hpp"
#include "tier_stack_impl.hpp"
#include "verify_pool.hpp"

namespace tier {

using detail::kConcurrentSlice;
using detail::kGatedSlice;
using detail::kGatherSubmitBytes;
using detail::kScatterBatch;
using detail::kScatterSubmitBytes;
using detail::kTakeChunk;
using detail::Image;
using detail::ImageBuffer;
using Clock = std::chrono::steady_clock;

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
          {"demotions_dropped", demotions_dropped.get()},
          {"staging_copy_bytes", staging_copy_bytes.get()}};
}

TierStack::Impl::~Impl() {
  metrics_server_.reset();  // its thread reads the counters below
  flush(std::chrono::duration_cast<std::chrono::milliseconds>(op_timeout_)).ignore();
  // Backends go first: after their destructors no request can touch a pending image.
  for (auto& t : tiers_) t->backend.reset();
  pending_.clear();
}

Status TierStack::Impl::open(const Profile& profile, Registry& registry) {
  for (std::size_t i = 0; i < profile.tiers.size(); ++i) {
    const TierSpec& spec = profile.tiers[i];
    auto t = std::make_unique<Tier>();
    t->spec = spec;
    BackendContext ctx{spec.name, spec.capacity_bytes, spec.backend_options};
    auto backend = registry.create_backend(spec.backend_type, ctx);
    if (!backend && spec.optional && backend.status().code() == Code::kNotSupported) {
      skipped_.push_back(fmt::format("{}: {}", spec.name, backend.status().message()));
      continue;
    }
    if (!backend)
      return Status(backend.status().code(),
                    fmt::format("/tiers/{}/backend: {}", i, backend.status().message()));
    t->backend = std::move(backend).value();
    t->caps = t->backend->capabilities();
    if (!spec.stage_type.empty()) {
      auto stage = registry.create_stage(spec.stage_type, spec.stage_options);
      if (!stage)
        return Status(stage.status().code(),
                      fmt::format("/tiers/{}/stage: {}", i, stage.status().message()));
      t->stage = std::move(stage).value();
    }
    t->sink = std::make_unique<EvictSink>(this, static_cast<int>(tiers_.size()));
    t->backend->set_eviction_handler(t->sink.get());
    tiers_.push_back(std::move(t));
  }
  const auto writable = std::count_if(tiers_.begin(), tiers_.end(),
                                      [](const auto& t) { return t->spec.write; });
  if (writable == 0)
    return Status(Code::kNotSupported,
                  fmt::format("no writable tier can run here ({})", fmt::join(skipped_, "; ")));
  for (const std::string& why : skipped_)
    log(LogLevel::kInfo, fmt::format("{}: optional tier left out: {}", profile.source, why));
  for (std::size_t i = 0; i < tiers_.size(); ++i) {
    if (first_writable_ < 0 && tiers_[i]->spec.write) first_writable_ = static_cast<int>(i);
    if (tiers_[i]->spec.on_evict != EvictPolicy::kDemote) continue;
    for (std::size_t j = i + 1; j < tiers_.size(); ++j) {
      if (tiers_[j]->spec.write) {
        tiers_[i]->demote_to = static_cast<int>(j);
        break;
      }
    }
  }
  // The first tier stores straight from the caller's regions when it copies puts inside submit
  // (gather_puts, any alignment), keeps raw payloads and no other tier needs an image.
  const Tier& first = at(first_writable_);
  gather_saves_ = first.caps.gather_puts && first.caps.io_alignment <= 1 && !first.stage &&
                  writable == 1;
  // The verification threads start now, not inside the first verified save or load, which
  // started them and waited for a new one's first chunk (docs/object-format.md).
  detail::VerifyPool::instance().prestart();
  return Status::ok();
}

std::size_t TierStack::Impl::max_image_bytes(int t, std::size_t raw_bytes) const {
  const auto& stage = at(t).stage;
  return kObjectHeaderBytes + (stage ? stage->max_encoded_size(raw_bytes) : raw_bytes);
}

Region TierStack::Impl::io_region(int t, ImageBuffer& image) const {
  const std::size_t align = std::min<std::size_t>(at(t).caps.io_alignment, ImageBuffer::kPage);
  const std::size_t n = align > 1 ? (image.size() + align - 1) / align * align : image.size();
  return Region{image.data(), n, MemoryKind::kHost, -1};
}

Result<Image> TierStack::Impl::make_image(int t, const ObjectKey& key, std::uint32_t format_id,
                                          std::span<const std::byte> raw) {
  const auto& stage = at(t).stage;
  if (!stage) {
    Image img = pool_.acquire(kObjectHeaderBytes + raw.size());
    std::memcpy(img->data() + kObjectHeaderBytes, raw.data(), raw.size());
    seal_object(img->span(), format_id, 0, key);
    return img;
  }
  Image img = pool_.acquire(kObjectHeaderBytes + stage->max_encoded_size(raw.size()));
  auto n = stage->encode(format_id, raw, img->span().subspan(kObjectHeaderBytes));
  if (!n) return n.status();
  img->resize(kObjectHeaderBytes + *n);
  seal_object(img->span(), format_id, stage->stage_id(), key);
  return img;
}

Result<TierStack::Impl::RawPayload> TierStack::Impl::raw_payload(
    int t, std::span<const std::byte> image) {
  auto h = parse_object_header(image);
  if (!h) return h.status();
  RawPayload raw{.bytes = image.subspan(kObjectHeaderBytes, h->payload_bytes),
                 .format_id = h->format_id};
  if (h->stage_id == 0) return raw;
  const auto& stage = at(t).stage;
  if (!stage || stage->stage_id() != h->stage_id)
    return Status(Code::kChecksumMismatch,
                  fmt::format("object was written by stage {}, which tier {} does not use",
                              h->stage_id, at(t).spec.name));
  auto size = stage->decoded_size(raw.bytes, h->format_id);
  if (!size) return size.status();
  raw.holder = pool_.acquire(*size);
  auto n = stage->decode(raw.bytes, h->format_id, raw.holder->span());
  if (!n) {
    recycle(raw.holder);
    return n.status();
  }
  raw.bytes = std::span<const std::byte>(raw.holder->data(), *n);
  return raw;
}

Result<std::uint64_t> TierStack::Impl::submit_one(int t, Op op, const ObjectKey& key, Region buf,
                                                  Pending p) {
  const auto now = Clock::now();
  std::uint64_t id;
  {
    std::lock_guard lock(mu_);
    id = enter_locked(t, op, std::move(p), now).first;
  }
  const IoRequest req{op, key, buf, id};
  Status why;
  if (submit_requests(t, std::span(&req, 1), &why) == 0) return why;
  return id;
}

std::pair<std::uint64_t, TierStack::Impl::Pending*> TierStack::Impl::PendingTable::insert(
    Pending&& p) {
  std::uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= std::numeric_limits<std::uint32_t>::max())
      throw std::bad_alloc();  // more requests in flight than an id can name
    free_.reserve(slots_.size() + 1);
    slots_.emplace_back();
    slot = static_cast<std::uint32_t>(slots_.size() - 1);
  }
  Slot& s = slots_[slot];
  s.id = (sequence_++ << 32) | (std::uint64_t{slot} + 1);
  s.p = std::move(p);
  return {s.id, &s.p};
}

TierStack::Impl::PendingTable::Slot* TierStack::Impl::PendingTable::slot_of(
    std::uint64_t id) noexcept {
  const std::uint64_t slot = (id & 0xffffffffu) - 1;  // id 0: slot 2^64 - 1, none
  if (slot >= slots_.size() || slots_[slot].id != id) return nullptr;
  return &slots_[slot];
}

TierStack::Impl::Pending* TierStack::Impl::PendingTable::find(std::uint64_t id) noexcept {
  Slot* s = slot_of(id);
  return s != nullptr ? &s->p : nullptr;
}

void TierStack::Impl::PendingTable::erase(std::uint64_t id) noexcept {
  Slot* s = slot_of(id);
  if (s == nullptr) return;
  s->p = Pending{};  // its image goes back now
  s->id = 0;
  free_.push_back(static_cast<std::uint32_t>((id & 0xffffffffu) - 1));  // reserved: no allocation
  // Empty after a large batch: its memory goes back (a table keeps no more than it needs now).
  if (free_.size() == slots_.size() && slots_.size() > kKeptSlots) {
    slots_.clear();
    slots_.shrink_to_fit();
    free_.clear();
    free_.shrink_to_fit();
  }
}

void TierStack::Impl::PendingTable::clear() noexcept {
  slots_.clear();
  free_.clear();
}

std::size_t TierStack::Impl::submit_requests(int t, std::span<const IoRequest> reqs, Status* why) {
  std::size_t taken = 0;
  std::optional<Clock::time_point> deadline;  // from the first time the queue is full
  while (taken < reqs.size()) {
    auto r = call(t, [&](Backend& b) { return b.submit(reqs.subspan(taken)); });
    if (r && *r > 0) {
      taken += *r;
      continue;
    }
    if (r && !deadline) deadline = Clock::now() + op_timeout_;
    if (!r || Clock::now() > *deadline) {
      if (why != nullptr) *why = r ? Status(Code::kTimedOut, "tier queue stayed full") : r.status();
      std::lock_guard lock(mu_);
      for (std::size_t k = taken; k < reqs.size(); ++k) pending_.erase(reqs[k].user_data);
      break;
    }
    std::unique_lock lock(mu_);  // queue full: make room
    wait_once(t, kGatedSlice, lock);
  }
  drain_evictions();
  return taken;
}

std::pair<std::uint64_t, TierStack::Impl::Pending*> TierStack::Impl::enter_locked(
    int t, Op op, Pending p, Clock::time_point submitted) {
  p.tier = t;
  p.op = op;
  p.submitted = submitted;
  return pending_.insert(std::move(p));
}

TierStack::Impl::RequestBatch::RequestBatch(Op op, std::size_t most, std::uint64_t due_bytes)
    : op(op), most(std::min(most, kScatterBatch)), due_bytes(due_bytes) {
  reqs.reserve(this->most);
  items.reserve(this->most);
  if (op == Op::kGet) formats.reserve(this->most);
}

bool TierStack::Impl::RequestBatch::add(const IoRequest& r, std::size_t item,
                                        std::uint64_t payload_bytes, std::uint32_t format_id) {
  if (reqs.empty()) started = Clock::now();
  reqs.push_back(r);
  items.push_back(item);
  if (op == Op::kGet) formats.push_back(format_id);
  bytes += payload_bytes;
  return reqs.size() == most || bytes >= due_bytes;
}

template <class Refused>
bool TierStack::Impl::submit_batch(int t, RequestBatch& b, std::span<std::uint64_t> ids,
                                   Refused&& refused) {
  const std::size_t n = b.reqs.size();
  if (n == 0) return false;
  auto empty = [&] {
    b.reqs.clear();
    b.items.clear();
    b.formats.clear();
    b.bytes = 0;
  };
  std::array<Pending*, kScatterBatch> entries;  // stay put while pending
  std::size_t entered = 0;
  try {
    std::lock_guard lock(mu_);
    for (; entered < n; ++entered)
      std::tie(b.reqs[entered].user_data, entries[entered]) =
          enter_locked(t, b.op, Pending{}, b.started);
  } catch (const std::bad_alloc&) {  // the table could not grow: none of the batch goes
    std::lock_guard lock(mu_);
    for (std::size_t k = 0; k < entered; ++k) pending_.erase(b.reqs[k].user_data);
    for (std::size_t k = 0; k < n; ++k) {
      ids[b.items[k]] = 0;
      refused(b.items[k], Status(Code::kNoSpace, "out of memory for pending requests"));
    }
    empty();
    return false;
  }
  // Not submitted yet: nothing else reads these entries.
  for (std::size_t k = 0; k < n; ++k) {
    IoRequest& r = b.reqs[k];
    ids[b.items[k]] = r.user_data;
    if (b.op != Op::kGet) continue;
    write_object_header(entries[k]->header,
                        ObjectHeader{b.formats[k], 0, r.key, r.skip + total_bytes(r.tail), 0});
    r.buf = host_region(std::span<std::byte>(entries[k]->header));
  }
  Status why;
  const std::size_t taken = submit_requests(t, b.reqs, &why);
  for (std::size_t k = taken; k < n; ++k) {
    ids[b.items[k]] = 0;
    refused(b.items[k], why);
  }
  empty();
  reap(t, 0, {});
  return true;
}

bool TierStack::Impl::poll_and_route(int t, std::size_t min, std::chrono::microseconds wait) {
  Tier& tier = at(t);
  // The thread's own arrays: built once, not on every call (a save reaps after each submit, and
  // constructing and destroying 64 completions and 64 images each time cost about 0.15 us).
  thread_local std::array<Completion, 64> batch;
  thread_local std::array<Image, 64> done;  // images free now: recycled without the lock
  Result<std::size_t> r = std::size_t{0};
  const std::size_t want = std::min<std::size_t>(min, batch.size());
  if (tier.caps.concurrent) {
    r = tier.backend->poll(batch, want, wait);
  } else {
    tier.gate.enter();
    r = tier.backend->poll(batch, want, wait);
    if (wait.count() > 0) tier.gate.leave_and_let_in();
    else tier.gate.leave();
  }
  if (!r || *r == 0) return false;
  bool foreground = false;
  std::size_t waiting;
  const auto now = Clock::now();
  DurationRun notes(*this);  // noted when this returns, after the lock
  {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < *r; ++i) {
      Pending* found = pending_.find(batch[i].user_data);
      if (found == nullptr) continue;
      Pending& p = *found;
      p.reaped = now;
      if (p.op == Op::kPut || p.op == Op::kGet)
        notes.note(p.op == Op::kPut ? StackOp::kPut : StackOp::kGet, t, p.submitted, now);
      if (!p.background) {
        p.done = std::move(batch[i]);
        p.finished = true;
        foreground = true;
        // A reaped put no longer reads its image: back to the pool now, while still in cache.
        if (p.op == Op::kPut) done[i] = std::move(p.image);
        continue;
      }
      bg_bytes_ -= p.charged;
      --bg_count_;
      if (p.op == Op::kPut && !batch[i].status.is_ok() &&
          !(batch[i].status == Code::kAlreadyExists))
        tier.backend->metrics().dropped_saves.add();
      done[i] = std::move(p.image);
      pending_.erase(batch[i].user_data);
    }
    waiting = waiting_;
  }
  for (std::size_t i = 0; i < *r; ++i) recycle(done[i]);
  if (foreground && waiting > 0) routed_.notify_all();
  return foreground;
}

void TierStack::Impl::reap(int t, std::size_t min, std::chrono::microseconds wait) {
  poll_and_route(t, min, wait);
  drain_evictions();
}

void TierStack::Impl::wait_once(int t, std::chrono::microseconds wait,
                                std::unique_lock<std::mutex>& lock) {
  Tier& tier = at(t);
  if (tier.polling) {  // its poller routes what it reaps (ours too) and wakes us
    ++waiting_;
    routed_.wait_for(lock, wait);
    --waiting_;
    return;
  }
  tier.polling = true;
  lock.unlock();
  poll_and_route(t, 1,
                 tier.caps.concurrent ? wait : std::min<std::chrono::microseconds>(wait, kGatedSlice));
  lock.lock();
  tier.polling = false;
  if (waiting_ > 0) routed_.notify_all();  // another waiter may poll now
}

void TierStack::Impl::on_evict(int t, const ObjectKey& key,
                               std::span<const std::byte> image) noexcept {
  const Tier& tier = at(t);
  if (tier.demote_to < 0 || image.empty()) return;
  try {
    Image copy = pool_.acquire(image.size());
    std::memcpy(copy->data(), image.data(), image.size());
    std::lock_guard lock(mu_);
    evicted_.push_back(Evicted{t, key, std::move(copy)});
    evicted_count_.fetch_add(1, std::memory_order_release);
  } catch (...) {
    counters_.demotions_dropped.add();
  }
}

void TierStack::Impl::drain_evictions() {
  for (;;) {
    // An eviction queued after this read is drained by the next call (every submit and reap
    // makes one), as one queued after the lock's check was before.
    if (evicted_count_.load(std::memory_order_acquire) == 0) return;
    Evicted e;
    {
      std::lock_guard lock(mu_);
      if (evicted_.empty()) return;
      e = std::move(evicted_.front());
      evicted_.pop_front();
      evicted_count_.fetch_sub(1, std::memory_order_relaxed);
    }
    const Tier& from = at(e.tier);
    const int to = from.demote_to;
    if (bg_bytes_ + e.image->size() > max_inflight_bytes_) {
      counters_.demotions_dropped.add();
      at(to).backend->metrics().dropped_saves.add();
      recycle(e.image);
      continue;
    }
    Image image;
    const bool same_stage = (from.stage ? from.stage->stage_id() : 0) ==
                            (at(to).stage ? at(to).stage->stage_id() : 0);
    if (same_stage) {
      image = std::move(e.image);
    } else {
      auto raw = raw_payload(e.tier, e.image->span());
      if (!raw) {
        counters_.demotions_dropped.add();
        recycle(e.image);
        continue;
      }
      auto img = make_image(to, e.key, raw->format_id, raw->bytes);
      recycle(raw->holder);
      recycle(e.image);
      if (!img) {
        counters_.demotions_dropped.add();
        continue;
      }
      image = std::move(img).value();
    }
    from.backend->metrics().demotions.add();
    put_background(to, e.key, std::move(image), true);
  }
}

void TierStack::Impl::put_background(int t, const ObjectKey& key, Image image, bool demotion) {
  const std::uint64_t bytes = image->size();
  {
    std::lock_guard lock(mu_);
    if (bg_bytes_ + bytes > max_inflight_bytes_) {
      (demotion ? counters_.demotions_dropped : counters_.writethrough_dropped).add();
      at(t).backend->metrics().dropped_saves.add();
      return;
    }
    bg_bytes_ += bytes;
    ++bg_count_;
  }
  Region buf = io_region(t, *image);
  Pending p;
  p.background = true;
  p.image = std::move(image);
  p.charged = bytes;
  if (!submit_one(t, Op::kPut, key, buf, std::move(p))) {
    std::lock_guard lock(mu_);
    bg_bytes_ -= bytes;
    --bg_count_;
    at(t).backend->metrics().dropped_saves.add();
  }
}

void TierStack::Impl::wait_for(std::span<const std::uint64_t> ids, Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  for (;;) {
    int waiting_tier = -1;
    for (std::uint64_t id : ids) {
      const Pending* p = pending_.find(id);
      if (p != nullptr && !p->finished) {
        waiting_tier = p->tier;
        break;
      }
    }
    if (waiting_tier < 0) break;
    auto now = Clock::now();
    if (now >= deadline) {
      // Timed out: the tier still owns the buffers, so the requests become background work
      // whose late completions are discarded; the caller sees TimedOut.
      for (std::uint64_t id : ids) {
        Pending* p = pending_.find(id);
        if (p == nullptr || p->finished) continue;
        p->background = true;
        p->charged = 0;
        ++bg_count_;
        timed_out_.insert(id);
      }
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now);
    wait_once(waiting_tier, std::min(left, kConcurrentSlice), lock);
  }
  lock.unlock();
  drain_evictions();
}

std::size_t TierStack::Impl::finished_prefix(std::span<const std::uint64_t> ids) {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (; n < ids.size(); ++n) {
    if (ids[n] == 0) continue;
    const Pending* p = pending_.find(ids[n]);
    if (p == nullptr || !p->finished) break;
  }
  return n;
}

Completion TierStack::Impl::take_locked(std::uint64_t id, Clock::time_point* reaped,
                                        Image& image) {
  // Where no completion came, its duration ends now.
  auto unreaped = [&] {
    if (reaped != nullptr) *reaped = Clock::now();
  };
  if (!timed_out_.empty() && timed_out_.erase(id) > 0) {
    unreaped();
    return Completion{id, Status(Code::kTimedOut, "the tier did not answer in time"), 0};
  }
  Pending* p = pending_.find(id);
  if (p == nullptr || !p->finished) {
    unreaped();
    return Completion{id, Status(Code::kBadState, "completion taken twice"), 0};
  }
  if (reaped != nullptr) *reaped = p->reaped;
  Completion c = std::move(p->done);
  image = std::move(p->image);
  pending_.erase(id);
  return c;
}

Completion TierStack::Impl::take(std::uint64_t id, Clock::time_point* reaped) {
  Image image;
  Completion c;
  {
    std::lock_guard lock(mu_);
    c = take_locked(id, reaped, image);
  }
  recycle(image);
  return c;
}

void TierStack::Impl::take_all(std::span<const std::uint64_t> ids, std::span<Completion> out,
                               std::span<Clock::time_point> reaped) {
  std::array<Image, kTakeChunk> images;  // recycled after the lock
  const std::size_t n = std::min(ids.size(), kTakeChunk);
  {
    std::lock_guard lock(mu_);
    for (std::size_t k = 0; k < n; ++k)
      if (ids[k] != 0)
        out[k] = take_locked(ids[k], reaped.empty() ? nullptr : &reaped[k], images[k]);
  }
  for (std::size_t k = 0; k < n; ++k) recycle(images[k]);
}

Result<std::size_t> TierStack::Impl::lookup_prefix(std::span<const ObjectKey> keys) {
  Call call_{*this};
  std::vector<char> found(keys.size(), 0);
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t]->spec.read) continue;
    std::vector<std::uint64_t> ids(keys.size(), 0);
    bool any = false;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (found[i]) continue;
      ids[i] = submit_one(static_cast<int>(t), Op::kContains, keys[i], Region{}, Pending{})
                   .value_or(0);
      any |= ids[i] != 0;
    }
    if (!any) continue;
    reap(static_cast<int>(t), 0, {});
    wait_for(ids);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (ids[i] != 0 && take(ids[i]).status.is_ok()) found[i] = 1;
  }
  std::size_t n = 0;
  while (n < keys.size() && found[n]) ++n;
  return n;
}

Result<LeaseId> TierStack::Impl::lease(std::span<const ObjectKey> keys,
                                       std::chrono::milliseconds ttl,
                                       std::span<std::uint8_t> held) {
  Call call_{*this};
  if (held.size() != keys.size()) return Status::invalid("lease: held.size() != keys.size()");
  std::fill(held.begin(), held.end(), std::uint8_t{0});
  const auto now = Clock::now();
  std::vector<std::pair<int, LeaseId>> ended;  // parts of leases past their deadline
  {
    std::lock_guard lock(mu_);
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      ended.insert(ended.end(), it->second.parts.begin(), it->second.parts.end());
      it = leases_.erase(it);
    }
  }
  for (const auto& part : ended) call(part.first, [&](Backend& b) { b.release(part.second); });
  if (ttl > kMaxLeaseTtl) ttl = kMaxLeaseTtl;  // also keeps now + ttl from overflowing
  StackLease lease{now + ttl, {}};
  std::vector<ObjectKey> want;
  std::vector<std::size_t> where;  // want[j] is keys[where[j]]
  std::vector<std::uint8_t> got;
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t]->spec.read) continue;
    const int tier = static_cast<int>(t);
    want.clear();
    where.clear();
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!held[i]) {
        want.push_back(keys[i]);
        where.push_back(i);
      }
    if (want.empty()) break;
    got.assign(want.size(), 0);
    auto id = call(tier, [&](Backend& b) { return b.lease(want, ttl, got); });
    if (!id && id.status() == Code::kNotSupported) {
      // Best effort: present now, not held.
      std::vector<std::uint64_t> ids(want.size(), 0);
      for (std::size_t j = 0; j < want.size(); ++j)
        ids[j] = submit_one(tier, Op::kContains, want[j], Region{}, Pending{}).value_or(0);
      wait_for(ids);
      for (std::size_t j = 0; j < want.size(); ++j)
        if (ids[j] != 0 && take(ids[j]).status.is_ok()) got[j] = 1;
    } else if (id && *id != 0) {
      lease.parts.emplace_back(tier, *id);
    }
    for (std::size_t j = 0; j < want.size(); ++j)
      if (got[j]) held[where[j]] = 1;
  }
  if (lease.parts.empty()) return LeaseId{0};
  std::lock_guard lock(mu_);
  const LeaseId id = next_lease_++;
  leases_.emplace(id, std::move(lease));
  return id;
}

void TierStack::Impl::release(LeaseId id) {
  Call call_{*this};
  StackLease lease;
  {
    std::lock_guard lock(mu_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    lease = std::move(it->second);
    leases_.erase(it);
  }
  for (const auto& part : lease.parts)
    call(part.first, [&](Backend& b) { b.release(part.second); });
}

std::size_t TierStack::Impl::active_leases() {
  std::lock_guard lock(mu_);
  return leases_.size();
}

Result<int> TierStack::Impl::locate(const ObjectKey& key) {
  Call call_{*this};
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t]->spec.read) continue;
    auto id = submit_one(static_cast<int>(t), Op::kContains, key, Region{}, Pending{});
    if (!id) continue;
    reap(static_cast<int>(t), 0, {});
    wait_for(std::span(&*id, 1));
    if (take(*id).status.is_ok()) return static_cast<int>(t);
  }
  return -1;
}

std::optional<IoRequest> TierStack::Impl::gathered_put(const SaveItem& item, const Codec& codec,
                                                       std::span<std::byte> header, Status& out) {
  auto size = codec.encoded_size(item.src);  // host regions only
  if (!size) {
    out = size.status();
    return std::nullopt;
  }
  // A tier that seals puts hashes the payload as it copies it (Capabilities::seals_puts).
  const std::uint64_t sum =
      at(first_writable_).caps.seals_puts ? 0 : payload_checksum(item.src);
  write_object_header(header, ObjectHeader{codec.format_id(), 0, item.key, *size, sum});
  return IoRequest{Op::kPut, item.key, host_region(header), 0, item.src};
}

void TierStack::Impl::save_one(int first, const SaveItem& item, const Codec& codec,
                               std::uint64_t& id, Status& out) {
  auto size = codec.encoded_size(item.src);
  if (!size) {
    out = size.status();
    return;
  }
  // Encode once into a raw image; stage tiers transcode from its payload.
  Image raw = pool_.acquire(kObjectHeaderBytes + *size);
  auto n = codec.encode(item.src, raw->span().subspan(kObjectHeaderBytes));
  if (!n) {
    out = n.status();
    recycle(raw);
    return;
  }
  counters_.staging_copy_bytes.add(*n);
  raw->resize(kObjectHeaderBytes + *n);
  seal_object(raw->span(), codec.format_id(), 0, item.key);
  std::span<const std::byte> payload(raw->data() + kObjectHeaderBytes, *n);
  for (std::size_t t = static_cast<std::size_t>(first); t < tiers_.size(); ++t) {
    if (!tiers_[t]->spec.write) continue;
    Image image = raw;
    if (tiers_[t]->stage) {
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

Status TierStack::Impl::save(std::span<const SaveItem> items, const Codec& codec,
                             std::span<Status> out) {
  if (out.size() != items.size()) return Status::invalid("save: out.size() != items.size()");
  Call call_{*this};
  const auto start = Clock::now();
  const int first = first_writable_;
  const Capabilities& caps = at(first).caps;
  // Gathered when the payload is the regions' bytes (Codec::direct, no framing) and the regions
  // are host memory of kinds the tier takes: only the header is built here.
  auto direct = [&](RegionList src) {
    if (!std::all_of(src.begin(), src.end(), [&](const Region& r) {
          return r.host_accessible() && (caps.memory_kinds & kind_bit(r.kind)) != 0;
        }))
      return false;
    auto form = codec.direct(src);
    return form && form->framing == 0;  // a framed payload is written by encode()
  };
  std::vector<std::uint64_t> ids(items.size(), 0);
  // Gathered puts go to the tier together: up to kScatterBatch of them, or as many as hold
  // kGatherSubmitBytes of payload (the bytes hashed for their headers, where the tier does not
  // seal them itself, are still in this core's cache when the tier copies them; a tier that seals
  // them takes kScatterSubmitBytes), in one submit with one look at what finished. The tier has
  // copied the headers and the regions when submit returns (gather_puts). Each carries the
  // payload bytes of the whole call (IoRequest::batch_bytes).
  struct alignas(64) HeaderBytes {
    std::array<std::byte, kObjectHeaderBytes> bytes;
  };
  std::vector<HeaderBytes> headers(gather_saves_ ? std::min(items.size(), kScatterBatch) : 0);
  RequestBatch gathered(Op::kPut, headers.size(),
                        caps.seals_puts ? kScatterSubmitBytes : kGatherSubmitBytes);
  // Each item's payload bytes, checked once (kRefused: not submitted, its status in `out`), and
  // their sum, the whole call's (saturating).
  constexpr std::size_t kRefused = SIZE_MAX;  // above kMaxPayloadBytes
  std::vector<std::size_t> payload(items.size());
  std::uint64_t batch_bytes = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    auto bytes = caller_payload_bytes(items[i].src);
    payload[i] = bytes ? *bytes : kRefused;
    if (!bytes)
      out[i] = bytes.status();  // counted as a failure below
    else if (add_overflows<std::uint64_t>(batch_bytes, *bytes, &batch_bytes))
      batch_bytes = UINT64_MAX;
  }
  auto submit_gathered = [&] {
    submit_batch(first, gathered, ids, [&](std::size_t item, const Status& why) {
      out[item] = why;
    });
  };
  counters_.saves.add(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (payload[i] == kRefused) continue;
    if (gather_saves_ && direct(items[i].src)) {
      auto req = gathered_put(items[i], codec, headers[gathered.reqs.size()].bytes, out[i]);
      if (req) req->batch_bytes = batch_bytes;
      if (req && gathered.add(*req, i, payload[i])) submit_gathered();
    } else {
      submit_gathered();  // first, so that the tier sees the puts in item order
      save_one(first, items[i], codec, ids[i], out[i]);
      // Puts the first tier finished already (a cpu tier copies inside submit) return their
      // images to the pool, so the next item encodes into a buffer that is still in cache.
      reap(first, 0, {});
    }
  }
  submit_gathered();
  wait_for(ids);
  // Taken kTakeChunk at a time under one lock; the counters and durations added once per run.
  std::array<Completion, kTakeChunk> done;
  std::array<Clock::time_point, kTakeChunk> reaped;
  std::uint64_t saved_bytes = 0, failures = 0;
  DurationRun notes(*this);
  for (std::size_t first_item = 0; first_item < items.size(); first_item += kTakeChunk) {
    const std::size_t n = std::min(kTakeChunk, items.size() - first_item);
    take_all(std::span(ids).subspan(first_item, n), done, reaped);
    const auto unsubmitted = Clock::now();  // the end of the items never submitted
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = first_item + k;
      if (ids[i] == 0) {
        if (out[i].is_ok()) out[i] = Status(Code::kBadState, "not submitted");
        ++failures;
        notes.note(StackOp::kSave, first, start, unsubmitted);
        continue;
      }
      notes.note(StackOp::kSave, first, start, reaped[k]);
      const Completion& c = done[k];
      if (c.status.is_ok() || c.status == Code::kAlreadyExists) {
        out[i] = Status::ok();
        saved_bytes += c.bytes;
      } else {
        out[i] = c.status;
        ++failures;
      }
    }
  }
  counters_.saved_bytes.add(saved_bytes);
  counters_.save_failures.add(failures);
  return Status::ok();
}

Status TierStack::Impl::load(std::span<const LoadItem> items, const Codec& codec,
                             std::span<LoadResult> out) {
  if (out.size() != items.size()) return Status::invalid("load: out.size() != items.size()");
  Call call_{*this};
  const auto start = Clock::now();
  std::vector<std::size_t> raw_size(items.size(), 0);
  std::vector<char> unserved(items.size(), 1);
  counters_.loads.add(items.size());
  auto codec_of = [&](std::size_t i) -> const Codec& {
    return items[i].codec ? *items[i].codec : codec;
  };
  std::uint64_t batch_bytes = 0;  // the whole call's payload (IoRequest::batch_bytes), saturating
  for (std::size_t i = 0; i < items.size(); ++i) {
    out[i] = LoadResult{Status::not_found(), -1};
    auto size = caller_payload_bytes(items[i].dst);
    if (size) size = codec_of(i).encoded_size(items[i].dst);
    if (!size) {
      out[i].status = size.status();
      unserved[i] = 0;
      continue;
    }
    raw_size[i] = *size;
    if (add_overflows<std::uint64_t>(batch_bytes, *size, &batch_bytes)) batch_bytes = UINT64_MAX;
  }
  bool above_writable = false;  // a faster writable tier that a hit would be promoted into
  std::vector<std::uint64_t> ids(items.size());
  std::vector<Image> bufs(items.size());
  // Scattered gets go to a tier together, up to kScatterBatch or kScatterSubmitBytes of payload
  // per submit (a pinned tier then moves them in large transfers instead of one by one): the
  // requests not yet submitted. Each carries the payload bytes of the whole call (batch_bytes).
  RequestBatch scattered(Op::kGet, items.size(), kScatterSubmitBytes);
  std::array<Completion, kTakeChunk> done;  // served items' completions (serve below)
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (t > 0 && tiers_[t - 1]->spec.write) above_writable = true;
    if (!tiers_[t]->spec.read) continue;
    const int tier = static_cast<int>(t);
    // A tier that takes scattered gets writes the payload straight into the caller's regions
    // (host or device memory) when that is all a hit needs: a codec whose payload is the regions'
    // bytes (Codec::direct), no stage, nothing to promote into.
    const Capabilities& caps = tiers_[t]->caps;
    const bool scatter =
        caps.scatter_gets && caps.io_alignment <= 1 && !tiers_[t]->stage && !above_writable;
    // Item i's direct form when this tier can take it: the framing plus the regions make the
    // whole payload.
    auto direct = [&](std::size_t i) -> std::optional<DirectPayload> {
      RegionList dst = items[i].dst;
      if (!tail_on_one_side(dst) ||
          !std::all_of(dst.begin(), dst.end(), [&](const Region& r) {
            return r.size == 0 || (caps.memory_kinds & kind_bit(r.kind)) != 0;
          }))
        return std::nullopt;
      auto form = codec_of(i).direct(dst);
      if (!form || form->framing + total_bytes(dst) != raw_size[i]) return std::nullopt;
      return *form;
    };
    std::fill(ids.begin(), ids.end(), 0);
    bool submitted = false;  // since the last look at what finished (nothing else finishes gets)
    auto submit_scattered = [&] {
      if (submit_batch(tier, scattered, ids, [](std::size_t, const Status&) {})) submitted = true;
    };
    // Gets are served in item order as they finish: a tier that completes inside submit (the
    // cpu tier) has its image decoded while still in cache and the buffer reused by the next get;
    // a tier whose gets finish over time (the disk) has its first images decoded while later ones
    // are still being read.
    std::size_t served = 0;
    auto serve = [&](std::size_t n) {  // the next n items, their completions taken together
      const auto now = Clock::now();  // when the scattered ones among them were served
      DurationRun notes(*this);
      while (n > 0) {
        const std::size_t m = std::min(n, kTakeChunk);
        take_all(std::span(ids).subspan(served, m), done);
        for (std::size_t k = 0; k < m; ++k, ++served)
          serve_get(tier, items[served], codec_of(served), ids[served], std::move(done[k]),
                    bufs[served], out[served], unserved[served], start, now, notes);
        n -= m;
      }
    };
    for (std::size_t i = 0; i < items.size(); ++i) {
      std::optional<DirectPayload> form;
      if (unserved[i] && scatter && raw_size[i] > 0) form = direct(i);
      if (form) {
        // Its buf, the header it accepts, is made when the batch goes (submit_batch).
        if (scattered.add(IoRequest{Op::kGet, items[i].key, Region{}, 0, items[i].dst,
                                    form->framing, form->check, batch_bytes},
                          i, raw_size[i], codec_of(i).format_id()))
          submit_scattered();
        continue;
      }
      if (unserved[i]) {
        submit_scattered();  // first, so that the tier sees the gets in item order
        bufs[i] = pool_.acquire(max_image_bytes(tier, raw_size[i]));
        Pending p;
        p.image = bufs[i];
        ids[i] = submit_one(tier, Op::kGet, items[i].key, io_region(tier, *bufs[i]), std::move(p))
                     .value_or(0);
        submitted = true;
        reap(tier, 0, {});
      }
      // Up to the first item still in `scattered` (id 0 until it is submitted).
      const std::size_t upto = scattered.items.empty() ? i + 1 : scattered.items.front();
      if (std::exchange(submitted, false) && upto > served)
        serve(finished_prefix(std::span(ids).subspan(served, upto - served)));
    }
    submit_scattered();
    // The rest: what finished already, then a wait for the next one (served whatever it became,
    // finished or timed out), one deadline for them all.
    const auto deadline = Clock::now() + op_timeout_;
    while (served < items.size()) {
      std::size_t ready = finished_prefix(std::span(ids).subspan(served));
      if (ready == 0) {
        wait_for(std::span(ids).subspan(served, 1), deadline);
        ready = 1;
      }
      serve(ready);
    }
  }
  const auto end = Clock::now();
  std::size_t missed = 0, refused = 0, first_refused = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (out[i].status.is_ok()) continue;
    ++missed;
    if (out[i].status == Code::kInvalidArgument && refused++ == 0) first_refused = i;
  }
  counters_.load_misses.add(missed);
  note_duration(StackOp::kLoad, -1, end - start, missed);
  if (refused > 0 && log_enabled(LogLevel::kWarn))  // a caller's mistake, reported per key only
    log(LogLevel::kWarn,
        fmt::format("load: {} of {} items refused; item {} (key {}): {}", refused, items.size(),
                    first_refused, items[first_refused].key.to_string(),
                    out[first_refused].status.message()));
  return Status::ok();
}

Status TierStack::Impl::wrong_size(int t, const LoadItem& item, const Codec& codec,
                                   std::size_t image_bytes) const {
  const std::size_t want = codec.encoded_size(item.dst).value_or(0);
  const auto& stage = at(t).stage;
  if (stage)
    return Status::invalid(fmt::format(
        "tier {} stores an image of {} bytes (stage {}), more than a payload of {} bytes takes: "
        "the regions do not match the stored object; nothing written",
        at(t).spec.name, image_bytes, stage->name(), want));
  return Status::invalid(
      fmt::format("stored payload is {} bytes, these regions take {}: nothing written",
                  image_bytes - kObjectHeaderBytes, want));
}

void TierStack::Impl::serve_get(int t, const LoadItem& item, const Codec& codec,
                                std::uint64_t id, Completion c, Image& buf, LoadResult& out,
                                char& unserved, Clock::time_point start, Clock::time_point now,
                                DurationRun& notes) {
  if (id == 0) return;
  if (!c.status.is_ok()) {
    // The tier refused the image for its size (a buffer too small, a scattered get's payload
    // of another size): say both sizes.
    const bool wrong_sized =
        c.status == Code::kInvalidArgument && c.bytes > kObjectHeaderBytes &&
        (at(t).stage ? buf && c.bytes > buf->size()
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
  const bool decoded = static_cast<bool>(buf);
  if (decoded) {
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
  notes.note(StackOp::kLoad, t, start, decoded ? Clock::now() : now);
}

Status TierStack::Impl::serve_load(int t, const LoadItem& item, const Codec& codec,
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
  counters_.staging_copy_bytes.add(raw->bytes.size());
  promote(t, item.key, raw->format_id, raw->bytes);
  recycle(raw->holder);
  return Status::ok();
}

void TierStack::Impl::promote(int t, const ObjectKey& key, std::uint32_t format_id,
                              std::span<const std::byte> raw) {
  for (int u = 0; u < t; ++u) {
    if (!at(u).spec.write) continue;
    auto img = make_image(u, key, format_id, raw);
    if (!img) continue;
    at(t).backend->metrics().promotions.add();
    put_background(u, key, std::move(img).value(), false);
  }
}

void TierStack::Impl::remove_background(int t, const ObjectKey& key) {
  {
    std::lock_guard lock(mu_);
    ++bg_count_;
  }
  Pending p;
  p.background = true;
  if (!submit_one(t, Op::kRemove, key, Region{}, std::move(p))) {
    std::lock_guard lock(mu_);
    --bg_count_;
  }
}

void TierStack::Impl::remove_from(int t, std::span<const ObjectKey> keys, std::span<Status> got) {
  std::fill(got.begin(), got.end(), Status::ok());
  std::vector<std::uint64_t> ids(keys.size(), 0);
  // Up to kScatterBatch removes per submit, then one wait for all of them.
  RequestBatch batch(Op::kRemove, keys.size(), std::numeric_limits<std::uint64_t>::max());
  auto submit = [&] {
    submit_batch(t, batch, ids, [&](std::size_t i, const Status& why) { got[i] = why; });
  };
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (batch.add(IoRequest{Op::kRemove, keys[i], Region{}, 0}, i, 0, 0)) submit();
  submit();
  wait_for(ids);
  std::array<Completion, kTakeChunk> done;
  for (std::size_t first = 0; first < keys.size(); first += kTakeChunk) {
    const std::size_t n = std::min(kTakeChunk, keys.size() - first);
    take_all(std::span(ids).subspan(first, n), done, {});
    for (std::size_t k = 0; k < n; ++k)
      if (ids[first + k] != 0) got[first + k] = std::move(done[k].status);
  }
}

Status TierStack::Impl::remove(std::span<const ObjectKey> keys, std::span<Status> out) {
  if (out.size() != keys.size()) return Status::invalid("remove: out.size() != keys.size()");
  Call call_{*this};
  std::fill(out.begin(), out.end(), Status::ok());
  std::vector<Status> got(keys.size());
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    remove_from(static_cast<int>(t), keys, got);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!got[i].is_ok() && !(got[i] == Code::kNotFound) && out[i].is_ok())
        out[i] = std::move(got[i]);
  }
  return Status::ok();
}

Result<std::uint64_t> TierStack::Impl::clear(const Key128& ns) {
  Call call_{*this};
  Status result;
  std::uint64_t removed = 0;
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    const int tier = static_cast<int>(t);
    auto keys = call(tier, [&](Backend& b) { return b.list_keys(ns); });
    if (!keys) {
      if (result.is_ok()) result = keys.status();
      continue;
    }
    std::erase_if(*keys, [&](const ObjectKey& k) { return !(k.ns == ns); });
    std::vector<Status> got(keys->size());
    remove_from(tier, *keys, got);
    for (const Status& c : got) {
      if (c.is_ok()) {
        ++removed;
      } else if (!(c == Code::kNotFound) && result.is_ok()) {
        result = c;
      }
    }
  }
  if (!result.is_ok()) return result;
  return removed;
}

void TierStack::Impl::progress() {
  Call call_{*this};
  for (std::size_t t = 0; t < tiers_.size(); ++t)
    if (tiers_[t]->backend->in_flight() > 0) poll_and_route(static_cast<int>(t), 0, {});
  drain_evictions();
}

Status TierStack::Impl::flush(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    std::size_t left;
    {
      std::lock_guard lock(mu_);
      left = bg_count_ + evicted_.size();
    }
    if (left == 0) return Status::ok();
    if (Clock::now() >= deadline)
      return Status(Code::kTimedOut, fmt::format("{} background requests still in flight", left));
    bool polled = false;
    for (std::size_t t = 0; t < tiers_.size(); ++t) {
      if (tiers_[t]->backend->in_flight() == 0) continue;
      std::unique_lock lock(mu_);
      wait_once(static_cast<int>(t), kGatedSlice, lock);
      polled = true;
    }
    drain_evictions();
    if (!polled) std::this_thread::yield();  // in flight on another thread's submit
  }
}

TierStack::TierStack(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TierStack::~TierStack() = default;

Result<std::unique_ptr<TierStack>> TierStack::open(const Profile& profile, Registry& registry) {
  auto impl = std::make_unique<Impl>(profile);
  TIER_RETURN_IF_ERROR(impl->open(profile, registry));
  auto stack = std::unique_ptr<TierStack>(new TierStack(std::move(impl)));
  TIER_RETURN_IF_ERROR(stack->impl_->start_metrics(profile, *stack));
  return stack;
}

std::size_t TierStack::tier_count() const noexcept { return impl_->tiers_.size(); }
Backend& TierStack::tier(std::size_t i) noexcept { return *impl_->tiers_[i]->backend; }
const TierSpec& TierStack::spec(std::size_t i) const noexcept { return impl_->tiers_[i]->spec; }
const std::vector<std::string>& TierStack::skipped_tiers() const noexcept {
  return impl_->skipped_;
}
void TierStack::set_image_memory(std::shared_ptr<ImageMemory> memory) {
  impl_->set_image_memory(std::move(memory));
}
std::uint64_t TierStack::background_bytes() const noexcept { return impl_->bg_bytes_.load(); }
StackCounters& TierStack::counters() noexcept { return impl_->counters_; }
const StackCounters& TierStack::counters() const noexcept { return impl_->counters_; }
Usage TierStack::usage(std::size_t i) const noexcept { return impl_->usage(i); }
const Histogram& TierStack::op_duration(StackOp op, int tier) const noexcept {
  return impl_->op_duration(op, tier);
}
const std::string& TierStack::metrics_endpoint() const noexcept {
  return impl_->metrics_endpoint_;
}

int TierStack::find_tier(std::string_view name) const {
  for (std::size_t i = 0; i < impl_->tiers_.size(); ++i)
    if (impl_->tiers_[i]->spec.name == name) return static_cast<int>(i);
  return -1;
}

std::uint64_t TierStack::image_bytes(std::uint64_t payload_bytes) noexcept {
  return kObjectHeaderBytes + payload_bytes;
}

Result<std::size_t> TierStack::lookup_prefix(std::span<const ObjectKey> keys) {
  return impl_->lookup_prefix(keys);
}
Result<LeaseId> TierStack::lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                                 std::span<std::uint8_t> held) {
  return impl_->lease(keys, ttl, held);
}
void TierStack::release(LeaseId id) { impl_->release(id); }
std::size_t TierStack::active_leases() { return impl_->active_leases(); }
Result<int> TierStack::locate(const ObjectKey& key) { return impl_->locate(key); }
Status TierStack::save(std::span<const SaveItem> items, const Codec& codec,
                       std::span<Status> out) {
  detail::VerifyPool::Transfer busy;  // a caller of the verification pool throughout
  return impl_->save(items, codec, out);
}
Status TierStack::load(std::span<const LoadItem> items, const Codec& codec,
                       std::span<LoadResult> out) {
  detail::VerifyPool::Transfer busy;
  return impl_->load(items, codec, out);
}
Status TierStack::remove(std::span<const ObjectKey> keys, std::span<Status> out) {
  return impl_->remove(keys, out);
}
Status TierStack::remove(const ObjectKey& key) {
  Status out;
  TIER_RETURN_IF_ERROR(impl_->remove(std::span(&key, 1), std::span(&out, 1)));
  return out;
}
Result<std::uint64_t> TierStack::clear(const Key128& ns) { return impl_->clear(ns); }
Status TierStack::stat(std::span<const ObjectKey> keys, std::span<ObjectStat> out) {
  return impl_->stat(keys, out);
}
void TierStack::progress() { impl_->progress(); }
Status TierStack::flush(std::chrono::milliseconds timeout) { return impl_->flush(timeout); }

}  // namespace tier
