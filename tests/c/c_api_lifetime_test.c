/* The C API's lifetime rules (tier/tier.h "Lifetimes") and hostile arguments, driven from C:
 *  - a worker keeps its store and its layout, a scheduler its worker: closing the base first
 *    frees nothing a dependent uses (a queued save still reads the layout's bytes, a lookup still
 *    reaches the tiers), and calls through the closed handle get BAD_STATE;
 *  - tier_store_close on one thread while four threads are inside save, submit, wait and load
 *    calls: each call finishes or returns BAD_STATE, nothing crashes or hangs;
 *  - sizes that overflow (a region of 2^64 - 8 bytes, regions whose sum wraps, a region whose
 *    end wraps the address space) and JSON nested 100,000 deep: INVALID_ARGUMENT.
 * Needs TIER_PLUGIN_DIR for the cpu plugin. Exit 0 when every check passed, 1 otherwise. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tier/tier.h"

static const char* kProfile =
    "{\"tiers\": [{\"name\": \"cpu\", \"capacity\": \"64MiB\", \"backend\": {\"type\": \"cpu\"}}]}";
static const char* kGeometry =
    "{\"compress_ratios\": [4, 128, 0], \"kv_head_dim\": 64, \"rope_head_dim\": 16,"
    " \"index_head_dim\": 32, \"block_size\": 128, \"sliding_window\": 8,"
    " \"num_blocks\": 16, \"num_slots\": 2}";
static const char* kConfig =
    "{\"block_tokens\": 128, \"chunk_tokens\": 128, \"checkpoint_interval_tokens\": 256,"
    " \"min_load_tokens\": 128}";

static tier_key key_n(uint32_t i) {
  tier_key k;
  memset(&k, 0, sizeof k);
  memcpy(k.bytes, &i, sizeof i);
  k.bytes[15] = 0x5a;
  return k;
}

static void fill(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (uint8_t)(seed * 131u + i * 7u);
}
static int same(const uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != (uint8_t)(seed * 131u + i * 7u)) return 0;
  return 1;
}

typedef struct {
  tier_store* store;
  tier_dsv4_layout* layout;
  tier_worker* worker;
  tier_scheduler* sched;
  tier_key ns;
} engine;

static engine engine_open(void) {
  engine e;
  REQUIRE_OK(tier_namespace_id("{\"model\": \"c-api-lifetime\"}", &e.ns));
  REQUIRE_OK(tier_store_open_json(kProfile, NULL, 0, &e.store));
  REQUIRE_OK(tier_dsv4_layout_create(kGeometry, &e.ns, 1, 0, NULL, &e.layout));
  REQUIRE_OK(tier_worker_create(kConfig, &e.ns, 0, e.store, e.layout, &e.worker));
  REQUIRE_OK(tier_scheduler_create(kConfig, &e.ns, e.worker, &e.sched));
  return e;
}

/* Request 1's chunks computed into blocks 0..3 (bytes seeded by chunk), saves planned and
 * submitted to the worker but not yet run. */
static void queue_saves(engine* e, uint32_t* prompt, size_t tokens) {
  uint64_t h = 0;
  REQUIRE_OK(tier_scheduler_add_request(e->sched, 1, prompt, tokens, &h));
  tier_match m;
  REQUIRE_OK(tier_scheduler_lookup(e->sched, h, &m));
  const uint32_t blocks[4] = {0, 1, 2, 3};
  tier_load_decision d;
  REQUIRE_OK(tier_scheduler_after_alloc(e->sched, h, 0, blocks, 4, 0, &d));
  tier_region r[64];
  size_t n = 0;
  for (uint32_t c = 0; c < 4; ++c) {
    REQUIRE_OK(tier_dsv4_layout_page_regions(e->layout, &blocks[c], 1, r, 64, &n));
    for (size_t i = 0; i < n; ++i)
      fill((uint8_t*)r[i].ptr, r[i].bytes, 100 * (c + 1) + (uint32_t)i);
  }
  REQUIRE_OK(tier_scheduler_on_computed(e->sched, h, tokens));
  tier_plan* plan = NULL;
  REQUIRE_OK(tier_scheduler_build_step(e->sched, &plan));
  CHECK(tier_plan_save_count(plan) > 0);
  REQUIRE_OK(tier_worker_submit(e->worker, plan));
  tier_plan_free(plan);
}

/* The layout and the store closed under a worker with queued saves: the saves still run from
 * the layout's memory into the store, and the scheduler still sees them through its worker. */
static void test_bases_closed_first(void) {
  engine e = engine_open();
  uint32_t prompt[512];
  for (uint32_t i = 0; i < 512; ++i) prompt[i] = 7 + i * 3;
  queue_saves(&e, prompt, 512);
  CHECK(tier_worker_queued_saves(e.worker) > 0);
  tier_dsv4_layout_destroy(e.layout);
  tier_store_close(e.store);
  /* The handles stay valid while the worker holds them; calls through them are refused. */
  size_t n = 0;
  tier_region r[4];
  CHECK(tier_dsv4_layout_slot_regions(e.layout, 0, r, 4, &n) == TIER_BAD_STATE);
  CHECK(strstr(tier_last_error(), "closed") != NULL);
  CHECK(tier_dsv4_layout_block_tokens(e.layout) == 0);
  size_t prefix = 0;
  tier_key k = key_n(1);
  CHECK(tier_store_lookup_prefix(e.store, &k, 1, &prefix) == TIER_BAD_STATE);
  tier_object_stat st;
  CHECK(tier_store_stat(e.store, &k, 1, &st) == TIER_BAD_STATE);
  uint64_t removed = 0;
  CHECK(tier_store_clear(e.store, NULL, &removed) == TIER_BAD_STATE);
  CHECK(strcmp(tier_store_metrics_endpoint(e.store), "") == 0);
  tier_store_close(e.store); /* a second close does nothing */
  size_t done = 0;
  REQUIRE_OK(tier_worker_progress(e.worker, SIZE_MAX, &done));
  CHECK(done > 0);
  tier_op_report reports[16];
  REQUIRE_OK(tier_worker_take_reports(e.worker, reports, 16, &n));
  CHECK(n > 0);
  for (size_t i = 0; i < n; ++i) CHECK(reports[i].ok == 1);
  tier_events* ev = NULL;
  REQUIRE_OK(tier_scheduler_process(e.sched, reports, n, &ev));
  tier_events_free(ev);
  /* A second request with the same prompt finds the saved chunks through the closed store. */
  uint64_t h2 = 0;
  REQUIRE_OK(tier_scheduler_add_request(e.sched, 2, prompt, 512, &h2));
  tier_match m;
  REQUIRE_OK(tier_scheduler_lookup(e.sched, h2, &m));
  CHECK(m.page_hit == 512);
  tier_scheduler_destroy(e.sched);
  tier_worker_destroy(e.worker); /* frees the worker, then the layout and the store */
}

/* The worker destroyed under its scheduler: lookups still reach the tiers. */
static void test_worker_closed_first(void) {
  engine e = engine_open();
  uint32_t prompt[256];
  for (uint32_t i = 0; i < 256; ++i) prompt[i] = i;
  uint64_t h = 0;
  REQUIRE_OK(tier_scheduler_add_request(e.sched, 1, prompt, 256, &h));
  tier_worker_destroy(e.worker);
  CHECK(tier_worker_progress(e.worker, SIZE_MAX, NULL) == TIER_BAD_STATE);
  CHECK(tier_worker_queued_saves(e.worker) == 0);
  CHECK(tier_worker_release_lease(e.worker, 1) == TIER_BAD_STATE);
  char* worker_text = NULL;
  CHECK(tier_worker_metrics_json(e.worker, &worker_text) == TIER_BAD_STATE);
  tier_match m;
  REQUIRE_OK(tier_scheduler_lookup(e.sched, h, &m));
  CHECK(m.tokens == 0);
  char* text = NULL;
  CHECK(tier_engine_metrics_json(e.sched, &e.worker, 1, &text) == TIER_BAD_STATE);
  REQUIRE_OK(tier_engine_metrics_json(e.sched, NULL, 0, &text));
  tier_free(text);
  tier_plan* plan = NULL;
  REQUIRE_OK(tier_scheduler_build_step(e.sched, &plan));
  CHECK(tier_worker_submit_after(e.worker, plan, NULL, NULL) == TIER_BAD_STATE);
  tier_plan_free(plan);
  tier_store_close(e.store);
  tier_dsv4_layout_destroy(e.layout);
  tier_scheduler_destroy(e.sched); /* the last reference to everything */
}

/* Four threads use one store while the main thread closes it. A worker over the store keeps
 * the handle valid after the close, so the threads may go on calling until they see BAD_STATE
 * (without a dependent, calls after close returned would be the caller's use-after-free). */
typedef struct {
  tier_store* store;
  uint32_t id;
  atomic_int ok_calls;
  int closed_calls, bad;
} racer;

static void* race(void* p) {
  racer* a = (racer*)p;
  enum { kBytes = 16384 };
  uint8_t* buf = malloc(kBytes);
  for (uint32_t r = 0; r < 100000; ++r) {
    const uint32_t seed = a->id * 100000 + r;
    fill(buf, kBytes, seed);
    tier_region reg = {buf, kBytes, TIER_MEMORY_HOST, -1};
    tier_item it = {key_n(seed), &reg, 1};
    int32_t code = -1;
    int rc = tier_store_save(a->store, &it, 1, &code);
    uint64_t t = 0;
    tier_completion* c = NULL;
    if (rc == TIER_OK) {
      memset(buf, 0, kBytes);
      rc = tier_store_submit_load(a->store, &it, 1, &t);
    }
    if (rc == TIER_OK) rc = tier_store_wait(a->store, t, -1, &c);
    if (rc == TIER_OK) {
      if (tier_completion_codes(c)[0] != TIER_OK || !same(buf, kBytes, seed)) ++a->bad;
      tier_completion_free(c);
      atomic_fetch_add(&a->ok_calls, 1);
      continue;
    }
    if (rc == TIER_BAD_STATE) {
      ++a->closed_calls;
      break;
    }
    fprintf(stderr, "racer %u: %s: %s\n", a->id, tier_code_name(rc), tier_last_error());
    ++a->bad;
    break;
  }
  free(buf);
  return NULL;
}

static void test_close_races_calls(void) {
  for (int round = 0; round < 10; ++round) {
    engine e = engine_open();
    enum { kThreads = 4 };
    pthread_t th[kThreads];
    racer args[kThreads];
    for (uint32_t i = 0; i < kThreads; ++i) {
      args[i].store = e.store;
      args[i].id = i + 1;
      atomic_init(&args[i].ok_calls, 0);
      args[i].closed_calls = args[i].bad = 0;
      pthread_create(&th[i], NULL, race, &args[i]);
    }
    /* Let the threads get going, then close under them. */
    while (atomic_load(&args[0].ok_calls) + atomic_load(&args[1].ok_calls) < 4 + round)
      sched_yield();
    tier_store_close(e.store);
    for (int i = 0; i < kThreads; ++i) {
      pthread_join(th[i], NULL);
      CHECK(args[i].bad == 0);
      CHECK(args[i].closed_calls == 1);
    }
    tier_scheduler_destroy(e.sched);
    tier_worker_destroy(e.worker);
    tier_dsv4_layout_destroy(e.layout);
  }
}

static void test_hostile_sizes(void) {
  tier_store* s = NULL;
  REQUIRE_OK(tier_store_open_json(kProfile, NULL, 0, &s));
  static uint8_t buf[4096];
  int32_t code = -1;
  /* A region of 2^64 - 8 bytes (once: 96 + size wrapped and the library wrote past its own
   * 4 KiB image). */
  tier_region huge = {buf, (size_t)0xfffffffffffffff8ull, TIER_MEMORY_HOST, -1};
  tier_item it = {key_n(1), &huge, 1};
  CHECK(tier_store_save(s, &it, 1, &code) == TIER_INVALID_ARGUMENT);
  CHECK(strstr(tier_last_error(), "address space") != NULL);
  /* Two regions whose sizes sum past 2^64, each inside the address space. */
  tier_region two[2] = {{(void*)(uintptr_t)4096, (size_t)1 << 63, TIER_MEMORY_HOST, -1},
                        {(void*)(uintptr_t)4096, (size_t)1 << 63, TIER_MEMORY_HOST, -1}};
  tier_item it2 = {key_n(2), two, 2};
  REQUIRE_OK(tier_store_save(s, &it2, 1, &code));
  CHECK(code == TIER_INVALID_ARGUMENT);
  int32_t tier = 0;
  REQUIRE_OK(tier_store_load(s, &it2, 1, &code, &tier));
  CHECK(code == TIER_INVALID_ARGUMENT && tier == -1);
  /* Within the address space and not wrapping, but larger than any object (2^48 bytes). */
  tier_region big = {(void*)(uintptr_t)4096, (size_t)1 << 60, TIER_MEMORY_HOST, -1};
  tier_item it3 = {key_n(3), &big, 1};
  REQUIRE_OK(tier_store_save(s, &it3, 1, &code));
  CHECK(code == TIER_INVALID_ARGUMENT);
  uint64_t ticket = 0;
  tier_completion* c = NULL;
  REQUIRE_OK(tier_store_submit_save(s, &it3, 1, &ticket));
  REQUIRE_OK(tier_store_wait(s, ticket, INT64_MAX, &c));
  CHECK(tier_completion_codes(c)[0] == TIER_INVALID_ARGUMENT);
  tier_completion_free(c);
  tier_memory* m = NULL;
  CHECK(tier_memory_register(s, buf, (size_t)-1, TIER_MEMORY_HOST, -1, &m) ==
        TIER_INVALID_ARGUMENT);
  /* The store still works. */
  fill(buf, sizeof buf, 9);
  tier_region ok = {buf, sizeof buf, TIER_MEMORY_HOST, -1};
  tier_item it4 = {key_n(4), &ok, 1};
  REQUIRE_OK(tier_store_save(s, &it4, 1, &code));
  CHECK(code == TIER_OK);
  memset(buf, 0, sizeof buf);
  REQUIRE_OK(tier_store_load(s, &it4, 1, &code, NULL));
  CHECK(code == TIER_OK && same(buf, sizeof buf, 9));
  CHECK(tier_store_flush(s, INT64_MAX) == TIER_OK);
  tier_store_close(s);
}

/* JSON objects nested 100,000 deep (once: a stack overflow in canonical_into). */
static void test_deep_json(void) {
  enum { kDepth = 100000 };
  char* text = malloc(6 * kDepth + 16);
  size_t n = 0;
  for (int i = 0; i < kDepth; ++i) n += (size_t)sprintf(text + n, "{\"a\":");
  text[n++] = '1';
  for (int i = 0; i < kDepth; ++i) text[n++] = '}';
  text[n] = '\0';
  tier_key k;
  CHECK(tier_namespace_id(text, &k) == TIER_INVALID_ARGUMENT);
  CHECK(strstr(tier_last_error(), "deeper than") != NULL);
  tier_store* s = NULL;
  CHECK(tier_store_open_json(text, NULL, 0, &s) == TIER_INVALID_ARGUMENT);
  tier_dsv4_layout* l = NULL;
  CHECK(tier_dsv4_layout_create(text, &k, 1, 0, NULL, &l) == TIER_INVALID_ARGUMENT);
  free(text);
}

int main(void) {
  test_bases_closed_first();
  test_worker_closed_first();
  test_close_races_calls();
  test_hostile_sizes();
  test_deep_json();
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("c_api_lifetime_test: all checks passed\n");
  return 0;
}
