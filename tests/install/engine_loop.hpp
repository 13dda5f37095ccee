#pragma once
// The offload engine's loop on one rank (TP 1), as docs/engine.md "A complete setup" describes
// it, for the installed-files tests: a request saves its prompt, a second request with the same
// prompt loads it back into other blocks, and the caller checks the bytes. Used by
// dense_engine.cpp (a custom KvLayout) and dsv4_engine.cpp (dsv4::Dsv4Layout); built out of tree
// against the installed headers only.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "tier/engine/scheduler.hpp"
#include "tier/engine/worker.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

namespace demo {

using namespace tier;
using namespace tier::engine;

[[noreturn]] inline void die(const char* what, const Status& st) {
  std::fprintf(stderr, "FAIL: %s: %s\n", what, st.to_string().c_str());
  std::exit(1);
}
template <class T>
T must(Result<T> r, const char* what) {
  if (!r) die(what, r.status());
  return std::move(r).value();
}

// One host tier from the installed cpu plugin.
inline std::unique_ptr<TierStack> open_stack() {
  Json doc = Json::parse(R"({"tiers": [{"name": "cpu", "capacity": "256MiB",
                                        "backend": {"type": "cpu"}}]})");
  Profile profile = must(parse_profile(doc, Registry::global(), "inline"), "profile");
  return must(TierStack::open(profile), "TierStack::open");
}

struct Engine {
  std::unique_ptr<TierStack> stack;  // one per rank (here: rank 0 of 1)
  std::unique_ptr<Worker> worker;    // one per rank, over that rank's stack and layout
  std::unique_ptr<Scheduler> sched;  // one per engine; rank 0's worker is its TierView
  StepEvents step() {
    StepPlan plan = sched->build_step();
    worker->submit(plan);
    worker->progress();
    std::vector<OpReport> reports = worker->take_reports();
    return sched->process(reports);
  }
};

inline Engine make_engine(const EngineConfig& config, KvLayout& layout) {
  Engine e;
  e.stack = open_stack();
  e.worker = must(Worker::create(config, 0, *e.stack, layout), "Worker::create");
  e.sched = must(Scheduler::create(config, *e.worker), "Scheduler::create");
  return e;
}

// Runs the prompt to its end on `blocks`/`group` (already filled by the caller: the "forward"),
// then finishes the request and steps until its blocks may be freed.
inline void save_request(Engine& e, RequestId id, const std::vector<std::uint32_t>& prompt,
                         const std::vector<std::uint32_t>& blocks, std::int32_t group) {
  SeqHandle h = e.sched->add_request(id, prompt);
  must(e.sched->lookup(h), "lookup");
  LoadDecision d = e.sched->after_alloc(h, 0, blocks, group);
  if (d.action != LoadAction::kNone) {
    std::fprintf(stderr, "FAIL: first request: expected no load, got %s\n", d.reason.data());
    std::exit(1);
  }
  // Prefill in chunks that end on the SLOT boundaries still to save.
  std::uint64_t computed = 0;
  while (computed < prompt.size()) {
    computed += e.sched->cut_prefill_chunk(h, computed, prompt.size() - computed);
    e.sched->on_computed(h, computed);
    e.step();
  }
  bool freed = e.sched->finish(h);
  for (int i = 0; i < 16 && !freed; ++i)
    for (SeqHandle f : e.step().freeable) freed |= f == h;
  if (!freed) {
    std::fprintf(stderr, "FAIL: first request's blocks never became freeable\n");
    std::exit(1);
  }
}

// Admits the same prompt again on other blocks and waits for its load. Returns the resume
// point (LoadDecision::load_end): the caller continues prefill from there.
inline std::uint64_t load_request(Engine& e, RequestId id, const std::vector<std::uint32_t>& prompt,
                                  const std::vector<std::uint32_t>& blocks, std::int32_t group) {
  SeqHandle h = e.sched->add_request(id, prompt);
  MatchResult m = must(e.sched->lookup(h), "lookup");
  LoadDecision d = e.sched->after_alloc(h, 0, blocks, group);
  if (d.action != LoadAction::kLoad) {
    std::fprintf(stderr, "FAIL: second request: lookup %llu tokens, decision %.*s\n",
                 static_cast<unsigned long long>(m.tokens), static_cast<int>(d.reason.size()),
                 d.reason.data());
    std::exit(1);
  }
  for (int i = 0; i < 16; ++i) {
    StepEvents ev = e.step();
    for (SeqHandle l : ev.loaded)
      if (l == h) {
        // Resume from load_end: prefill [load_end, prompt) and call on_computed after that
        // forward as usual (not for the loaded tokens themselves).
        e.sched->on_computed(h, prompt.size());
        e.step();
        e.sched->finish(h);
        return d.load_end;
      }
    for (SeqHandle l : ev.load_failed)
      if (l == h) {
        std::fprintf(stderr, "FAIL: the load failed\n");
        std::exit(1);
      }
  }
  std::fprintf(stderr, "FAIL: the load never finished\n");
  std::exit(1);
}

}  // namespace demo
