#include "tier/engine/scheduler.hpp"

#include <algorithm>
#include <random>
#include <string>

namespace tier::engine {

std::string_view load_action_name(LoadAction a) noexcept {
  switch (a) {
    case LoadAction::kNone:
      return "none";
    case LoadAction::kLoad:
      return "load";
    case LoadAction::kRecompute:
      return "recompute";
    case LoadAction::kHandoff:
      return "handoff";
  }
  return "unknown";
}

Result<ViewLease> TierView::lease(std::span<const Key128>, const std::optional<Boundary>&,
                                  std::chrono::milliseconds) {
  return Status(Code::kNotSupported, "this tier view cannot lease");
}

void TierView::release_lease(std::uint64_t) {}

Scheduler::Scheduler(const EngineConfig& config, TierView& view, std::uint32_t epoch)
    : config_(config),
      view_(view),
      epoch_(epoch),
      agg_(config.tp_size, config.tombstone_limit, epoch),
      next_generation_((static_cast<std::uint64_t>(epoch) << kEpochShift) + 1) {}

Result<std::unique_ptr<Scheduler>> Scheduler::create(const EngineConfig& config, TierView& view,
                                                     std::uint32_t epoch) {
  TIER_RETURN_IF_ERROR(config.validate());
  constexpr std::uint32_t kEpochMask = (1u << (64 - kEpochShift)) - 1;
  if (epoch > kEpochMask)
    return Status::invalid("scheduler epoch " + std::to_string(epoch) + " does not fit in " +
                           std::to_string(64 - kEpochShift) + " bits");
  while (epoch == 0) {
    std::random_device rd;
    epoch = rd() & kEpochMask;
  }
  return std::unique_ptr<Scheduler>(new Scheduler(config, view, epoch));
}

Scheduler::Seq* Scheduler::find(SeqHandle h) {
  auto it = seqs_.find(h);
  return it == seqs_.end() ? nullptr : &it->second;
}
const Scheduler::Seq* Scheduler::find(SeqHandle h) const {
  auto it = seqs_.find(h);
  return it == seqs_.end() ? nullptr : &it->second;
}

SeqHandle Scheduler::add_request(RequestId id, std::span<const std::uint32_t> prompt,
                                 std::string_view extra_key) {
  SeqHandle h = next_handle_++;
  Seq s;
  s.id = id;
  s.prompt.assign(prompt.begin(), prompt.end());
  s.keys = chunk_keys(config_.page_namespace, prompt, config_.chunk_tokens, false, extra_key);
  seqs_.emplace(h, std::move(s));
  order_.push_back(h);
  return h;
}

Boundary Scheduler::boundary_at(const Seq& s, std::uint64_t tokens) const {
  return Boundary{tokens, s.keys[tokens / config_.chunk_tokens - 1]};
}

void Scheduler::index_add(const Key128& k) {
  auto it = index_.find(k);
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(k);
  index_.emplace(k, lru_.begin());
  while (index_.size() > config_.commit_index_capacity) {
    index_.erase(lru_.back());
    lru_.pop_back();
  }
}

bool Scheduler::is_committed(const Boundary& b) const { return index_.count(b.key) != 0; }

Result<bool> Scheduler::committed(const Boundary& b) {
  if (index_.count(b.key) != 0) {
    index_add(b.key);
    return true;
  }
  if (revoked_.count(b.key) != 0) return false;
  TIER_ASSIGN_OR_RETURN(bool found, view_.has_commit(b));
  if (!found) return false;
  counters_.commits_rediscovered.add();
  index_add(b.key);
  return true;
}

void Scheduler::commit(const Boundary& b) {
  revoked_.erase(b.key);
  index_add(b.key);
  counters_.slot_commits.add();
  // The in-memory commit stands even if the record cannot be written; it is then lost on
  // restart, which fails closed (a miss).
  view_.put_commit(b).ignore();
}

void Scheduler::decommit(const Boundary& b) {
  auto it = index_.find(b.key);
  if (it != index_.end()) {
    lru_.erase(it->second);
    index_.erase(it);
  }
  counters_.decommits.add();
  if (view_.remove_commit(b).is_ok()) {
    revoked_.erase(b.key);
  } else {
    revoked_.insert(b.key);
  }
}

void Scheduler::release_lease(Seq& s) {
  if (s.lease == 0) return;
  view_.release_lease(s.lease);
  s.lease = 0;
}

void Scheduler::clear_lookup(Seq& s) {
  s.hit_tokens = 0;
  s.pending_slot.reset();
  s.load_armed = false;
  release_lease(s);
}

Result<std::optional<ViewLease>> Scheduler::lease_hit(const Seq& s, std::uint64_t tokens,
                                                      const std::optional<Boundary>& slot) {
  const std::uint64_t chunks = (tokens + config_.chunk_tokens - 1) / config_.chunk_tokens;
  auto l = view_.lease(std::span(s.keys).first(static_cast<std::size_t>(chunks)), slot,
                       std::chrono::milliseconds(config_.lease_timeout_ms));
  if (!l && l.status() == Code::kNotSupported) return std::optional<ViewLease>();
  if (!l) return l.status();
  return std::optional<ViewLease>(*l);
}

Result<MatchResult> Scheduler::lookup(SeqHandle h) {
  Seq* s = find(h);
  if (s == nullptr) return Status::not_found("unknown request handle");
  counters_.lookups.add();
  clear_lookup(*s);
  MatchResult m;
  if (s->keys.empty()) return m;
  TIER_ASSIGN_OR_RETURN(std::size_t chunks, view_.lookup_prefix(s->keys));
  const std::uint64_t chunk = config_.chunk_tokens;
  std::uint64_t hit = chunks * chunk;
  m.page_hit = hit;
  counters_.page_hit_tokens.add(hit);
  // Prefixes already in the tiers are not saved again.
  const std::uint64_t saved_before = s->saved;
  s->saved = std::max(s->saved, hit);
  const std::uint64_t prompt = s->prompt.size();
  if (hit >= prompt && prompt > 0) hit = prompt - 1;  // the last token is always recomputed
  if (hit == 0) return m;
  const bool leases = config_.lease_timeout_ms > 0;
  if (config_.stateful) {
    std::optional<Boundary> found;
    bool sidecar_lost = false;
    for (std::uint64_t b = hit / chunk * chunk; b >= chunk; b -= chunk) {
      Boundary cand = boundary_at(*s, b);
      TIER_ASSIGN_OR_RETURN(bool ok, committed(cand));
      if (!ok) continue;
      if (leases) {
        TIER_ASSIGN_OR_RETURN(auto l, lease_hit(*s, b, cand));
        if (l && (l->chunks * chunk < b || !l->slot)) {
          view_.release_lease(l->id);
          if (l->chunks * chunk < b) {
            // Evicted since the PAGE probe: go on below what is still there, and save the
            // missing chunks again.
            counters_.lease_shortfalls.add();
            s->saved = std::max(saved_before, std::min(s->saved, l->chunks * chunk));
            b = l->chunks * chunk + chunk;  // the loop steps down to l->chunks chunks
          } else {
            // The sidecar is gone: the boundary can never be restored, so the newest such one is
            // no longer committed (and is saved again), as a failed load of it would have it.
            counters_.sidecars_missing.add();
            if (!sidecar_lost) decommit(cand);
            sidecar_lost = true;
          }
          continue;
        }
        if (l) s->lease = l->id;
      }
      found = cand;
      break;
    }
    // Above the boundary used (all of them without one), the PAGE chunks are saved again
    // (put-if-absent: a rank that holds one refreshes its recency), as a failed load would have
    // them: the probe sees rank 0's chunks only, and a chunk another rank failed to store would
    // otherwise keep every later SLOT of this prefix from showing its PAGE prefix there.
    s->saved = std::max(saved_before, found ? found->tokens : 0);
    if (!found) {
      counters_.lookups_without_commit.add();
      return m;  // a PAGE-only stateful prefix is never a hit
    }
    hit = found->tokens;
    s->pending_slot = found;
    m.slot = found;
  } else if (leases) {
    TIER_ASSIGN_OR_RETURN(auto l, lease_hit(*s, hit, std::nullopt));
    if (l) {
      s->lease = l->id;  // it holds its leading chunks even when it found fewer
      if (l->chunks * chunk < hit) {
        counters_.lease_shortfalls.add();
        hit = l->chunks * chunk;
        s->saved = std::max(saved_before, std::min(s->saved, hit));  // save the missing again
        if (hit == 0) {
          release_lease(*s);
          return m;
        }
      }
    }
  }
  if (s->lease != 0) counters_.leased_lookups.add();
  s->hit_tokens = hit;
  m.tokens = hit;
  m.park = true;
  counters_.lookup_hit_tokens.add(hit);
  return m;
}

LoadDecision Scheduler::after_alloc(SeqHandle h, std::uint64_t local,
                                    std::span<const std::uint32_t> blocks,
                                    std::int32_t slot_group) {
  Seq* s = find(h);
  if (s == nullptr) return {LoadAction::kNone, "unknown_request"};
  s->blocks.assign(blocks.begin(), blocks.end());
  s->group = slot_group;
  // The engine's own prefix: boundaries below it were never this request's to save.
  settle_slots_below(*s, local, false);
  s->computed = std::max(s->computed, local);
  const std::uint64_t hit = s->hit_tokens;
  auto reject = [&](LoadAction a, std::string_view reason) {
    if (hit > 0) counters_.loads_skipped.add();
    if (a == LoadAction::kRecompute || a == LoadAction::kNone) clear_lookup(*s);
    return LoadDecision{a, reason};
  };
  if (hit == 0) return reject(LoadAction::kNone, "no_hit");
  if (hit <= local) return reject(LoadAction::kNone, "hbm_satisfies_after_alloc");
  if (config_.stateful && local > 0)
    return reject(LoadAction::kRecompute, "stateful_nonzero_hbm_floor");
  if (config_.stateful && (slot_group < 0 || !s->pending_slot || s->pending_slot->tokens != hit))
    return reject(LoadAction::kRecompute, "missing_destination_group");
  const std::uint64_t chunk = config_.chunk_tokens;
  if (local % chunk != 0) {
    const std::uint64_t boundary = (local + chunk - 1) / chunk * chunk;
    if (hit > boundary && hit - boundary >= config_.min_load_tokens) {
      LoadDecision d{LoadAction::kHandoff, "unaligned_hbm_prefill"};
      d.handoff_tokens = boundary;
      return d;
    }
    return reject(LoadAction::kRecompute, "unaligned_hbm_prefill");
  }
  if (hit - local < config_.min_load_tokens) return reject(LoadAction::kRecompute, "too_small");
  const std::uint64_t need_blocks = (hit + config_.block_tokens - 1) / config_.block_tokens;
  if (s->blocks.size() < need_blocks)
    return reject(LoadAction::kRecompute, "missing_destination_blocks");
  s->load_armed = true;
  s->load_start = local;
  LoadDecision d{LoadAction::kLoad, "aligned_large_hit"};
  d.load_start = local;
  d.load_end = hit;
  return d;
}

void Scheduler::set_blocks(SeqHandle h, std::span<const std::uint32_t> blocks) {
  if (Seq* s = find(h)) s->blocks.assign(blocks.begin(), blocks.end());
}

// The state group holds the state after exactly `s.computed` tokens (the engine reports every
// forward through on_computed before the step, and submit() snapshots it before the next one), so
// the only boundary that can be snapshotted now is `computed` itself: never a clamped value.
std::optional<std::uint64_t> Scheduler::slot_candidate(const Seq& s) const {
  if (!config_.stateful || s.group < 0 || s.slot_save || s.load) return std::nullopt;
  const std::uint64_t at = s.computed;
  if (at <= s.slot_settled || !config_.is_slot_boundary(at, s.prompt.size())) return std::nullopt;
  if (s.failed_slots.count(at) != 0) return std::nullopt;
  if (index_.count(s.keys[at / config_.chunk_tokens - 1]) != 0) return std::nullopt;
  return at;
}

void Scheduler::settle_slots_below(Seq& s, std::uint64_t tokens, bool count) {
  if (tokens == 0 || tokens - 1 <= s.slot_settled) return;
  if (count && config_.stateful && s.group >= 0) {
    for (std::uint64_t b : config_.slot_boundaries(s.prompt.size())) {
      if (b <= s.slot_settled || b >= tokens) continue;
      if (s.failed_slots.count(b) != 0) continue;
      if (index_.count(s.keys[b / config_.chunk_tokens - 1]) != 0) continue;
      counters_.slot_boundaries_missed.add();
    }
  }
  s.slot_settled = tokens - 1;
}

std::uint64_t Scheduler::cut_prefill_chunk(SeqHandle h, std::uint64_t start,
                                           std::uint64_t len) const {
  const Seq* s = find(h);
  if (s == nullptr || len == 0 || !config_.stateful || s->slot_save)
    return std::max<std::uint64_t>(len, 1);
  for (std::uint64_t b : config_.slot_boundaries(s->prompt.size())) {
    if (b <= start || b > start + len || b <= s->slot_settled) continue;
    if (s->failed_slots.count(b) != 0) continue;
    if (index_.count(s->keys[b / config_.chunk_tokens - 1]) != 0) continue;
    return b - start;
  }
  return len;
}

void Scheduler::on_computed(SeqHandle h, std::uint64_t computed) {
  Seq* s = find(h);
  if (s == nullptr || computed <= s->computed) return;
  // The state moves past every boundary below `computed`: one still to be snapshotted is missed
  // (counted) and never taken later, when the group holds a later state.
  settle_slots_below(*s, computed, true);
  s->computed = computed;
}

std::vector<std::uint32_t> Scheduler::blocks_of(const Seq& s, std::uint64_t start,
                                                std::uint64_t end) const {
  std::vector<std::uint32_t> out;
  const std::uint64_t bt = config_.block_tokens;
  for (std::uint64_t b = start / bt; b < (end + bt - 1) / bt && b < s.blocks.size(); ++b)
    out.push_back(s.blocks[b]);
  return out;
}

StepPlan Scheduler::build_step() {
  StepPlan plan;
  plan.step = ++step_;
  const std::uint64_t chunk = config_.chunk_tokens;
  for (SeqHandle h : order_) {
    Seq& s = seqs_.at(h);
    if (s.load_armed && !s.finished) {
      s.load_armed = false;
      LoadOp op;
      op.id = OperationId{s.id, next_generation_++};
      op.page_start = s.load_start;
      op.page_end = s.hit_tokens;
      const std::uint64_t first = s.load_start / chunk;
      const std::uint64_t last = (s.hit_tokens + chunk - 1) / chunk;
      op.chunk_keys.assign(s.keys.begin() + static_cast<std::ptrdiff_t>(first),
                           s.keys.begin() + static_cast<std::ptrdiff_t>(last));
      op.block_ids = blocks_of(s, first * chunk, last * chunk);
      if (config_.stateful) {
        op.slot = s.pending_slot;
        op.slot_group = s.group;
      }
      op.lease = s.lease;  // the worker that took it releases it when the load ends
      s.lease = 0;
      s.load = ActiveLoad{op.id.generation, s.load_start, s.hit_tokens, s.pending_slot};
      loads_.emplace(op.id.generation, LoadInflight{h, false});
      plan.loads.push_back(std::move(op));
      continue;
    }
    if (s.load) continue;  // nothing is saved while a load writes the blocks
    const std::uint64_t prompt = s.prompt.size();
    const std::uint64_t computed = std::min(s.computed, prompt);
    const std::uint64_t aligned =
        std::min<std::uint64_t>(computed / chunk * chunk, s.keys.size() * chunk);
    auto slot = slot_candidate(s);
    const bool page_due = aligned > s.saved && (s.saves.empty() || slot.has_value());
    if (!page_due && !slot) continue;
    SaveOp op;
    op.id = OperationId{s.id, next_generation_++};
    op.page_start = s.saved;
    op.page_end = std::max(aligned, s.saved);
    const std::uint64_t first = op.page_start / chunk, last = op.page_end / chunk;
    op.chunk_keys.assign(s.keys.begin() + static_cast<std::ptrdiff_t>(first),
                         s.keys.begin() + static_cast<std::ptrdiff_t>(last));
    op.block_ids = blocks_of(s, op.page_start, op.page_end);
    int channels = 1;
    if (slot) {
      Boundary b = boundary_at(s, *slot);
      op.slot = b;
      op.slot_group = s.group;
      op.prefix_keys.assign(s.keys.begin(),
                            s.keys.begin() + static_cast<std::ptrdiff_t>(*slot / chunk));
      s.slot_save = SlotInflight{op.id.generation, b};
      s.slot_settled = *slot;
      channels = 2;
    }
    counters_.saved_tokens.add(op.page_end - op.page_start);
    s.saved = op.page_end;
    s.saves.insert(op.id.generation);
    saves_.emplace(op.id.generation, SaveInflight{h, channels, true});
    plan.saves.push_back(std::move(op));
  }
  return plan;
}

void Scheduler::on_load_terminal(const Terminal& t, StepEvents& ev) {
  auto it = loads_.find(t.id.generation);
  if (it == loads_.end()) return;
  const LoadInflight li = it->second;
  loads_.erase(it);
  Seq* s = find(li.seq);
  if (s == nullptr || !s->load || s->load->generation != t.id.generation) return;
  const ActiveLoad load = *s->load;
  s->load.reset();
  if (t.ok()) {
    if (!li.abandoned) {
      counters_.load_requests.add();
      counters_.loaded_tokens.add(load.end - load.start);
    }
    settle_slots_below(*s, load.end + 1, false);  // resumed at load.end, committed already
    s->computed = std::max(s->computed, load.end);
    if (!s->finished) ev.loaded.push_back(li.seq);
  } else {
    if (!li.abandoned) {
      counters_.load_failures.add();
      const std::string_view reason = outcome_name(t.outcome);
      auto r = load_failure_reasons_.find(reason);
      if (r == load_failure_reasons_.end())
        r = load_failure_reasons_.emplace(std::string(reason), 0).first;
      ++r->second;
    }
    if (load.slot) decommit(*load.slot);
    s->saved = std::min(s->saved, load.start);  // the recomputed chunks are saved again
    if (!s->finished) ev.load_failed.push_back(li.seq);
  }
  s->pending_slot.reset();
  s->hit_tokens = 0;
  maybe_release(li.seq, ev);
}

void Scheduler::on_save_terminal(const Terminal& t, StepEvents& ev) {
  auto it = saves_.find(t.id.generation);
  if (it == saves_.end()) return;
  SaveInflight& si = it->second;
  const SeqHandle h = si.seq;
  Seq* s = find(h);
  if (t.channel == Channel::kPageSave) {
    if (!t.ok()) counters_.save_failures.add();
  } else if (s != nullptr && s->slot_save && s->slot_save->generation == t.id.generation) {
    const Boundary b = s->slot_save->boundary;
    s->slot_save.reset();
    if (t.ok()) {
      commit(b);
    } else {
      counters_.slot_save_failures.add();
      s->failed_slots.insert(b.tokens);
    }
  }
  si.ok = si.ok && t.ok();
  if (--si.channels > 0) return;
  saves_.erase(it);
  counters_.save_requests.add();
  if (s != nullptr) s->saves.erase(t.id.generation);
  maybe_release(h, ev);
}

bool Scheduler::idle(const Seq& s) const {
  if (s.load || s.load_armed || !s.saves.empty() || s.slot_save) return false;
  const std::uint64_t chunk = config_.chunk_tokens;
  const std::uint64_t computed = std::min<std::uint64_t>(s.computed, s.prompt.size());
  const std::uint64_t aligned =
      std::min<std::uint64_t>(computed / chunk * chunk, s.keys.size() * chunk);
  if (aligned > s.saved) return false;
  return !slot_candidate(s).has_value();
}

void Scheduler::maybe_release(SeqHandle h, StepEvents& ev) {
  Seq* s = find(h);
  if (s == nullptr || !s->finished || !idle(*s)) return;
  seqs_.erase(h);
  order_.erase(std::remove(order_.begin(), order_.end(), h), order_.end());
  ev.freeable.push_back(h);
}

StepEvents Scheduler::process(std::span<const OpReport> reports) {
  StepEvents ev;
  for (const OpReport& r : reports) {
    auto t = agg_.add(r);
    if (!t) continue;
    ev.terminals.push_back(*t);
    if (t->channel == Channel::kLoad) {
      on_load_terminal(*t, ev);
    } else {
      on_save_terminal(*t, ev);
    }
  }
  return ev;
}

bool Scheduler::should_defer_free(SeqHandle h) const {
  const Seq* s = find(h);
  return s != nullptr && !idle(*s);
}

bool Scheduler::finish(SeqHandle h) {
  Seq* s = find(h);
  if (s == nullptr) return true;
  s->finished = true;
  s->load_armed = false;
  release_lease(*s);  // a hit that was never loaded
  if (s->load) {
    auto it = loads_.find(s->load->generation);
    if (it != loads_.end()) it->second.abandoned = true;
  }
  if (!idle(*s)) return false;
  seqs_.erase(h);
  order_.erase(std::remove(order_.begin(), order_.end(), h), order_.end());
  return true;
}

std::uint64_t Scheduler::loads_pending() const noexcept {
  std::uint64_t n = 0;
  for (const auto& [g, l] : loads_) n += l.abandoned ? 0 : 1;
  return n;
}

std::uint64_t Scheduler::lease_of(SeqHandle h) const {
  const Seq* s = find(h);
  return s ? s->lease : 0;
}

std::uint64_t Scheduler::saved_watermark(SeqHandle h) const {
  const Seq* s = find(h);
  return s ? s->saved : 0;
}

std::optional<Boundary> Scheduler::pending_slot_load(SeqHandle h) const {
  const Seq* s = find(h);
  return s ? s->pending_slot : std::nullopt;
}

}  // namespace tier::engine
