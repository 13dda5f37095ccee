// The C API's offload engine calls (tier/tier.h): the DSV4 layout, workers, the scheduler and
// its plans and events. A worker is safe to call from any thread (the engine's own locks; its
// transfers run in progress() without any lock of the store, whose TierStack takes concurrent
// calls); a scheduler's calls hold its own lock (one call at a time, as the engine requires).
// A worker holds a reference to its store and its layout, a scheduler one to its view
// (capi_internal.hpp Life): closing a handle a dependent still uses frees nothing.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "capi_internal.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/kv_layout.hpp"
#include "tier/engine/export.hpp"
#include "tier/engine/scheduler.hpp"
#include "tier/engine/wire.hpp"
#include "tier/engine/worker.hpp"

using namespace tier;
using namespace tier::engine;
using tier::capi::Call;
using tier::capi::closed_handle;
using tier::capi::dup_string;
using tier::capi::from_key;
using tier::capi::guarded;
using tier::capi::need;
using tier::capi::to_key;
using tier::capi::with_handle;

struct tier_dsv4_layout {
  mutable tier::capi::Life life;  // the getters take a const handle
  std::unique_ptr<dsv4::Dsv4Layout> layout;
};

struct tier_worker {
  tier::capi::Life life;
  tier_store* store = nullptr;         // referenced
  tier_dsv4_layout* layout = nullptr;  // referenced
  std::unique_ptr<Worker> worker;
  std::mutex reports_mu;         // reports
  std::deque<OpReport> reports;  // taken from the worker, not yet handed out
};

struct tier_plan {
  StepPlan plan;
  // The operations' keys in C form, one vector per operation (prefix keys after a save's).
  std::vector<std::vector<tier_key>> load_keys, save_keys, prefix_keys;
};

struct tier_events {
  std::vector<std::uint64_t> loaded, load_failed, freeable;
};

struct tier_reports {
  std::vector<tier_op_report> reports;  // reasons: outcome_name() literals (static)
};

struct tier_scheduler {
  tier::capi::Life life;
  std::mutex mu;                // held around every call: the scheduler has one caller at a time
  tier_worker* view = nullptr;  // referenced
  std::unique_ptr<Scheduler> scheduler;
};

namespace {

// Dropping references (the caller's at destroy, a dependent's at its end); the last one frees.
void release_layout(tier_dsv4_layout* l) noexcept {
  if (l->life.release()) delete l;
}
void release_worker(tier_worker* w) noexcept {
  if (!w->life.release()) return;
  w->worker.reset();
  tier::capi::release_store(w->store);
  release_layout(w->layout);
  delete w;
}
void release_scheduler(tier_scheduler* s) noexcept {
  if (!s->life.release()) return;
  s->scheduler.reset();
  release_worker(s->view);
  delete s;
}
// The caller's end of a handle: later calls get BAD_STATE, calls in flight return first.
template <class H, class Release>
void close_handle(H* h, Release release) noexcept {
  if (!h || !h->life.mark_closed()) return;
  h->life.wait_calls();
  release(h);
}

Result<EngineConfig> parse_config(const char* json, const tier_key* page_ns) {
  Json j = Json::object();
  if (json && *json) {
    TIER_ASSIGN_OR_RETURN(j, parse_json(json, "the engine config"));
  }
  TIER_ASSIGN_OR_RETURN(EngineConfig cfg, EngineConfig::from_json(j));
  if (!page_ns) return Status::invalid("page_ns is NULL");
  cfg.page_namespace = to_key(*page_ns);
  return cfg;
}

tier_boundary to_c(const Boundary& b) { return tier_boundary{b.tokens, from_key(b.key)}; }

std::vector<tier_key> to_c(const std::vector<Key128>& keys) {
  std::vector<tier_key> out;
  out.reserve(keys.size());
  for (const Key128& k : keys) out.push_back(from_key(k));
  return out;
}

Status copy_regions(const Result<std::vector<Region>>& regions, tier_region* out,
                    std::size_t capacity, std::size_t* count) {
  if (!regions) return regions.status();
  TIER_RETURN_IF_ERROR(need(count, "count"));
  *count = regions->size();
  if (capacity == 0 && !out) return Status::ok();
  if (capacity < regions->size())
    return Status::invalid("room for " + std::to_string(capacity) + " regions, " +
                           std::to_string(regions->size()) + " needed");
  for (std::size_t i = 0; i < regions->size(); ++i) {
    const Region& r = (*regions)[i];
    out[i] = tier_region{r.data, r.size, static_cast<std::int32_t>(r.kind), r.device};
  }
  return Status::ok();
}

// The engine objects of `n` worker handles, each entered as a call (`calls`).
Result<std::vector<Worker*>> workers_of(tier_worker* const* w, std::size_t n,
                                        std::vector<std::unique_ptr<Call>>& calls) {
  if (n && !w) return Status::invalid("workers is NULL");
  std::vector<Worker*> out;
  for (std::size_t i = 0; i < n; ++i) {
    if (!w[i]) return Status::invalid("a worker is NULL");
    calls.push_back(std::make_unique<Call>(w[i]->life));
    if (!*calls.back()) return closed_handle("worker");
    out.push_back(w[i]->worker.get());
  }
  return out;
}

// Runs `fn(scheduler)` under the scheduler's lock, inside guarded().
template <class F>
int with_scheduler(tier_scheduler* s, F&& fn) {
  return with_handle(s, "scheduler", [&](tier_scheduler& sc) -> Status {
    std::lock_guard<std::mutex> lock(sc.mu);
    return fn(*sc.scheduler);
  });
}

// The engine's counters as text made by `render`, under the scheduler's lock (the workers' are
// thread-safe), into a malloc'ed *out.
template <class Render>
int engine_metrics(tier_scheduler* s, tier_worker* const* workers, size_t worker_count,
                   char** out, Render&& render) {
  return with_handle(s, "scheduler", [&](tier_scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    std::vector<std::unique_ptr<Call>> calls;
    TIER_ASSIGN_OR_RETURN(auto ws, workers_of(workers, worker_count, calls));
    std::lock_guard<std::mutex> lock(sc.mu);
    *out = dup_string(render(*sc.scheduler, ws));
    return Status::ok();
  });
}

// A C plan over `plan`, with the operations' keys in C form.
std::unique_ptr<tier_plan> make_plan(StepPlan plan) {
  auto p = std::make_unique<tier_plan>();
  p->plan = std::move(plan);
  for (const LoadOp& op : p->plan.loads) p->load_keys.push_back(to_c(op.chunk_keys));
  for (const SaveOp& op : p->plan.saves) {
    p->save_keys.push_back(to_c(op.chunk_keys));
    p->prefix_keys.push_back(to_c(op.prefix_keys));
  }
  return p;
}

// A message from the wire encoder as malloc'ed bytes.
Status hand_out(const Result<std::vector<std::byte>>& bytes, uint8_t** out, size_t* size) {
  if (!bytes) return bytes.status();
  auto* p = static_cast<uint8_t*>(std::malloc(bytes->empty() ? 1 : bytes->size()));
  if (!p) throw std::bad_alloc();
  std::memcpy(p, bytes->data(), bytes->size());
  *out = p;
  *size = bytes->size();
  return Status::ok();
}

// A report as C sees it; its reason is outcome_name()'s NUL-terminated static literal.
tier_op_report report_to_c(const OpReport& r) {
  return tier_op_report{static_cast<std::int32_t>(r.channel), r.rank, r.id.request,
                        r.id.generation, r.ok() ? 1 : 0, static_cast<std::int32_t>(r.outcome),
                        outcome_name(r.outcome).data()};
}

// The caller's reports as OpReports: each outcome one the engine knows, `ok` agreeing with it
// (the reason string is the outcome's name, for people; the number is what counts).
Result<std::vector<OpReport>> from_c(const tier_op_report* reports, std::size_t count) {
  if (count && !reports) return Status::invalid("reports is NULL");
  std::vector<OpReport> in;
  in.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const tier_op_report& r = reports[i];
    if (r.channel < 0 || r.channel >= static_cast<std::int32_t>(kChannelCount))
      return Status::invalid("report " + std::to_string(i) + ": unknown channel");
    if (r.outcome < 0 || r.outcome >= kWorkerOutcomeCount)
      return Status::invalid("report " + std::to_string(i) + ": unknown outcome " +
                             std::to_string(r.outcome));
    if ((r.ok != 0) != (r.outcome == 0))
      return Status::invalid("report " + std::to_string(i) + ": ok and outcome disagree");
    in.push_back(OpReport{static_cast<Channel>(r.channel), OperationId{r.request, r.generation},
                          r.rank, static_cast<WorkerOutcome>(r.outcome)});
  }
  return in;
}

// The fields a load and a save operation share: identity, chunk keys, blocks and SLOT.
template <class COp, class Op, class Keys>
void fill_op_common(COp& c, const Op& op, const Keys& keys) {
  c.request = op.id.request;
  c.generation = op.id.generation;
  c.chunk_keys = keys.data();
  c.chunk_count = keys.size();
  c.block_ids = op.block_ids.data();
  c.block_count = op.block_ids.size();
  c.has_slot = op.slot.has_value();
  c.slot = op.slot ? to_c(*op.slot) : tier_boundary{};
  c.slot_group = op.slot_group;
}
// A getter's value, or 0 when the layout is NULL or closed.
template <class F>
auto layout_value(const tier_dsv4_layout* l, F&& get) noexcept -> decltype(get(*l->layout)) {
  if (!l) return 0;
  Call call(l->life);
  return call ? get(*l->layout) : 0;
}
// A scheduler's value under its lock, or 0 when the scheduler is NULL or closed.
template <class F>
auto scheduler_value(tier_scheduler* s, F&& get) noexcept -> decltype(get(*s->scheduler)) {
  if (!s) return 0;
  Call call(s->life);
  if (!call) return 0;
  std::lock_guard<std::mutex> lock(s->mu);
  return get(*s->scheduler);
}
// A worker count, or 0 when the worker is NULL or closed.
template <class F>
size_t worker_count(tier_worker* w, F&& get) noexcept {
  if (!w) return 0;
  Call call(w->life);
  if (!call) return 0;
  return get(*w->worker);
}
}  // namespace

extern "C" {

const char* tier_outcome_name(int32_t outcome) {
  if (outcome < 0 || outcome >= kWorkerOutcomeCount) return "unknown";
  return outcome_name(static_cast<WorkerOutcome>(outcome)).data();
}

int tier_dsv4_layout_create(const char* geometry, const tier_key* page_ns, uint32_t tp_size,
                            uint32_t tp_rank, const char* options_json, tier_dsv4_layout** out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(geometry, "geometry"));
    TIER_RETURN_IF_ERROR(need(page_ns, "page_ns"));
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = nullptr;
    Result<dsv4::ModelConfig> model = Status::invalid("unset");
    if (geometry[0] == '{') {
      TIER_ASSIGN_OR_RETURN(Json j, parse_json(geometry, "the geometry"));
      model = dsv4::ModelConfig::from_json(j);
    } else {
      model = dsv4::preset(geometry);
    }
    if (!model) return model.status();
    TIER_ASSIGN_OR_RETURN(dsv4::Geometry geo, dsv4::Geometry::compute(*model));
    dsv4::Dsv4LayoutOptions opts;
    if (options_json && *options_json) {
      TIER_ASSIGN_OR_RETURN(Json j, parse_json(options_json, "the layout options"));
      TIER_ASSIGN_OR_RETURN(opts, dsv4::Dsv4LayoutOptions::from_json(j));
    }
    TIER_ASSIGN_OR_RETURN(auto layout,
                          dsv4::Dsv4Layout::create(geo, to_key(*page_ns), tp_size, tp_rank, opts));
    auto l = std::make_unique<tier_dsv4_layout>();
    l->layout = std::move(layout);
    *out = l.release();
    return Status::ok();
  });
}
void tier_dsv4_layout_destroy(tier_dsv4_layout* layout) { close_handle(layout, release_layout); }
uint32_t tier_dsv4_layout_block_tokens(const tier_dsv4_layout* l) {
  return layout_value(l, [](const dsv4::Dsv4Layout& x) { return x.block_tokens(); });
}
uint64_t tier_dsv4_layout_page_bytes_per_block(const tier_dsv4_layout* l) {
  return layout_value(l, [](const dsv4::Dsv4Layout& x) { return x.page_bytes_per_block(); });
}
uint64_t tier_dsv4_layout_slot_bytes(const tier_dsv4_layout* l) {
  return layout_value(l, [](const dsv4::Dsv4Layout& x) { return x.slot_bytes(); });
}
int tier_dsv4_layout_page_regions(const tier_dsv4_layout* layout, const uint32_t* block_ids,
                                  size_t block_count, tier_region* out, size_t capacity,
                                  size_t* count) {
  return with_handle(layout, "layout", [&](const tier_dsv4_layout& l) -> Status {
    if (block_count && !block_ids) return Status::invalid("block_ids is NULL");
    return copy_regions(l.layout->page_regions(std::span(block_ids, block_count)), out, capacity,
                        count);
  });
}
int tier_dsv4_layout_slot_regions(const tier_dsv4_layout* layout, int32_t group, tier_region* out,
                                  size_t capacity, size_t* count) {
  return with_handle(layout, "layout", [&](const tier_dsv4_layout& l) -> Status {
    return copy_regions(l.layout->slot_regions(group), out, capacity, count);
  });
}

int tier_worker_create(const char* config_json, const tier_key* page_ns, uint32_t rank,
                       tier_store* store, tier_dsv4_layout* layout, tier_worker** out) {
  return with_handle(store, "store", [&](tier_store& st) -> Status {
    TIER_RETURN_IF_ERROR(need(layout, "layout"));
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = nullptr;
    Call layout_call(layout->life);
    if (!layout_call) return closed_handle("layout");
    TIER_ASSIGN_OR_RETURN(EngineConfig cfg, parse_config(config_json, page_ns));
    auto w = std::make_unique<tier_worker>();
    TIER_ASSIGN_OR_RETURN(w->worker, Worker::create(cfg, rank, *st.stack, *layout->layout));
    st.life.retain();
    layout->life.retain();
    w->store = &st;
    w->layout = layout;
    *out = w.release();
    return Status::ok();
  });
}
void tier_worker_destroy(tier_worker* worker) { close_handle(worker, release_worker); }

uint64_t tier_plan_step(const tier_plan* plan) { return plan ? plan->plan.step : 0; }
size_t tier_plan_load_count(const tier_plan* plan) { return plan ? plan->plan.loads.size() : 0; }
size_t tier_plan_save_count(const tier_plan* plan) { return plan ? plan->plan.saves.size() : 0; }
int tier_plan_load(const tier_plan* plan, size_t index, tier_load_op* out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(plan, "plan"));
    TIER_RETURN_IF_ERROR(need(out, "out"));
    if (index >= plan->plan.loads.size()) return Status::invalid("no such load");
    const LoadOp& op = plan->plan.loads[index];
    tier_load_op c{};
    fill_op_common(c, op, plan->load_keys[index]);
    c.page_start = op.page_start;
    c.page_end = op.page_end;
    *out = c;
    return Status::ok();
  });
}
int tier_plan_save(const tier_plan* plan, size_t index, tier_save_op* out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(plan, "plan"));
    TIER_RETURN_IF_ERROR(need(out, "out"));
    if (index >= plan->plan.saves.size()) return Status::invalid("no such save");
    const SaveOp& op = plan->plan.saves[index];
    const auto& prefix = plan->prefix_keys[index];
    tier_save_op c{};
    fill_op_common(c, op, plan->save_keys[index]);
    c.page_start = op.page_start;
    c.page_end = op.page_end;
    c.prefix_keys = prefix.data();
    c.prefix_count = prefix.size();
    *out = c;
    return Status::ok();
  });
}
uint64_t tier_plan_load_lease(const tier_plan* plan, size_t index) {
  return plan && index < plan->plan.loads.size() ? plan->plan.loads[index].lease : 0;
}
void tier_plan_free(tier_plan* plan) { delete plan; }

int tier_plan_encode(const tier_plan* plan, uint8_t** out, size_t* size) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(plan, "plan"));
    TIER_RETURN_IF_ERROR(need(out, "out"));
    TIER_RETURN_IF_ERROR(need(size, "size"));
    return hand_out(wire::encode_plan(plan->plan), out, size);
  });
}
int tier_plan_decode(const void* bytes, size_t size, tier_plan** out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = nullptr;
    if (size && !bytes) return Status::invalid("bytes is NULL");
    TIER_ASSIGN_OR_RETURN(StepPlan plan,
                          wire::decode_plan(std::span(static_cast<const std::byte*>(bytes), size)));
    *out = make_plan(std::move(plan)).release();
    return Status::ok();
  });
}
int tier_reports_encode(const tier_op_report* reports, size_t count, uint8_t** out, size_t* size) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    TIER_RETURN_IF_ERROR(need(size, "size"));
    TIER_ASSIGN_OR_RETURN(auto in, from_c(reports, count));
    return hand_out(wire::encode_reports(in), out, size);
  });
}
int tier_reports_decode(const void* bytes, size_t size, tier_reports** out) {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = nullptr;
    if (size && !bytes) return Status::invalid("bytes is NULL");
    TIER_ASSIGN_OR_RETURN(
        std::vector<OpReport> in,
        wire::decode_reports(std::span(static_cast<const std::byte*>(bytes), size)));
    auto r = std::make_unique<tier_reports>();
    r->reports.reserve(in.size());
    for (const OpReport& x : in)
      r->reports.push_back(report_to_c(x));
    *out = r.release();
    return Status::ok();
  });
}
const tier_op_report* tier_reports_get(const tier_reports* reports, size_t* count) {
  if (count) *count = reports ? reports->reports.size() : 0;
  return reports ? reports->reports.data() : nullptr;
}
void tier_reports_free(tier_reports* reports) { delete reports; }

int tier_worker_submit(tier_worker* worker, const tier_plan* plan) {
  return tier_worker_submit_after(worker, plan, nullptr, nullptr);
}
int tier_worker_submit_after(tier_worker* worker, const tier_plan* plan, void* stream,
                             void* event) {
  return with_handle(worker, "worker", [&](tier_worker& w) -> Status {
    TIER_RETURN_IF_ERROR(need(plan, "plan"));
    w.worker->submit(plan->plan, tier::engine::DeviceOrder{stream, event});
    return Status::ok();
  });
}
int tier_worker_progress(tier_worker* worker, size_t max_saves, size_t* finished) {
  return with_handle(worker, "worker", [&](tier_worker& w) -> Status {
    const std::size_t n = w.worker->progress(max_saves);
    if (finished) *finished = n;
    return Status::ok();
  });
}
int tier_worker_take_reports(tier_worker* worker, tier_op_report* out, size_t capacity,
                             size_t* count) {
  return with_handle(worker, "worker", [&](tier_worker& w) -> Status {
    TIER_RETURN_IF_ERROR(need(count, "count"));
    if (capacity && !out) return Status::invalid("out is NULL");
    std::lock_guard<std::mutex> lock(w.reports_mu);
    for (OpReport& r : w.worker->take_reports()) w.reports.push_back(r);
    std::size_t n = 0;
    while (n < capacity && !w.reports.empty()) {
      out[n++] = report_to_c(w.reports.front());
      w.reports.pop_front();
    }
    *count = n;
    return Status::ok();
  });
}
size_t tier_worker_queued_saves(tier_worker* worker) {
  return worker_count(worker, [](const Worker& w) { return w.queued_saves(); });
}
size_t tier_worker_queued_loads(tier_worker* worker) {
  return worker_count(worker, [](const Worker& w) { return w.queued_loads(); });
}
int tier_worker_release_lease(tier_worker* worker, uint64_t lease) {
  return with_handle(worker, "worker", [&](tier_worker& w) -> Status {
    w.worker->release_lease(lease);
    return Status::ok();
  });
}
int tier_worker_metrics_json(tier_worker* worker, char** out) {
  return with_handle(worker, "worker", [&](tier_worker& w) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = dup_string(worker_metrics_json(*w.worker).dump());
    return Status::ok();
  });
}

int tier_scheduler_create(const char* config_json, const tier_key* page_ns, tier_worker* view,
                          tier_scheduler** out) {
  return with_handle(view, "view", [&](tier_worker& v) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = nullptr;
    TIER_ASSIGN_OR_RETURN(EngineConfig cfg, parse_config(config_json, page_ns));
    auto s = std::make_unique<tier_scheduler>();
    TIER_ASSIGN_OR_RETURN(s->scheduler, Scheduler::create(cfg, *v.worker));
    v.life.retain();
    s->view = &v;
    *out = s.release();
    return Status::ok();
  });
}
void tier_scheduler_destroy(tier_scheduler* scheduler) {
  close_handle(scheduler, release_scheduler);
}

int tier_scheduler_add_request(tier_scheduler* s, uint64_t request_id, const uint32_t* prompt,
                               size_t prompt_tokens, uint64_t* handle) {
  return tier_scheduler_add_request_extra(s, request_id, prompt, prompt_tokens, nullptr, 0,
                                          handle);
}
int tier_scheduler_add_request_extra(tier_scheduler* s, uint64_t request_id,
                                     const uint32_t* prompt, size_t prompt_tokens,
                                     const void* extra_key, size_t extra_key_bytes,
                                     uint64_t* handle) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(handle, "handle"));
    if (prompt_tokens && !prompt) return Status::invalid("prompt is NULL");
    if (extra_key_bytes && !extra_key) return Status::invalid("extra_key is NULL");
    *handle = sc.add_request(
        request_id, std::span(prompt, prompt_tokens),
        std::string_view(static_cast<const char*>(extra_key), extra_key ? extra_key_bytes : 0));
    return Status::ok();
  });
}
uint32_t tier_scheduler_epoch(tier_scheduler* s) {
  return scheduler_value(s, [](const Scheduler& sc) { return sc.epoch(); });
}
int tier_scheduler_lookup(tier_scheduler* s, uint64_t handle, tier_match* out) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    TIER_ASSIGN_OR_RETURN(MatchResult m, sc.lookup(handle));
    *out = tier_match{m.tokens, m.park ? 1 : 0, m.page_hit, m.slot.has_value(),
                      m.slot ? to_c(*m.slot) : tier_boundary{}};
    return Status::ok();
  });
}
int tier_scheduler_after_alloc(tier_scheduler* s, uint64_t handle, uint64_t local_tokens,
                               const uint32_t* blocks, size_t block_count, int32_t group,
                               tier_load_decision* out) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    if (block_count && !blocks) return Status::invalid("blocks is NULL");
    LoadDecision d = sc.after_alloc(handle, local_tokens, std::span(blocks, block_count), group);
    // The reasons are string literals (docs/engine.md).
    *out = tier_load_decision{static_cast<std::int32_t>(d.action),
                              d.reason.empty() ? "" : d.reason.data(), d.load_start, d.load_end,
                              d.handoff_tokens};
    return Status::ok();
  });
}
int tier_scheduler_set_blocks(tier_scheduler* s, uint64_t handle, const uint32_t* blocks,
                              size_t block_count) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    if (block_count && !blocks) return Status::invalid("blocks is NULL");
    sc.set_blocks(handle, std::span(blocks, block_count));
    return Status::ok();
  });
}
int tier_scheduler_cut_prefill_chunk(tier_scheduler* s, uint64_t handle, uint64_t start,
                                     uint64_t length, uint64_t* out) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = sc.cut_prefill_chunk(handle, start, length);
    return Status::ok();
  });
}
int tier_scheduler_on_computed(tier_scheduler* s, uint64_t handle, uint64_t computed_tokens) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    sc.on_computed(handle, computed_tokens);
    return Status::ok();
  });
}
int tier_scheduler_build_step(tier_scheduler* s, tier_plan** out) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = make_plan(sc.build_step()).release();
    return Status::ok();
  });
}
int tier_scheduler_process(tier_scheduler* s, const tier_op_report* reports, size_t count,
                           tier_events** out) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    TIER_ASSIGN_OR_RETURN(auto in, from_c(reports, count));
    StepEvents ev = sc.process(in);
    auto e = std::make_unique<tier_events>();
    e->loaded.assign(ev.loaded.begin(), ev.loaded.end());
    e->load_failed.assign(ev.load_failed.begin(), ev.load_failed.end());
    e->freeable.assign(ev.freeable.begin(), ev.freeable.end());
    *out = e.release();
    return Status::ok();
  });
}
const uint64_t* tier_events_loaded(const tier_events* ev, size_t* count) {
  if (count) *count = ev ? ev->loaded.size() : 0;
  return ev ? ev->loaded.data() : nullptr;
}
const uint64_t* tier_events_load_failed(const tier_events* ev, size_t* count) {
  if (count) *count = ev ? ev->load_failed.size() : 0;
  return ev ? ev->load_failed.data() : nullptr;
}
const uint64_t* tier_events_freeable(const tier_events* ev, size_t* count) {
  if (count) *count = ev ? ev->freeable.size() : 0;
  return ev ? ev->freeable.data() : nullptr;
}
void tier_events_free(tier_events* ev) { delete ev; }

int tier_scheduler_should_defer_free(tier_scheduler* s, uint64_t handle, int32_t* out) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(out, "out"));
    *out = sc.should_defer_free(handle) ? 1 : 0;
    return Status::ok();
  });
}
int tier_scheduler_finish(tier_scheduler* s, uint64_t handle, int32_t* free_now) {
  return with_scheduler(s, [&](Scheduler& sc) -> Status {
    TIER_RETURN_IF_ERROR(need(free_now, "free_now"));
    *free_now = sc.finish(handle) ? 1 : 0;
    return Status::ok();
  });
}
uint64_t tier_scheduler_loads_pending(tier_scheduler* s) {
  return scheduler_value(s, [](const Scheduler& sc) { return sc.loads_pending(); });
}
uint64_t tier_scheduler_saves_pending(tier_scheduler* s) {
  return scheduler_value(s, [](const Scheduler& sc) { return sc.saves_pending(); });
}
int tier_engine_metrics_json(tier_scheduler* s, tier_worker* const* workers, size_t worker_count,
                             char** out) {
  return engine_metrics(s, workers, worker_count, out, [](const Scheduler& sc, const auto& ws) {
    return json_text(metrics_json(sc, ws));
  });
}
int tier_engine_metrics_prometheus(tier_scheduler* s, tier_worker* const* workers,
                                   size_t worker_count, char** out) {
  return engine_metrics(s, workers, worker_count, out, [](const Scheduler& sc, const auto& ws) {
    return metrics_prometheus(sc, ws);
  });
}

}  // extern "C"
