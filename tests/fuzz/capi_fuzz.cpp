// libFuzzer target: the C API (tier/tier.h) as a byte-coded program of calls. Each input opens
// nothing up front; its bytes pick calls (open and close a store, saves and loads of real and
// hostile regions, asynchronous batches, waits, registrations, the DSV4 layout, a worker, a
// scheduler and its per-step calls with fuzzed handles, blocks and reports, keys and JSON text)
// and their arguments. Handles are closed in whatever order the bytes say; the program only keeps
// from passing a handle whose memory the documented rules say is freed (tier.h "Lifetimes").
// Invariants: every call returns a status code of tier.h, and every load that reports OK holds
// exactly the bytes saved under its key (put-if-absent). Needs TIER_PLUGIN_DIR for the cpu plugin
// (run_fuzzers.sh and the replay test set it).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "tier/tier.h"

namespace {

constexpr const char* kProfile =
    "{\"tiers\": [{\"name\": \"cpu\", \"capacity\": \"32MiB\", \"backend\": {\"type\": \"cpu\"}}]}";
constexpr const char* kGeometry =
    "{\"compress_ratios\": [4, 128, 0], \"kv_head_dim\": 64, \"rope_head_dim\": 16,"
    " \"index_head_dim\": 32, \"block_size\": 128, \"sliding_window\": 8,"
    " \"num_blocks\": 8, \"num_slots\": 2}";
constexpr const char* kConfig =
    "{\"block_tokens\": 128, \"chunk_tokens\": 128, \"checkpoint_interval_tokens\": 256,"
    " \"min_load_tokens\": 128}";
constexpr std::size_t kBuf = 1 << 16;

// The program's bytes, read as they are needed (zeros past the end).
class Bytes {
 public:
  Bytes(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  bool more() const { return i_ < n_; }
  std::uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  std::uint32_t u32() { return u8() | (u8() << 8) | (u8() << 16) | (std::uint32_t{u8()} << 24); }
  std::uint64_t u64() { return u32() | (std::uint64_t{u32()} << 32); }
  std::string text(std::size_t max) {
    std::size_t n = std::min<std::size_t>(u8() % (max + 1), n_ - i_);
    std::string s(reinterpret_cast<const char*>(p_ + i_), n);
    i_ += n;
    return s;
  }

 private:
  const std::uint8_t* p_;
  std::size_t n_, i_ = 0;
};

void check_code(int rc) {
  if (rc < TIER_OK || rc > TIER_NO_SPACE) std::abort();
}

tier_key key_of(std::uint8_t k) {
  tier_key key{};
  key.bytes[0] = k % 8;
  key.bytes[15] = 0x77;
  return key;
}

void fill(std::uint8_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(seed * 131u + i * 7u);
}
bool same(const std::uint8_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<std::uint8_t>(seed * 131u + i * 7u)) return false;
  return true;
}

// A handle and whether its memory is still valid: the caller's reference until its close, plus
// one per live dependent.
template <class H>
struct Held {
  H* h = nullptr;
  bool closed = true;
  int dependents = 0;
  bool valid() const { return h && (!closed || dependents > 0); }
  H* use() const { return valid() ? h : nullptr; }
};

struct Program {
  Held<tier_store> store;
  Held<tier_dsv4_layout> layout;
  Held<tier_worker> worker;
  Held<tier_scheduler> sched;
  tier_store* worker_store = nullptr;  // what the worker holds
  tier_dsv4_layout* worker_layout = nullptr;
  std::map<std::uint8_t, std::pair<std::size_t, std::uint32_t>> saved;  // key -> size, seed
  std::vector<std::uint64_t> handles;                                   // scheduler requests
  std::vector<tier_op_report> reports;
  std::vector<tier_memory*> memory;
  std::uint8_t buf[kBuf];

  // Drops a worker's references when it is freed (closed, no scheduler holds it).
  void worker_freed() {
    if (worker.h == nullptr || worker.valid()) return;
    --store.dependents;
    --layout.dependents;
    if (worker_store != store.h) std::abort();  // the model lost track
    worker.h = nullptr;
    if (!store.valid()) store.h = nullptr;
    if (!layout.valid()) layout.h = nullptr;
  }
  void sched_freed() {
    if (sched.h == nullptr || sched.valid()) return;
    --worker.dependents;
    sched.h = nullptr;
    worker_freed();
  }

  // A region of `size` bytes at buf + off (kept inside buf), or a hostile one the library must
  // refuse without touching memory (then *plain is false).
  tier_region region(Bytes& in, std::size_t off, bool* plain) {
    const std::uint8_t how = in.u8();
    const std::size_t size = in.u32() % (kBuf - off + 1);
    *plain = false;
    switch (how % 8) {
      case 0:
        return {nullptr, size + 1, TIER_MEMORY_HOST, -1};  // NULL with bytes
      case 1:
        return {buf, ~std::size_t{0} - in.u8(), TIER_MEMORY_HOST, -1};  // wraps
      case 2:
        return {buf, (std::size_t{1} << 48) + 1 + in.u32(), TIER_MEMORY_HOST, -1};  // too big
      case 3:
        return {buf, size, 4 + in.u8(), -1};  // no such kind
      case 4:
        return {buf, size, TIER_MEMORY_DEVICE, static_cast<std::int32_t>(in.u8()) - 1};
      default:
        *plain = true;
        return {buf + off, size, TIER_MEMORY_HOST, -1};
    }
  }

  // A save or load of up to three regions (one after the other in buf when they are plain).
  void save_or_load(Bytes& in, bool load, bool async) {
    tier_store* s = store.use();
    const std::uint8_t k = in.u8() % 8;
    const std::uint8_t parts = 1 + in.u8() % 3;
    tier_region regions[3];
    bool plain = true;
    std::size_t total = 0;
    for (std::uint8_t i = 0; i < parts; ++i) {
      bool ok = false;
      regions[i] = region(in, total, &ok);
      plain = plain && ok;
      if (ok) total += regions[i].bytes;
    }
    const std::uint32_t seed = in.u8();
    tier_item it{key_of(k), regions, parts};
    std::int32_t code = -1, tier = -2;
    if (!load)
      fill(buf, kBuf, seed);
    else
      std::memset(buf, 0xee, kBuf);
    int rc;
    if (async) {
      std::uint64_t ticket = 0;
      tier_completion* c = nullptr;
      rc = load ? tier_store_submit_load(s, &it, 1, &ticket)
                : tier_store_submit_save(s, &it, 1, &ticket);
      check_code(rc);
      if (rc != TIER_OK) return;
      check_code(rc = tier_store_wait(s, ticket, -1, &c));
      if (rc != TIER_OK) return;
      if (tier_completion_ticket(c) != ticket || tier_completion_count(c) != 1) std::abort();
      code = tier_completion_codes(c)[0];
      tier_completion_free(c);
    } else {
      rc = load ? tier_store_load(s, &it, 1, &code, &tier) : tier_store_save(s, &it, 1, &code);
      check_code(rc);
      if (rc != TIER_OK) return;
    }
    check_code(code);
    // Hostile regions are refused, whatever else the item holds.
    if (!plain && code == TIER_OK) std::abort();
    if (!plain || code != TIER_OK) return;
    auto found = saved.find(k);
    if (!load) {
      if (found == saved.end()) saved[k] = {total, seed};
      return;
    }
    // A load that reports OK holds the bytes first saved under the key.
    if (found == saved.end() || found->second.first != total ||
        !same(buf, total, found->second.second))
      std::abort();
  }

  void run(Bytes& in) {
    switch (in.u8() % 24) {
      case 0:
        if (!store.h) {
          check_code(tier_store_open_json(kProfile, nullptr, in.u8() % 2, &store.h));
          store.closed = store.h == nullptr;
          saved.clear();
        }
        break;
      case 1:
        if (store.valid() && !store.closed) {
          tier_store_close(store.h);
          store.closed = true;
          if (!store.valid()) store.h = nullptr;
        }
        break;
      case 2:
        save_or_load(in, false, false);
        break;
      case 3:
        save_or_load(in, true, false);
        break;
      case 4:
        save_or_load(in, in.u8() % 2, true);
        break;
      case 5: {
        tier_key keys[4];
        std::uint8_t out[4];
        std::size_t n = in.u8() % 5, prefix = 0;
        for (std::size_t i = 0; i < n; ++i) keys[i] = key_of(in.u8());
        check_code(tier_store_exists(store.use(), keys, n, out));
        check_code(tier_store_lookup_prefix(store.use(), keys, n, &prefix));
        tier_object_stat stats[4];
        check_code(tier_store_stat(store.use(), keys, n, stats));
        std::int32_t codes[4];
        if (in.u8() % 4 == 0) {
          if (n == 0) {  // no key to remove: the whole namespace instead
            std::uint64_t removed = 0;
            check_code(tier_store_clear(store.use(), nullptr, &removed));
            saved.clear();
          } else {
            check_code(tier_store_remove(store.use(), keys, n, codes));
            for (std::size_t i = 0; i < n; ++i) saved.erase(keys[i].bytes[0]);  // key_of(k): k % 8
          }
        }
        break;
      }
      case 6: {
        tier_completion* c = nullptr;
        check_code(tier_store_poll(store.use(), &c));
        tier_completion_free(c);
        check_code(tier_store_wait(store.use(), in.u64() % 4, in.u8() % 3, &c));
        tier_completion_free(c);
        check_code(tier_store_flush(store.use(), static_cast<std::int64_t>(in.u64())));
        check_code(tier_store_progress(store.use()));
        break;
      }
      case 7: {
        char* text = nullptr;
        if (tier_store_metrics_json(store.use(), &text) == TIER_OK) tier_free(text);
        if (tier_store_metrics_prometheus(store.use(), &text) == TIER_OK) tier_free(text);
        (void)tier_store_tier_name(store.use(), in.u8());
        (void)tier_store_metrics_endpoint(store.use());
        break;
      }
      case 8: {
        tier_memory* m = nullptr;
        bool plain = false;
        tier_region r = region(in, 0, &plain);
        check_code(tier_memory_register(store.use(), r.ptr, r.bytes, r.kind, r.device, &m));
        if (m) memory.push_back(m);
        break;
      }
      case 9:
        if (!memory.empty()) {
          check_code(tier_memory_release(memory.back()));
          memory.pop_back();
        }
        break;
      case 10:
        if (!layout.h) {
          tier_key ns = key_of(1);
          check_code(tier_dsv4_layout_create(
              in.u8() % 4 ? kGeometry
                          : "{\"preset\": \"v4-flash-fp8\", \"num_blocks\": 2, \"num_slots\": 1}",
              &ns, 1 + in.u8() % 2, 0, nullptr, &layout.h));
          layout.closed = layout.h == nullptr;
        }
        break;
      case 11:
        if (layout.valid() && !layout.closed) {
          tier_dsv4_layout_destroy(layout.h);
          layout.closed = true;
          if (!layout.valid()) layout.h = nullptr;
        }
        break;
      case 12: {
        std::uint32_t ids[3] = {in.u32() % 12, in.u32(), in.u8()};
        tier_region out[64];
        std::size_t n = 0;
        check_code(tier_dsv4_layout_page_regions(layout.use(), ids, in.u8() % 4, out, 64, &n));
        check_code(tier_dsv4_layout_slot_regions(layout.use(), static_cast<std::int8_t>(in.u8()),
                                                 out, in.u8() % 65, &n));
        break;
      }
      case 13:
        if (!worker.h && store.valid() && layout.valid()) {
          tier_key ns = key_of(1);
          check_code(tier_worker_create(in.u8() % 8 ? kConfig : "{\"block_tokens\": 7}", &ns, 0,
                                        store.h, layout.h, &worker.h));
          worker.closed = worker.h == nullptr;
          if (worker.h) {
            ++store.dependents;
            ++layout.dependents;
            worker_store = store.h;
            worker_layout = layout.h;
          }
        }
        break;
      case 14:
        if (worker.valid() && !worker.closed) {
          tier_worker_destroy(worker.h);
          worker.closed = true;
          worker_freed();
        }
        break;
      case 15:
        if (!sched.h && worker.valid()) {
          tier_key ns = key_of(1);
          check_code(tier_scheduler_create(kConfig, &ns, worker.h, &sched.h));
          sched.closed = sched.h == nullptr;
          if (sched.h) ++worker.dependents;
        }
        break;
      case 16:
        if (sched.valid() && !sched.closed) {
          tier_scheduler_destroy(sched.h);
          sched.closed = true;
          sched_freed();
        }
        break;
      case 17: {
        std::uint32_t prompt[1024];
        const std::size_t n = in.u32() % 1025;
        const std::uint32_t base = in.u8();
        for (std::size_t i = 0; i < n; ++i) prompt[i] = base + static_cast<std::uint32_t>(i);
        std::uint64_t h = 0;
        // An odd base adds an extra key (a LoRA name): the _extra call, as add_request calls it.
        check_code(tier_scheduler_add_request_extra(sched.use(), in.u64(), prompt, n,
                                                    base % 2 ? "lora" : nullptr, base % 2 ? 4 : 0,
                                                    &h));
        (void)tier_scheduler_epoch(sched.use());
        if (h) handles.push_back(h);
        break;
      }
      case 18: {
        const std::uint64_t h =
            handles.empty() || in.u8() % 8 == 0 ? in.u64() : handles[in.u8() % handles.size()];
        tier_match m;
        tier_load_decision d;
        std::uint32_t blocks[8];
        const std::size_t nb = in.u8() % 9;
        for (std::size_t i = 0; i < nb; ++i) blocks[i] = in.u8() % 10;
        std::uint64_t cut = 0;
        std::int32_t flag = 0;
        switch (in.u8() % 7) {
          case 0:
            check_code(tier_scheduler_lookup(sched.use(), h, &m));
            break;
          case 1:
            check_code(tier_scheduler_after_alloc(sched.use(), h, in.u64() % 2048, blocks, nb,
                                                  static_cast<std::int8_t>(in.u8()) % 3, &d));
            break;
          case 2:
            check_code(tier_scheduler_set_blocks(sched.use(), h, blocks, nb));
            break;
          case 3:
            check_code(tier_scheduler_cut_prefill_chunk(sched.use(), h, in.u64(), in.u64(), &cut));
            break;
          case 4:
            check_code(tier_scheduler_on_computed(sched.use(), h, in.u64()));
            break;
          case 5:
            check_code(tier_scheduler_should_defer_free(sched.use(), h, &flag));
            break;
          default:
            check_code(tier_scheduler_finish(sched.use(), h, &flag));
            break;
        }
        break;
      }
      case 19: {
        tier_plan* plan = nullptr;
        check_code(tier_scheduler_build_step(sched.use(), &plan));
        check_code(tier_worker_submit_after(worker.use(), plan, nullptr, nullptr));
        std::uint8_t* wire = nullptr;
        std::size_t wire_bytes = 0;
        if (tier_plan_encode(plan, &wire, &wire_bytes) == TIER_OK) {
          tier_plan* back = nullptr;
          check_code(tier_plan_decode(wire, wire_bytes, &back));
          tier_plan_free(back);
          tier_free(wire);
        }
        check_code(tier_worker_release_lease(worker.use(), tier_plan_load_lease(plan, 0)));
        tier_load_op lop;
        tier_save_op sop;
        check_code(tier_plan_load(plan, in.u8() % 2, &lop));
        check_code(tier_plan_save(plan, in.u8() % 2, &sop));
        tier_plan_free(plan);
        std::size_t done = 0;
        check_code(tier_worker_progress(worker.use(), in.u8() % 3 ? SIZE_MAX : in.u8(), &done));
        tier_op_report r[16];
        std::size_t n = 0;
        check_code(tier_worker_take_reports(worker.use(), r, in.u8() % 17, &n));
        reports.assign(r, r + n);
        (void)tier_worker_queued_saves(worker.use());
        char* text = nullptr;
        if (tier_worker_metrics_json(worker.use(), &text) == TIER_OK) tier_free(text);
        break;
      }
      case 20: {
        // Reports as the worker made them, or with fields the bytes change.
        std::vector<tier_op_report> r = reports;
        if (in.u8() % 2 || r.empty()) {
          std::string reason = in.text(8);
          r.push_back(tier_op_report{static_cast<std::int32_t>(in.u8() % 5) - 1, in.u8(),
                                     in.u64() % 64, in.u64() % 8, in.u8() % 2,
                                     static_cast<std::int32_t>(in.u8() % 12) - 1, nullptr});
          if (in.u8() % 2) r.back().reason = "fuzz";
        }
        std::uint8_t* wire = nullptr;
        std::size_t wire_bytes = 0;
        if (tier_reports_encode(r.data(), r.size(), &wire, &wire_bytes) == TIER_OK) {
          tier_reports* back = nullptr;
          check_code(tier_reports_decode(wire, wire_bytes, &back));
          std::size_t count = 0;
          (void)tier_reports_get(back, &count);
          tier_reports_free(back);
          tier_free(wire);
        }
        tier_events* ev = nullptr;
        check_code(tier_scheduler_process(sched.use(), r.data(), r.size(), &ev));
        std::size_t n = 0;
        (void)tier_events_loaded(ev, &n);
        (void)tier_events_freeable(ev, &n);
        tier_events_free(ev);
        reports.clear();
        break;
      }
      case 21: {
        char* text = nullptr;
        tier_worker* ws[1] = {worker.use()};
        if (tier_engine_metrics_json(sched.use(), ws, in.u8() % 2, &text) == TIER_OK)
          tier_free(text);
        break;
      }
      case 22: {
        std::string json = in.text(64);
        tier_key k;
        check_code(tier_namespace_id(json.c_str(), &k));
        check_code(tier_key_from_hex(json.c_str(), &k));
        std::uint32_t tokens[64];
        const std::size_t n = in.u8() % 65;
        for (std::size_t i = 0; i < n; ++i) tokens[i] = in.u32();
        tier_key out[64];
        std::size_t count = 0;
        check_code(
            tier_chunk_keys(&k, tokens, n, in.u8() % 9, in.u8() % 2, out, in.u8() % 65, &count));
        break;
      }
      default: {
        std::string json = in.text(96);
        tier_store* s = nullptr;
        check_code(tier_store_open_json(json.c_str(), nullptr, 0, &s));
        tier_store_close(s);
        break;
      }
    }
  }

  // Closes what the program left open, in an order the bytes did not choose.
  void end() {
    for (tier_memory* m : memory) check_code(tier_memory_release(m));
    if (sched.valid() && !sched.closed) tier_scheduler_destroy(sched.h);
    if (worker.valid() && !worker.closed) tier_worker_destroy(worker.h);
    if (layout.valid() && !layout.closed) tier_dsv4_layout_destroy(layout.h);
    if (store.valid() && !store.closed) tier_store_close(store.h);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Program* scratch = new Program;  // buf is 64 KiB: not on the stack
  Program& p = *scratch;
  p.~Program();
  new (&p) Program;
  Bytes in(data, size);
  for (int calls = 0; in.more() && calls < 64; ++calls) p.run(in);
  p.end();
  return 0;
}
