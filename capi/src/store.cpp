// The C API's status, key, memory and store calls (tier/tier.h).
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include <atomic>

#include "capi_internal.hpp"
#include "tier/checked.hpp"
#include "tier/log.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"

using namespace tier;
using tier::capi::guarded;

namespace tier::capi {
namespace {
thread_local std::string t_last_error;

ObjectKey object_key(const tier_store& s, const tier_key& k) { return {s.ns, to_key(k), s.rank}; }
// The store's object keys of `count` C keys (a batch call's list).
std::vector<ObjectKey> object_keys(const tier_store& s, const tier_key* keys, std::size_t count) {
  std::vector<ObjectKey> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) out.push_back(object_key(s, keys[i]));
  return out;
}

// A caller's timeout in milliseconds (< 0: `fallback`); anything above a year is a year, so the
// deadline computed from it cannot overflow.
std::chrono::milliseconds timeout_of(std::int64_t ms, std::uint64_t fallback) {
  constexpr std::int64_t kYear = std::int64_t{365} * 24 * 3600 * 1000;
  return std::chrono::milliseconds(ms < 0 ? static_cast<std::int64_t>(fallback)
                                          : std::min(ms, kYear));
}

// Item i's regions, converted (registrations read under their shared lock); appended to
// `regions`.
Status convert_items(tier_store& s, const tier_item* items, std::size_t count,
                     std::vector<ObjectKey>& keys, std::vector<Region>& regions,
                     std::vector<std::size_t>& first) {
  if (count && !items) return Status::invalid("items is NULL");
  std::shared_lock lock(s.registrations->mu);
  keys.clear();
  regions.clear();
  first.assign(1, 0);
  keys.reserve(count);
  regions.reserve(count);  // one region per item, the common case; more grow it
  first.reserve(count + 1);
  for (std::size_t i = 0; i < count; ++i) {
    const tier_item& it = items[i];
    if (it.region_count && !it.regions) return Status::invalid("item regions is NULL");
    keys.push_back(object_key(s, it.key));
    for (std::size_t j = 0; j < it.region_count; ++j) {
      auto r = to_region(s, it.regions[j]);
      if (!r)
        return Status(r.status().code(), "item " + std::to_string(i) + ", region " +
                                             std::to_string(j) + ": " +
                                             std::string(r.status().message()));
      regions.push_back(*r);
    }
    first.push_back(regions.size());
  }
  return Status::ok();
}

// Runs a save or load of converted items: one TierStack call, no lock of the store's own (the
// stack runs concurrent calls' transfers in parallel).
Status run_batch(tier_store& s, std::int32_t op, const std::vector<ObjectKey>& keys,
                 const std::vector<Region>& regions, const std::vector<std::size_t>& first,
                 std::int32_t* codes, std::int32_t* tiers) {
  const std::size_t n = keys.size();
  auto list = [&](std::size_t i) {
    return RegionList(regions.data() + first[i], first[i + 1] - first[i]);
  };
  if (op == TIER_OP_SAVE) {
    std::vector<SaveItem> saves;
    saves.reserve(n);
    for (std::size_t i = 0; i < n; ++i) saves.push_back({keys[i], list(i)});
    std::vector<Status> saved(n);
    TIER_RETURN_IF_ERROR(s.stack->save(saves, s.codec, saved));
    for (std::size_t i = 0; i < n; ++i) codes[i] = static_cast<std::int32_t>(saved[i].code());
    return Status::ok();
  }
  std::vector<LoadItem> loads;
  loads.reserve(n);
  for (std::size_t i = 0; i < n; ++i) loads.push_back({keys[i], list(i)});
  std::vector<LoadResult> loaded(n);
  TIER_RETURN_IF_ERROR(s.stack->load(loads, s.codec, loaded));
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = static_cast<std::int32_t>(loaded[i].status.code());
    if (tiers) tiers[i] = loaded[i].status.is_ok() ? loaded[i].tier : -1;
  }
  return Status::ok();
}

void transfer_thread(tier_store* s) {
  for (;;) {
    tier_store::Job job;
    {
      std::unique_lock<std::mutex> lock(s->qmu);
      s->work_cv.wait(lock, [&] { return s->stopping || !s->jobs.empty(); });
      if (s->jobs.empty()) return;  // stopping, and every queued job ran
      job = std::move(s->jobs.front());
      s->jobs.pop_front();
      ++s->running;
    }
    auto c = std::make_unique<tier_completion>();
    c->ticket = job.ticket;
    c->op = job.op;
    const std::size_t n = job.keys.size();
    c->codes.assign(n, TIER_OK);
    if (job.op == TIER_OP_LOAD) c->tiers.assign(n, -1);
    Status st;
    try {
      st = run_batch(*s, job.op, job.keys, job.regions, job.first, c->codes.data(),
                     job.op == TIER_OP_LOAD ? c->tiers.data() : nullptr);
    } catch (const std::exception& e) {
      st = Status(Code::kBadState, e.what());
    }
    c->status = static_cast<std::int32_t>(st.code());
    {
      std::lock_guard<std::mutex> lock(s->qmu);
      s->done.emplace(c->ticket, std::move(c));
      --s->running;
    }
    s->done_cv.notify_all();
  }
}

Status submit(tier_store* s, std::int32_t op, const tier_item* items, std::size_t count,
              std::uint64_t* ticket) {
  TIER_RETURN_IF_ERROR(need(ticket, "ticket"));
  tier_store::Job job;
  job.op = op;
  TIER_RETURN_IF_ERROR(convert_items(*s, items, count, job.keys, job.regions, job.first));
  std::lock_guard<std::mutex> lock(s->qmu);
  if (s->stopping) return closed_handle("store");
  if (!s->thread.joinable()) s->thread = std::thread(transfer_thread, s);
  job.ticket = s->next_ticket++;
  *ticket = job.ticket;
  s->issued.push_back(job.ticket);
  s->jobs.push_back(std::move(job));
  s->work_cv.notify_one();
  return Status::ok();
}

// Hands out the completion of `ticket` (0: the oldest finished). Call under qmu.
tier_completion* take_done(tier_store& s, std::uint64_t ticket) {
  auto it = ticket ? s.done.find(ticket) : s.done.begin();
  if (it == s.done.end()) return nullptr;
  tier_completion* c = it->second.release();
  s.issued.erase(std::find(s.issued.begin(), s.issued.end(), c->ticket));
  s.done.erase(it);
  s.done_cv.notify_all();  // waiters on this ticket learn it is gone
  return c;
}

// Once per process: a persistent tier opened with the all-zero namespace shares its objects with
// every program that does the same, whatever model it serves, and a program that opens it with a
// namespace finds none of them (docs/integration.md, "Namespaces").
void warn_default_namespace(TierStack& stack) {
  static std::atomic<bool> warned{false};
  for (std::size_t i = 0; i < stack.tier_count(); ++i) {
    if (!stack.tier(i).capabilities().persistent) continue;
    if (warned.exchange(true)) return;
    log(LogLevel::kWarn,
        fmt::format("tier {} is persistent and the store was opened with the default namespace: "
                    "its objects are shared with every program that opens it so, whatever the "
                    "model, and invisible to one that passes a namespace; pass the model's "
                    "identity (Store.open(..., namespace={{\"model\": ...}}), tier_store_open's "
                    "ns; docs/integration.md, \"Namespaces\")",
                    stack.spec(i).name));
    return;
  }
}

Status open_store(Result<Profile> profile, const tier_key* ns, std::uint32_t rank,
                  tier_store** out) {
  TIER_RETURN_IF_ERROR(need(out, "out"));
  *out = nullptr;
  if (!profile) return profile.status();
  auto stack = TierStack::open(*profile, Registry::global());
  if (!stack) return stack.status();
  auto s = std::make_unique<tier_store>();
  s->stack = std::move(stack).value();
  s->ns = ns ? to_key(*ns) : Key128{};
  s->rank = rank;
  s->op_timeout_ms = std::max<std::uint64_t>(1, profile->op_timeout_us / 1000);
  for (std::size_t i = 0; i < s->stack->tier_count(); ++i)
    s->tier_names.push_back(s->stack->spec(i).name);
  if (s->ns == Key128{}) warn_default_namespace(*s->stack);
  *out = s.release();
  return Status::ok();
}

}  // namespace

int report(const Status& s) noexcept {
  if (s.is_ok()) return TIER_OK;
  try {
    t_last_error.assign(s.message().empty() ? code_name(s.code()) : s.message());
  } catch (...) {
  }
  return static_cast<int>(s.code());
}

Result<Region> to_region(tier_store& store, const tier_region& r) {
  if (r.kind < TIER_MEMORY_HOST || r.kind > TIER_MEMORY_SHM)
    return Status::invalid("unknown memory kind " + std::to_string(r.kind));
  if (!r.ptr && r.bytes) return Status::invalid("a region of " + std::to_string(r.bytes) +
                                                " bytes has a NULL pointer");
  Region out{static_cast<std::byte*>(r.ptr), r.bytes, static_cast<MemoryKind>(r.kind),
             r.kind == TIER_MEMORY_DEVICE ? r.device : -1};
  TIER_RETURN_IF_ERROR(check_region(out));
  if (out.kind == MemoryKind::kDevice && out.device < 0)
    return Status::invalid("a device region needs a device >= 0");
  if (out.kind == MemoryKind::kHost) {
    const auto begin = reinterpret_cast<std::uintptr_t>(out.data);
    for (const tier_memory* m : store.registrations->list) {
      if (m->region.kind != MemoryKind::kPinnedHost) continue;
      const auto start = reinterpret_cast<std::uintptr_t>(m->region.data);
      if (begin >= start && begin - start <= m->region.size &&
          out.size <= m->region.size - (begin - start)) {
        out.kind = MemoryKind::kPinnedHost;
        break;
      }
    }
  }
  return out;
}

void release_store(tier_store* store) noexcept {
  if (store->life.release()) delete store;  // ~TierStack flushes (op_timeout), then closes
}

}  // namespace tier::capi

using namespace tier::capi;

extern "C" {

const char* tier_code_name(int code) {
  if (code < 0 || code > static_cast<int>(Code::kNoSpace)) return "unknown";
  return code_name(static_cast<Code>(code)).data();  // the names are string literals
}
const char* tier_last_error(void) { return t_last_error.c_str(); }
uint32_t tier_abi_version(void) { return TIER_C_ABI_VERSION; }
const char* tier_version(void) { return TIER_VERSION_STRING; }
void tier_free(void* p) { std::free(p); }

void tier_key_to_hex(const tier_key* key, char out[33]) {
  std::string h = to_key(*key).hex();
  std::memcpy(out, h.c_str(), 33);
}
int tier_key_from_hex(const char* hex, tier_key* out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(hex, "hex"));
    TIER_RETURN_IF_ERROR(need(out, "out"));
    TIER_ASSIGN_OR_RETURN(Key128 k, Key128::from_hex(hex));
    *out = from_key(k);
    return Status::ok();
  });
}
int tier_namespace_id(const char* identity_json, tier_key* out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(identity_json, "identity_json"));
    TIER_RETURN_IF_ERROR(need(out, "out"));
    TIER_ASSIGN_OR_RETURN(Json j, parse_json(identity_json, "the identity"));
    TIER_ASSIGN_OR_RETURN(Key128 k, namespace_id(j));
    *out = from_key(k);
    return Status::ok();
  });
}
int tier_chunk_keys(const tier_key* ns, const uint32_t* tokens, size_t token_count,
                    size_t chunk_tokens, int include_partial, tier_key* out, size_t capacity,
                    size_t* count) {
  return tier_chunk_keys_extra(ns, tokens, token_count, chunk_tokens, include_partial, nullptr, 0,
                               out, capacity, count);
}
int tier_chunk_keys_extra(const tier_key* ns, const uint32_t* tokens, size_t token_count,
                          size_t chunk_tokens, int include_partial, const void* extra_key,
                          size_t extra_key_bytes, tier_key* out, size_t capacity, size_t* count) {
  return guarded([&]() -> Status {
    if (extra_key_bytes && !extra_key) return Status::invalid("extra_key is NULL");
    TIER_RETURN_IF_ERROR(need(ns, "ns"));
    TIER_RETURN_IF_ERROR(need(count, "count"));
    if (token_count && !tokens) return Status::invalid("tokens is NULL");
    if (chunk_tokens == 0) return Status::invalid("chunk_tokens is 0");
    const std::size_t n = token_count / chunk_tokens +
                          (include_partial && token_count % chunk_tokens ? 1 : 0);
    *count = n;
    if (capacity == 0 && !out) return Status::ok();
    if (capacity < n)
      return Status::invalid("room for " + std::to_string(capacity) + " keys, " +
                             std::to_string(n) + " needed");
    auto keys = chunk_keys(
        to_key(*ns), std::span(tokens, token_count), chunk_tokens, include_partial != 0,
        std::string_view(static_cast<const char*>(extra_key), extra_key ? extra_key_bytes : 0));
    for (std::size_t i = 0; i < keys.size(); ++i) out[i] = from_key(keys[i]);
    return Status::ok();
  });
}
void tier_external_key(const void* name, size_t bytes, tier_key* out) {
  static constexpr char kDomain[] = "libtier-external-v1";  // hashed with its NUL
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, kDomain, sizeof kDomain);
  if (bytes) XXH3_128bits_update(st, name, bytes);
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  *out = from_key(Key128{h.low64, h.high64});
}

int tier_store_open(const char* profile_path, const tier_key* ns, uint32_t rank,
                    tier_store** out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(profile_path, "profile_path"));
    return open_store(load_profile(profile_path, Registry::global()), ns, rank, out);
  });
}
int tier_store_open_json(const char* profile_json, const tier_key* ns, uint32_t rank,
                         tier_store** out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(profile_json, "profile_json"));
    TIER_ASSIGN_OR_RETURN(Json j, parse_json(profile_json, "the profile"));
    return open_store(parse_profile(j, Registry::global(), "<inline>"), ns, rank, out);
  });
}

void tier_store_close(tier_store* store) {
  if (!store) return;
  // First new submits are refused and the queued batches run to their end (a waiter gets its
  // completion), other calls still run; then the handle closes. So a wait or poll that returns
  // BAD_STATE tells its caller that no batch uses its regions any more.
  {
    std::lock_guard<std::mutex> lock(store->qmu);
    if (store->stopping) return;  // closed already, or being closed by another thread
    store->stopping = true;
  }
  store->work_cv.notify_all();
  if (store->thread.joinable()) store->thread.join();
  store->life.mark_closed();
  store->done_cv.notify_all();
  store->life.wait_calls();
  {
    // Registrations the caller did not release end with the store.
    Registrations& regs = *store->registrations;
    std::lock_guard lock(regs.mu);
    regs.list.clear();
  }
  release_store(store);
}

size_t tier_store_tier_count(tier_store* store) {
  if (!store) return 0;
  Call call(store->life);
  return call ? store->tier_names.size() : 0;
}
const char* tier_store_tier_name(tier_store* store, size_t index) {
  if (!store) return nullptr;
  Call call(store->life);
  if (!call || index >= store->tier_names.size()) return nullptr;
  return store->tier_names[index].c_str();
}

int tier_store_metrics_json(tier_store* store, char** out) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = dup_string(json_text(s.stack->metrics_json()));
    return Status::ok();
  });
}
int tier_store_metrics_prometheus(tier_store* store, char** out) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = dup_string(s.stack->metrics_prometheus());
    return Status::ok();
  });
}

const char* tier_store_metrics_endpoint(tier_store* store) {
  if (!store) return "";
  Call call(store->life);
  return call ? store->stack->metrics_endpoint().c_str() : "";
}

int tier_memory_register(tier_store* store, void* ptr, size_t bytes, int32_t kind, int32_t device,
                         tier_memory** out) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    TIER_RETURN_IF_ERROR(need(ptr, "ptr"));
    *out = nullptr;
    auto m = std::make_unique<tier_memory>();
    m->set = s.registrations;
    TIER_RETURN_IF_ERROR(check_region(Region{static_cast<std::byte*>(ptr), bytes}));
    if (kind == TIER_MEMORY_PINNED) {
      TIER_ASSIGN_OR_RETURN(m->pinned, pin_host(ptr, bytes));
    } else if (kind == TIER_MEMORY_DEVICE) {
      if (device < 0) return Status::invalid("a device registration needs a device >= 0");
      TIER_RETURN_IF_ERROR(s.codec.prepare_device(
          Region{static_cast<std::byte*>(ptr), bytes, MemoryKind::kDevice, device}));
      // A tier that cannot write device memory itself (the disk) then reads into page-locked
      // images, which reach the GPU by DMA. Without them (none can be had) loads still work,
      // through the runtime's pageable copy.
      if (auto images = page_locked_images()) {
        s.stack->set_image_memory(std::move(images).value());
      } else if (log_enabled(LogLevel::kWarn)) {
        log(LogLevel::kWarn, "device memory registered; the stack's images stay pageable: " +
                                 images.status().to_string());
      }
    } else if (kind != TIER_MEMORY_HOST && kind != TIER_MEMORY_SHM) {
      return Status::invalid("unknown memory kind " + std::to_string(kind));
    }
    m->region = Region{static_cast<std::byte*>(ptr), bytes, static_cast<MemoryKind>(kind),
                       kind == TIER_MEMORY_DEVICE ? device : -1};
    std::lock_guard lock(s.registrations->mu);
    s.registrations->list.push_back(m.get());
    *out = m.release();
    return Status::ok();
  });
}
int tier_memory_release(tier_memory* memory) {
  return guarded([&]() -> Status {
    if (!memory) return Status::ok();
    std::unique_ptr<tier_memory> m(memory);
    std::lock_guard lock(m->set->mu);
    auto& list = m->set->list;
    list.erase(std::remove(list.begin(), list.end(), memory), list.end());
    return Status::ok();
  });
}

int tier_store_lookup_prefix(tier_store* store, const tier_key* keys, size_t count,
                             size_t* prefix) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    TIER_RETURN_IF_ERROR(need(prefix, "prefix"));
    if (count && !keys) return Status::invalid("keys is NULL");
    const std::vector<ObjectKey> k = object_keys(s, keys, count);
    TIER_ASSIGN_OR_RETURN(*prefix, s.stack->lookup_prefix(k));
    return Status::ok();
  });
}
int tier_store_stat(tier_store* store, const tier_key* keys, size_t count, tier_object_stat* out) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    if (count && (!keys || !out)) return Status::invalid("keys or out is NULL");
    const std::vector<ObjectKey> k = object_keys(s, keys, count);
    std::vector<ObjectStat> stats(count);
    TIER_RETURN_IF_ERROR(s.stack->stat(k, stats));
    for (std::size_t i = 0; i < count; ++i)
      out[i] = tier_object_stat{stats[i].tier, stats[i].payload_bytes, stats[i].stored_bytes};
    return Status::ok();
  });
}
int tier_store_exists(tier_store* store, const tier_key* keys, size_t count, uint8_t* out) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    if (count && (!keys || !out)) return Status::invalid("keys or out is NULL");
    for (std::size_t i = 0; i < count; ++i) {
      TIER_ASSIGN_OR_RETURN(int t, s.stack->locate(object_key(s, keys[i])));
      out[i] = t >= 0 ? 1 : 0;
    }
    return Status::ok();
  });
}

namespace {
// The blocking save and load: the items converted and run as one batch on the calling thread.
int blocking_batch(tier_store* store, int op, const tier_item* items, size_t count,
                   int32_t* codes, int32_t* tiers) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    if (count && !codes) return Status::invalid("codes is NULL");
    std::vector<ObjectKey> keys;
    std::vector<Region> regions;
    std::vector<std::size_t> first;
    TIER_RETURN_IF_ERROR(convert_items(s, items, count, keys, regions, first));
    return run_batch(s, op, keys, regions, first, codes, tiers);
  });
}
}  // namespace

int tier_store_save(tier_store* store, const tier_item* items, size_t count, int32_t* codes) {
  return blocking_batch(store, TIER_OP_SAVE, items, count, codes, nullptr);
}
int tier_store_load(tier_store* store, const tier_item* items, size_t count, int32_t* codes,
                    int32_t* tiers) {
  return blocking_batch(store, TIER_OP_LOAD, items, count, codes, tiers);
}
int tier_store_remove(tier_store* store, const tier_key* keys, size_t count, int32_t* codes) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    if (count && (!keys || !codes)) return Status::invalid("keys or codes is NULL");
    std::vector<Status> out(count);
    TIER_RETURN_IF_ERROR(s.stack->remove(object_keys(s, keys, count), out));
    for (std::size_t i = 0; i < count; ++i) codes[i] = static_cast<std::int32_t>(out[i].code());
    return Status::ok();
  });
}
int tier_store_clear(tier_store* store, const tier_key* ns, uint64_t* removed) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    if (removed) *removed = 0;
    TIER_ASSIGN_OR_RETURN(std::uint64_t n, s.stack->clear(ns ? to_key(*ns) : s.ns));
    if (removed) *removed = n;
    return Status::ok();
  });
}
int tier_store_progress(tier_store* store) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    s.stack->progress();
    return Status::ok();
  });
}
int tier_store_flush(tier_store* store, int64_t timeout_ms) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    return s.stack->flush(timeout_of(timeout_ms, s.op_timeout_ms));
  });
}

int tier_store_submit_save(tier_store* store, const tier_item* items, size_t count,
                           uint64_t* ticket) {
  return with_handle(store, "store",
                     [&](tier_store& s) { return submit(&s, TIER_OP_SAVE, items, count, ticket); });
}
int tier_store_submit_load(tier_store* store, const tier_item* items, size_t count,
                           uint64_t* ticket) {
  return with_handle(store, "store",
                     [&](tier_store& s) { return submit(&s, TIER_OP_LOAD, items, count, ticket); });
}
int tier_store_poll(tier_store* store, tier_completion** out) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    std::lock_guard<std::mutex> lock(s.qmu);
    *out = take_done(s, 0);
    return Status::ok();
  });
}
int tier_store_wait(tier_store* store, uint64_t ticket, int64_t timeout_ms,
                    tier_completion** out) {
  return with_handle(store, "store", [&](tier_store& s) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = nullptr;
    std::unique_lock<std::mutex> lock(s.qmu);
    auto known = [&] {
      return ticket ? std::find(s.issued.begin(), s.issued.end(), ticket) != s.issued.end()
                    : !s.issued.empty();
    };
    if (!known())
      return Status::not_found(ticket ? "ticket " + std::to_string(ticket) + " is not pending"
                                      : "no batch is pending");
    // Also wakes when another thread took the completion (the ticket is no longer pending).
    // A close runs every queued batch before it waits for this call, so the wait ends.
    auto ready = [&] { return (ticket ? s.done.count(ticket) > 0 : !s.done.empty()) || !known(); };
    if (timeout_ms < 0) {
      s.done_cv.wait(lock, ready);
    } else if (!s.done_cv.wait_for(lock, timeout_of(timeout_ms, 0), ready)) {
      return Status(Code::kTimedOut, "the batch did not complete in " +
                                         std::to_string(timeout_ms) + " ms");
    }
    *out = take_done(s, ticket);
    if (!*out) return Status::not_found("another thread took the completion");
    return Status::ok();
  });
}
uint64_t tier_completion_ticket(const tier_completion* c) { return c ? c->ticket : 0; }
int32_t tier_completion_op(const tier_completion* c) { return c ? c->op : -1; }
int32_t tier_completion_status(const tier_completion* c) {
  return c ? c->status : TIER_INVALID_ARGUMENT;
}
size_t tier_completion_count(const tier_completion* c) { return c ? c->codes.size() : 0; }
const int32_t* tier_completion_codes(const tier_completion* c) {
  return c ? c->codes.data() : nullptr;
}
const int32_t* tier_completion_tiers(const tier_completion* c) {
  return c && !c->tiers.empty() ? c->tiers.data() : nullptr;
}
void tier_completion_free(tier_completion* c) { delete c; }

}  // extern "C"
