/* The C API (tier/tier.h) compiled and driven as C: status codes and errors, keys (golden
 * vectors of docs/keys.md), the store (blocking and asynchronous batches, scatter/gather,
 * registration, metrics, stat, one copy of host regions, several threads at once), the log
 * (levels, a sink), the metrics endpoint, the sizing curve, and the offload engine over a small
 * DSV4 layout (a save of PAGE+SLOT, then a resume that restores the bytes). Needs
 * TIER_PLUGIN_DIR for the cpu plugin. Exit 0 when every check passed, 1 otherwise. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, close */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tier/tier.h"

static const char* kProfile =
    "{\"tiers\": [{\"name\": \"cpu\", \"capacity\": \"64MiB\", \"backend\": {\"type\": \"cpu\"}}]}";

static void hex_of(const tier_key* k, char out[33]) { tier_key_to_hex(k, out); }

static void test_status(void) {
  CHECK(tier_abi_version() == TIER_C_ABI_VERSION);
  CHECK(strlen(tier_version()) > 0);
  CHECK(strcmp(tier_code_name(TIER_OK), "ok") == 0);
  CHECK(strcmp(tier_code_name(TIER_NOT_FOUND), "not_found") == 0);
  CHECK(strcmp(tier_code_name(TIER_CHECKSUM_MISMATCH), "checksum_mismatch") == 0);
  CHECK(strcmp(tier_code_name(TIER_NO_SPACE), "no_space") == 0);
  CHECK(strcmp(tier_code_name(99), "unknown") == 0);
  tier_key k;
  CHECK(tier_key_from_hex("xyz", &k) == TIER_INVALID_ARGUMENT);
  CHECK(strstr(tier_last_error(), "32 hex digits") != NULL);
}

static void test_keys(void) {
  tier_key ns, keys[3];
  char hex[33];
  REQUIRE_OK(tier_namespace_id(
      "{\"model\":\"deepseek-v4-pro\",\"layout_version\":1,\"kv_dtype\":\"fp8\","
      "\"block_size\":256,\"chunk_size\":256,\"tp_size\":8}",
      &ns));
  hex_of(&ns, hex);
  CHECK(strcmp(hex, "6fe91321d1cb766be97f553a73bcd7f3") == 0);
  const uint32_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  size_t n = 0;
  REQUIRE_OK(tier_chunk_keys(&ns, tokens, 9, 4, 0, NULL, 0, &n));
  CHECK(n == 2);
  CHECK(tier_chunk_keys(&ns, tokens, 9, 4, 1, keys, 2, &n) == TIER_INVALID_ARGUMENT);
  REQUIRE_OK(tier_chunk_keys(&ns, tokens, 9, 4, 1, keys, 3, &n));
  CHECK(n == 3);
  hex_of(&keys[0], hex);
  CHECK(strcmp(hex, "91035bd943d14336f4aa8f1f7f8852c3") == 0);
  hex_of(&keys[1], hex);
  CHECK(strcmp(hex, "9d2bcacea2eb4ce4329f22197e47b870") == 0);
  /* An extra key (LoRA adapter, cache salt: docs/keys.md) changes every key; none is the above. */
  tier_key plain[2], lora_a[2], lora_b[2];
  REQUIRE_OK(tier_chunk_keys_extra(&ns, tokens, 8, 4, 0, NULL, 0, plain, 2, &n));
  CHECK(memcmp(plain, keys, sizeof plain) == 0);
  REQUIRE_OK(tier_chunk_keys_extra(&ns, tokens, 8, 4, 0, "lora:adapter-a", 14, lora_a, 2, &n));
  REQUIRE_OK(tier_chunk_keys_extra(&ns, tokens, 8, 4, 0, "lora:adapter-b", 14, lora_b, 2, &n));
  for (int i = 0; i < 2; ++i) {
    CHECK(memcmp(&lora_a[i], &plain[i], sizeof(tier_key)) != 0);
    CHECK(memcmp(&lora_a[i], &lora_b[i], sizeof(tier_key)) != 0);
  }
  hex_of(&lora_a[0], hex);
  CHECK(strcmp(hex, "15777650889c860dcf6e03a608eaec08") == 0);
  CHECK(tier_chunk_keys_extra(&ns, tokens, 8, 4, 0, NULL, 3, lora_a, 2, &n) ==
        TIER_INVALID_ARGUMENT);
  hex_of(&keys[1], hex);
  tier_key back;
  REQUIRE_OK(tier_key_from_hex(hex, &back));
  CHECK(memcmp(&back, &keys[1], sizeof back) == 0);
  tier_key e1, e2;
  tier_external_key("page-0", 6, &e1);
  tier_external_key("page-1", 6, &e2);
  CHECK(memcmp(&e1, &e2, sizeof e1) != 0);
  hex_of(&e1, hex);
  CHECK(strcmp(hex, "eacce5cdadeb584f87deaea30152654f") == 0);
}

/* Fills `n` bytes with a pattern of (seed, offset). */
static void fill(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = (uint8_t)((i * 31u + seed * 7u + (i >> 8)) & 0xff);
}
static int same(const uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != (uint8_t)((i * 31u + seed * 7u + (i >> 8)) & 0xff)) return 0;
  return 1;
}

static tier_key key_n(uint32_t i) {
  char name[32];
  int len = snprintf(name, sizeof name, "object-%u", i);
  tier_key k;
  tier_external_key(name, (size_t)len, &k);
  return k;
}

static void test_store(void) {
  tier_store* bad = NULL;
  CHECK(tier_store_open_json("{\"tiers\": [{\"name\": 3}]}", NULL, 0, &bad) ==
        TIER_INVALID_ARGUMENT);
  CHECK(bad == NULL);
  CHECK(strstr(tier_last_error(), "/tiers/0") != NULL);
  CHECK(tier_store_open("/nonexistent/profile.json", NULL, 0, &bad) != TIER_OK);

  tier_store* s = NULL;
  REQUIRE_OK(tier_store_open_json(kProfile, NULL, 0, &s));
  CHECK(tier_store_tier_count(s) == 1);
  CHECK(strcmp(tier_store_tier_name(s, 0), "cpu") == 0);
  CHECK(tier_store_tier_name(s, 1) == NULL);

  enum { kN = 4, kBytes = 3000 };
  static uint8_t src[kN][kBytes], dst[kN][kBytes];
  tier_region src_r[kN][2], dst_r[kN][2];
  tier_item saves[kN], loads[kN];
  tier_key keys[kN + 1];
  for (uint32_t i = 0; i < kN; ++i) {
    fill(src[i], kBytes, i);
    keys[i] = key_n(i);
    /* Two regions per object: scatter/gather with uneven halves. */
    src_r[i][0] = (tier_region){src[i], 1000, TIER_MEMORY_HOST, -1};
    src_r[i][1] = (tier_region){src[i] + 1000, kBytes - 1000, TIER_MEMORY_HOST, -1};
    dst_r[i][0] = (tier_region){dst[i], 2000, TIER_MEMORY_HOST, -1};
    dst_r[i][1] = (tier_region){dst[i] + 2000, kBytes - 2000, TIER_MEMORY_HOST, -1};
    saves[i] = (tier_item){keys[i], src_r[i], 2};
    loads[i] = (tier_item){keys[i], dst_r[i], 2};
  }
  keys[kN] = key_n(99);
  int32_t codes[kN + 1], tiers[kN + 1];
  size_t prefix = 7;
  REQUIRE_OK(tier_store_lookup_prefix(s, keys, kN, &prefix));
  CHECK(prefix == 0);
  REQUIRE_OK(tier_store_save(s, saves, 3, codes));
  for (int i = 0; i < 3; ++i) CHECK(codes[i] == TIER_OK);
  REQUIRE_OK(tier_store_lookup_prefix(s, keys, kN, &prefix));
  CHECK(prefix == 3);
  uint8_t ex[kN + 1];
  REQUIRE_OK(tier_store_exists(s, keys, kN + 1, ex));
  CHECK(ex[0] == 1 && ex[2] == 1 && ex[3] == 0 && ex[4] == 0);

  memset(dst, 0, sizeof dst);
  REQUIRE_OK(tier_store_load(s, loads, kN, codes, tiers));
  for (uint32_t i = 0; i < 3; ++i) {
    CHECK(codes[i] == TIER_OK);
    CHECK(tiers[i] == 0);
    CHECK(same(dst[i], kBytes, i));
  }
  CHECK(codes[3] == TIER_NOT_FOUND);
  CHECK(tiers[3] == -1);

  /* A region list of the wrong size fails that item only, writing nothing. */
  memset(dst[0], 0xAB, kBytes);
  tier_region short_r = {dst[0], kBytes - 1, TIER_MEMORY_HOST, -1};
  tier_item wrong = {keys[0], &short_r, 1};
  REQUIRE_OK(tier_store_load(s, &wrong, 1, codes, NULL));
  CHECK(codes[0] == TIER_INVALID_ARGUMENT);
  CHECK(dst[0][0] == 0xAB);

  /* A malformed region fails the call. */
  tier_region bad_kind = {src[0], 10, 42, -1};
  tier_item bad_item = {keys[0], &bad_kind, 1};
  CHECK(tier_store_save(s, &bad_item, 1, codes) == TIER_INVALID_ARGUMENT);
  CHECK(strstr(tier_last_error(), "memory kind") != NULL);

  /* Device memory without the GPU floor (or a GPU) is refused per item, never touched. */
  tier_region dev = {(void*)0x1000, 64, TIER_MEMORY_DEVICE, 0};
  tier_item dev_item = {keys[kN], &dev, 1};
  int rc = tier_store_save(s, &dev_item, 1, codes);
  CHECK(rc == TIER_OK);
  CHECK(codes[0] != TIER_OK);

  /* Asynchronous: submit returns a ticket; wait and poll hand out completions. */
  uint64_t t1 = 0, t2 = 0;
  REQUIRE_OK(tier_store_submit_save(s, &saves[3], 1, &t1));
  CHECK(t1 > 0);
  tier_completion* c = NULL;
  REQUIRE_OK(tier_store_wait(s, t1, -1, &c));
  CHECK(tier_completion_ticket(c) == t1);
  CHECK(tier_completion_op(c) == TIER_OP_SAVE);
  CHECK(tier_completion_status(c) == TIER_OK);
  CHECK(tier_completion_count(c) == 1 && tier_completion_codes(c)[0] == TIER_OK);
  tier_completion_free(c);
  memset(dst, 0, sizeof dst);
  REQUIRE_OK(tier_store_submit_load(s, loads, kN, &t2));
  c = NULL;
  REQUIRE_OK(tier_store_wait(s, 0, -1, &c));
  CHECK(tier_completion_ticket(c) == t2);
  CHECK(tier_completion_op(c) == TIER_OP_LOAD);
  for (uint32_t i = 0; i < kN; ++i) {
    CHECK(tier_completion_codes(c)[i] == TIER_OK);
    CHECK(tier_completion_tiers(c)[i] == 0);
    CHECK(same(dst[i], kBytes, i));
  }
  tier_completion_free(c);
  c = (tier_completion*)1;
  REQUIRE_OK(tier_store_poll(s, &c));
  CHECK(c == NULL);
  CHECK(tier_store_wait(s, t2, 0, &c) == TIER_NOT_FOUND);

  /* Registration: host records; pinned needs the GPU runtime. */
  tier_memory* m = NULL;
  REQUIRE_OK(tier_memory_register(s, src, sizeof src, TIER_MEMORY_HOST, -1, &m));
  REQUIRE_OK(tier_memory_release(m));
  m = NULL;
  rc = tier_memory_register(s, src, sizeof src, TIER_MEMORY_PINNED, -1, &m);
  CHECK(rc == TIER_OK || rc == TIER_NOT_SUPPORTED);
  if (rc == TIER_OK) REQUIRE_OK(tier_memory_release(m));
  CHECK(tier_memory_register(s, src, 1, TIER_MEMORY_DEVICE, -1, &m) == TIER_INVALID_ARGUMENT);
  /* Host memory claimed as a GPU's is refused (NOT_SUPPORTED in a build without the GPU floor). */
  rc = tier_memory_register(s, src, sizeof src, TIER_MEMORY_DEVICE, 0, &m);
  CHECK(rc == TIER_INVALID_ARGUMENT || rc == TIER_NOT_SUPPORTED);

  int32_t rm[1];
  REQUIRE_OK(tier_store_remove(s, keys, 1, rm));
  /* Clearing the store's namespace removes what is left of it from every tier. */
  {
    uint8_t payload[100] = {1};
    tier_region r = {payload, sizeof payload, TIER_MEMORY_HOST, -1};
    tier_item it = {keys[1], &r, 1};
    int32_t code = -1;
    uint64_t removed = 0;
    REQUIRE_OK(tier_store_save(s, &it, 1, &code));
    REQUIRE_OK(tier_store_clear(s, NULL, &removed));
    CHECK(removed >= 1);
    uint8_t present = 1;
    REQUIRE_OK(tier_store_exists(s, &keys[1], 1, &present));
    CHECK(present == 0);
    REQUIRE_OK(tier_store_clear(s, NULL, &removed));
    CHECK(removed == 0);
  }
  CHECK(rm[0] == TIER_OK);
  REQUIRE_OK(tier_store_lookup_prefix(s, keys, kN, &prefix));
  CHECK(prefix == 0);

  char* text = NULL;
  REQUIRE_OK(tier_store_metrics_json(s, &text));
  CHECK(text[0] == '{' && strstr(text, "cpu") != NULL);
  tier_free(text);
  REQUIRE_OK(tier_store_metrics_prometheus(s, &text));
  CHECK(strstr(text, "libtier_") != NULL);
  tier_free(text);
  REQUIRE_OK(tier_store_progress(s));
  REQUIRE_OK(tier_store_flush(s, -1));
  tier_store_close(s);
}

/* One copy (issue 24): host regions saved to and loaded from the cpu tier are moved once, by the
 * tier (the C API's codec is direct: gathered puts, scattered gets), so the stack's
 * staging_copy_bytes stays 0; a store written through to two tiers encodes each save into an
 * image, which the counter counts. Fails when the one-copy path is lost. */
static void test_one_copy(void) {
  tier_store* s = NULL;
  REQUIRE_OK(tier_store_open_json(kProfile, NULL, 0, &s));
  enum { kN = 6, kBytes = 20000 };
  static uint8_t src[kN][kBytes], dst[kN][kBytes];
  tier_region src_r[kN], dst_r[kN][2];
  tier_item saves[kN], loads[kN];
  for (uint32_t i = 0; i < kN; ++i) {
    fill(src[i], kBytes, 50 + i);
    src_r[i] = (tier_region){src[i], kBytes, TIER_MEMORY_HOST, -1};
    dst_r[i][0] = (tier_region){dst[i], 7000, TIER_MEMORY_HOST, -1};
    dst_r[i][1] = (tier_region){dst[i] + 7000, kBytes - 7000, TIER_MEMORY_HOST, -1};
    saves[i] = (tier_item){key_n(500 + i), &src_r[i], 1};
    loads[i] = (tier_item){key_n(500 + i), dst_r[i], 2};
  }
  int32_t codes[kN], tiers[kN];
  REQUIRE_OK(tier_store_save(s, saves, kN, codes));
  REQUIRE_OK(tier_store_load(s, loads, kN, codes, tiers));
  for (uint32_t i = 0; i < kN; ++i) CHECK(codes[i] == TIER_OK && same(dst[i], kBytes, 50 + i));
  char* text = NULL;
  REQUIRE_OK(tier_store_metrics_json(s, &text));
  CHECK(strstr(text, "\"staging_copy_bytes\":0") != NULL);
  CHECK(strstr(text, "\"loaded_bytes\":120000") != NULL);
  tier_free(text);
  REQUIRE_OK(tier_store_metrics_prometheus(s, &text));
  CHECK(strstr(text, "libtier_stack_staging_copy_bytes_total 0\n") != NULL);
  tier_free(text);
  tier_store_close(s);

  REQUIRE_OK(tier_store_open_json(
      "{\"tiers\": [{\"name\": \"a\", \"capacity\": \"4MiB\", \"backend\": \"cpu\"},"
      " {\"name\": \"b\", \"capacity\": \"4MiB\", \"backend\": \"cpu\"}]}",
      NULL, 0, &s));
  REQUIRE_OK(tier_store_save(s, saves, 1, codes));
  CHECK(codes[0] == TIER_OK);
  REQUIRE_OK(tier_store_metrics_json(s, &text));
  CHECK(strstr(text, "\"staging_copy_bytes\":20000") != NULL);
  tier_free(text);
  tier_store_close(s);
}

/* Several threads save and load their own objects through one store at once. */
typedef struct {
  tier_store* store;
  uint32_t id;
  int bad;
} thread_arg;

static void* worker_thread(void* p) {
  thread_arg* a = (thread_arg*)p;
  enum { kBytes = 4096, kRounds = 50 };
  uint8_t buf[kBytes];
  for (uint32_t r = 0; r < kRounds; ++r) {
    const uint32_t seed = a->id * 1000 + r;
    fill(buf, kBytes, seed);
    tier_region reg = {buf, kBytes, TIER_MEMORY_HOST, -1};
    tier_item it = {key_n(seed), &reg, 1};
    int32_t code = -1;
    if (tier_store_save(a->store, &it, 1, &code) != TIER_OK || code != TIER_OK) ++a->bad;
    memset(buf, 0, kBytes);
    uint64_t t = 0;
    tier_completion* c = NULL;
    if (tier_store_submit_load(a->store, &it, 1, &t) != TIER_OK ||
        tier_store_wait(a->store, t, -1, &c) != TIER_OK || tier_completion_codes(c)[0] != TIER_OK)
      ++a->bad;
    tier_completion_free(c);
    if (!same(buf, kBytes, seed)) ++a->bad;
  }
  return NULL;
}

static void test_threads(void) {
  tier_store* s = NULL;
  REQUIRE_OK(tier_store_open_json(kProfile, NULL, 0, &s));
  enum { kThreads = 4 };
  pthread_t th[kThreads];
  thread_arg args[kThreads];
  for (uint32_t i = 0; i < kThreads; ++i) {
    args[i] = (thread_arg){s, i + 1, 0};
    pthread_create(&th[i], NULL, worker_thread, &args[i]);
  }
  for (int i = 0; i < kThreads; ++i) {
    pthread_join(th[i], NULL);
    CHECK(args[i].bad == 0);
  }
  tier_store_close(s);
}

/* Writes a pattern into every region of a list (seed per list), or checks it. */
static void fill_regions(const tier_region* r, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) fill((uint8_t*)r[i].ptr, r[i].bytes, seed + (uint32_t)i);
}
static int same_regions(const tier_region* r, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (!same((const uint8_t*)r[i].ptr, r[i].bytes, seed + (uint32_t)i)) return 0;
  return 1;
}

/* One engine step: the plan goes to the worker, its reports back to the scheduler. */
static tier_events* step(tier_scheduler* s, tier_worker* w, size_t* loads, size_t* saves) {
  tier_plan* plan = NULL;
  REQUIRE_OK(tier_scheduler_build_step(s, &plan));
  if (loads) *loads = tier_plan_load_count(plan);
  if (saves) *saves = tier_plan_save_count(plan);
  REQUIRE_OK(tier_worker_submit(w, plan));
  REQUIRE_OK(tier_worker_progress(w, SIZE_MAX, NULL));
  tier_op_report reports[16];
  size_t n = 0;
  REQUIRE_OK(tier_worker_take_reports(w, reports, 16, &n));
  for (size_t i = 0; i < n; ++i) CHECK(reports[i].ok == 1);
  tier_events* ev = NULL;
  REQUIRE_OK(tier_scheduler_process(s, reports, n, &ev));
  tier_plan_free(plan);
  return ev;
}

static void test_engine(void) {
  enum { kBlock = 128, kChunks = 4, kTokens = kBlock * kChunks };
  const char* geometry =
      "{\"compress_ratios\": [4, 128, 0], \"kv_head_dim\": 64, \"rope_head_dim\": 16,"
      " \"index_head_dim\": 32, \"block_size\": 128, \"sliding_window\": 8,"
      " \"num_blocks\": 16, \"num_slots\": 2}";
  const char* config =
      "{\"block_tokens\": 128, \"chunk_tokens\": 128, \"checkpoint_interval_tokens\": 256,"
      " \"min_load_tokens\": 128}";
  tier_key ns;
  REQUIRE_OK(tier_namespace_id("{\"model\": \"c-api-test\"}", &ns));
  tier_store* store = NULL;
  REQUIRE_OK(tier_store_open_json(kProfile, NULL, 0, &store));
  tier_dsv4_layout* layout = NULL;
  CHECK(tier_dsv4_layout_create("no-such-preset", &ns, 1, 0, NULL, &layout) == TIER_NOT_FOUND);
  REQUIRE_OK(tier_dsv4_layout_create(geometry, &ns, 1, 0, "{\"memory\": \"host\"}", &layout));
  CHECK(tier_dsv4_layout_block_tokens(layout) == kBlock);
  CHECK(tier_dsv4_layout_page_bytes_per_block(layout) > 0);
  CHECK(tier_dsv4_layout_slot_bytes(layout) > 0);
  tier_worker* w = NULL;
  REQUIRE_OK(tier_worker_create(config, &ns, 0, store, layout, &w));
  tier_scheduler* s = NULL;
  CHECK(tier_scheduler_create("{\"block_tokens\": \"x\"}", &ns, w, &s) == TIER_INVALID_ARGUMENT);
  REQUIRE_OK(tier_scheduler_create(config, &ns, w, &s));

  uint32_t prompt[kTokens + 5];
  for (uint32_t i = 0; i < kTokens + 5; ++i) prompt[i] = 1000 + i * 7;

  /* Request 1: nothing cached; its forward writes blocks 0..3 and state group 0; the engine saves
   * PAGE chunks and the SLOT of the committed boundaries. */
  uint64_t h1 = 0;
  REQUIRE_OK(tier_scheduler_add_request(s, 1, prompt, kTokens, &h1));
  tier_match m;
  REQUIRE_OK(tier_scheduler_lookup(s, h1, &m));
  CHECK(m.tokens == 0);
  const uint32_t blocks1[kChunks] = {0, 1, 2, 3};
  tier_load_decision d;
  REQUIRE_OK(tier_scheduler_after_alloc(s, h1, 0, blocks1, kChunks, 0, &d));
  CHECK(d.action == TIER_LOAD_NONE);
  CHECK(strcmp(d.reason, "no_hit") == 0);
  tier_region regions[64];
  size_t nr = 0;
  for (uint32_t c = 0; c < kChunks; ++c) {
    REQUIRE_OK(tier_dsv4_layout_page_regions(layout, &blocks1[c], 1, regions, 64, &nr));
    fill_regions(regions, nr, 100 * (c + 1));
  }
  REQUIRE_OK(tier_dsv4_layout_slot_regions(layout, 0, regions, 64, &nr));
  fill_regions(regions, nr, 7);
  REQUIRE_OK(tier_scheduler_on_computed(s, h1, kTokens));
  size_t saves = 0, total_saves = 0;
  for (int i = 0; i < 4; ++i) {
    tier_events_free(step(s, w, NULL, &saves));
    total_saves += saves;
  }
  CHECK(total_saves > 0);
  CHECK(tier_scheduler_saves_pending(s) == 0);
  int32_t free_now = 0;
  REQUIRE_OK(tier_scheduler_finish(s, h1, &free_now));
  CHECK(free_now == 1);

  /* The same tokens with an extra key (another LoRA adapter) share nothing with request 1. */
  uint64_t hx = 0;
  REQUIRE_OK(tier_scheduler_add_request_extra(s, 9, prompt, kTokens + 5, "lora:b", 6, &hx));
  REQUIRE_OK(tier_scheduler_lookup(s, hx, &m));
  CHECK(m.tokens == 0 && m.page_hit == 0);
  REQUIRE_OK(tier_scheduler_finish(s, hx, &free_now));
  CHECK(tier_scheduler_add_request_extra(s, 9, prompt, 1, NULL, 2, &hx) == TIER_INVALID_ARGUMENT);
  CHECK(tier_scheduler_epoch(s) != 0);
  CHECK(strcmp(tier_outcome_name(TIER_OUTCOME_SIDECAR_CORRUPT), "sidecar_corrupt") == 0);
  CHECK(strcmp(tier_outcome_name(TIER_OUTCOME_OK), "") == 0);
  CHECK(strcmp(tier_outcome_name(99), "unknown") == 0);

  /* Request 2: the same prompt and more; nothing in HBM. The lookup offers a committed boundary;
   * the load restores PAGE chunks into blocks 8.. and the SLOT into group 1. */
  uint64_t h2 = 0;
  REQUIRE_OK(tier_scheduler_add_request(s, 2, prompt, kTokens + 5, &h2));
  REQUIRE_OK(tier_scheduler_lookup(s, h2, &m));
  CHECK(m.tokens == kTokens);
  CHECK(m.has_slot == 1 && m.slot.tokens == kTokens);
  const uint32_t blocks2[kChunks + 1] = {8, 9, 10, 11, 12};
  REQUIRE_OK(tier_scheduler_after_alloc(s, h2, 0, blocks2, kChunks + 1, 1, &d));
  CHECK(d.action == TIER_LOAD_LOAD);
  CHECK(d.load_start == 0 && d.load_end == kTokens);
  size_t loads = 0;
  tier_plan* plan = NULL;
  REQUIRE_OK(tier_scheduler_build_step(s, &plan));
  CHECK(tier_plan_load_count(plan) == 1);
  tier_load_op op;
  REQUIRE_OK(tier_plan_load(plan, 0, &op));
  CHECK(op.request == 2 && op.page_end == kTokens && op.chunk_count == kChunks);
  CHECK(op.block_count == kChunks && op.block_ids[0] == 8);
  CHECK(op.has_slot == 1 && op.slot_group == 1);
  CHECK(tier_plan_load(plan, 1, &op) == TIER_INVALID_ARGUMENT);
  const uint64_t lease = tier_plan_load_lease(plan, 0);
  CHECK(lease != 0); /* the view (this worker) leased the hit */
  CHECK(tier_plan_load_lease(plan, 1) == 0);
  /* The plan crosses to the rank as bytes (docs/engine.md "Ranks as processes"). */
  uint8_t* bytes = NULL;
  size_t nbytes = 0;
  REQUIRE_OK(tier_plan_encode(plan, &bytes, &nbytes));
  tier_plan_free(plan);
  tier_plan* got = (tier_plan*)1;
  CHECK(tier_plan_decode(bytes, nbytes - 1, &got) == TIER_INVALID_ARGUMENT && got == NULL);
  bytes[nbytes - 1] ^= 1;
  CHECK(tier_plan_decode(bytes, nbytes, &got) == TIER_CHECKSUM_MISMATCH && got == NULL);
  CHECK(strstr(tier_last_error(), "checksum") != NULL);
  bytes[nbytes - 1] ^= 1;
  tier_reports* none = NULL;
  CHECK(tier_reports_decode(bytes, nbytes, &none) == TIER_INVALID_ARGUMENT && none == NULL);
  REQUIRE_OK(tier_plan_decode(bytes, nbytes, &plan));
  tier_free(bytes);
  REQUIRE_OK(tier_plan_load(plan, 0, &op));
  CHECK(op.request == 2 && op.page_end == kTokens && op.chunk_count == kChunks);
  CHECK(op.block_count == kChunks && op.block_ids[0] == 8);
  CHECK(op.has_slot == 1 && op.slot_group == 1 && op.slot.tokens == kTokens);
  CHECK(tier_plan_load_lease(plan, 0) == lease);
  /* A GPU order for a layout in host memory: refused, the plan's load reported failed at once
   * (this report is not given to the scheduler: the plan is submitted again, without order). */
  tier_op_report taken[8];
  size_t n = 0;
  REQUIRE_OK(tier_worker_submit_after(w, plan, (void*)0x1, NULL));
  CHECK(tier_worker_queued_loads(w) == 0);
  REQUIRE_OK(tier_worker_take_reports(w, taken, 8, &n));
  CHECK(n == 1 && taken[0].ok == 0 && strcmp(taken[0].reason, "device_order") == 0);
  CHECK(taken[0].outcome == TIER_OUTCOME_DEVICE_ORDER);
  REQUIRE_OK(tier_worker_submit_after(w, plan, NULL, NULL));
  tier_plan_free(plan);
  CHECK(tier_worker_queued_loads(w) == 1);
  REQUIRE_OK(tier_worker_progress(w, SIZE_MAX, NULL));
  REQUIRE_OK(tier_worker_take_reports(w, taken, 8, &n));
  CHECK(n == 1 && taken[0].ok == 1 && taken[0].channel == TIER_CHANNEL_LOAD);
  REQUIRE_OK(tier_worker_release_lease(w, lease)); /* released already by the load: ignored */
  /* The reports cross back as bytes. */
  tier_op_report bad = taken[0];
  bad.ok = 0; /* its outcome still says OK */
  CHECK(tier_reports_encode(&bad, 1, &bytes, &nbytes) == TIER_INVALID_ARGUMENT);
  REQUIRE_OK(tier_reports_encode(taken, n, &bytes, &nbytes));
  tier_reports* back = NULL;
  REQUIRE_OK(tier_reports_decode(bytes, nbytes, &back));
  tier_free(bytes);
  const tier_op_report* reports = tier_reports_get(back, &n);
  CHECK(n == 1 && reports[0].ok == 1 && reports[0].channel == TIER_CHANNEL_LOAD);
  CHECK(reports[0].request == 2 && reports[0].rank == 0 && strcmp(reports[0].reason, "") == 0);
  tier_events* ev = NULL;
  REQUIRE_OK(tier_scheduler_process(s, reports, n, &ev));
  tier_reports_free(back);
  size_t count = 0;
  const uint64_t* loaded = tier_events_loaded(ev, &count);
  CHECK(count == 1 && loaded[0] == h2);
  tier_events_free(ev);
  (void)loads;
  for (uint32_t c = 0; c < kChunks; ++c) {
    REQUIRE_OK(tier_dsv4_layout_page_regions(layout, &blocks2[c], 1, regions, 64, &nr));
    CHECK(same_regions(regions, nr, 100 * (c + 1)));
  }
  REQUIRE_OK(tier_dsv4_layout_slot_regions(layout, 1, regions, 64, &nr));
  CHECK(same_regions(regions, nr, 7));

  char* text = NULL;
  REQUIRE_OK(tier_engine_metrics_json(s, &w, 1, &text));
  CHECK(strstr(text, "\"load_requests\":1") != NULL);
  tier_free(text);
  REQUIRE_OK(tier_engine_metrics_prometheus(s, &w, 1, &text));
  CHECK(strstr(text, "libtier_engine_load_requests_total 1") != NULL);
  tier_free(text);
  REQUIRE_OK(tier_worker_metrics_json(w, &text));
  CHECK(strstr(text, "\"loads_ok\":1") != NULL && strstr(text, "\"rank0/cpu\"") != NULL);
  CHECK(strstr(text, "load_requests") == NULL); /* the worker's part only */
  tier_free(text);

  tier_scheduler_destroy(s);
  tier_worker_destroy(w);
  tier_dsv4_layout_destroy(layout);
  tier_store_close(store);
}

/* What the sink received (this test installs it on one thread; messages come from any). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int log_count = 0, log_last_level = -1;
static char log_last[512];
static void on_log(void* user, int level, const char* message) {
  pthread_mutex_lock(&log_mu);
  ++*(int*)user;
  ++log_count;
  log_last_level = level;
  snprintf(log_last, sizeof log_last, "%s", message);
  pthread_mutex_unlock(&log_mu);
}

static void test_log_stat_metrics(void) {
  int level = tier_log_level();
  CHECK(tier_log_set_level(7) == TIER_INVALID_ARGUMENT);
  REQUIRE_OK(tier_log_set_level(TIER_LOG_WARN));
  CHECK(tier_log_level() == TIER_LOG_WARN);
  int calls = 0;
  tier_log_set_sink(on_log, &calls);
  tier_store* store = NULL;
  REQUIRE_OK(tier_store_open_json(
      "{\"tiers\": [{\"name\": \"cpu\", \"capacity\": \"1MiB\", \"backend\": \"cpu\"}],"
      " \"metrics\": {\"listen\": \"127.0.0.1:0\"}}",
      NULL, 0, &store));
  CHECK(strncmp(tier_store_metrics_endpoint(store), "127.0.0.1:", 10) == 0);
  uint8_t data[300], small[100];
  fill(data, sizeof data, 3);
  tier_region r = {data, sizeof data, TIER_MEMORY_HOST, -1};
  tier_item item = {key_n(1), &r, 1};
  int32_t code = -1;
  REQUIRE_OK(tier_store_save(store, &item, 1, &code));
  CHECK(code == TIER_OK);
  /* Larger than the tier: NO_SPACE. */
  static uint8_t huge[2 << 20];
  tier_region hr = {huge, sizeof huge, TIER_MEMORY_HOST, -1};
  tier_item big = {key_n(2), &hr, 1};
  REQUIRE_OK(tier_store_save(store, &big, 1, &code));
  CHECK(code == TIER_NO_SPACE);
  /* Stat: where and how large. */
  tier_key keys[2] = {key_n(1), key_n(2)};
  tier_object_stat st[2];
  REQUIRE_OK(tier_store_stat(store, keys, 2, st));
  CHECK(st[0].tier == 0 && st[0].payload_bytes == 300 && st[0].stored_bytes == 396);
  CHECK(st[1].tier == -1);
  /* A load into the wrong size: INVALID_ARGUMENT for the key, and a warning naming both sizes. */
  tier_region sr = {small, sizeof small, TIER_MEMORY_HOST, -1};
  tier_item wrong = {key_n(1), &sr, 1};
  REQUIRE_OK(tier_store_load(store, &wrong, 1, &code, NULL));
  CHECK(code == TIER_INVALID_ARGUMENT);
  pthread_mutex_lock(&log_mu);
  CHECK(calls >= 1 && log_last_level == TIER_LOG_WARN);
  CHECK(strstr(log_last, "stored payload is 300 bytes, these regions take 100") != NULL);
  pthread_mutex_unlock(&log_mu);
  char* text = NULL;
  REQUIRE_OK(tier_store_metrics_prometheus(store, &text));
  CHECK(strstr(text, "libtier_tier_used_bytes{tier=\"cpu\"} 396\n") != NULL);
  CHECK(strstr(text, "libtier_op_duration_seconds_count{op=\"save\",tier=\"cpu\"} 2\n") != NULL);
  tier_free(text);
  tier_store_close(store);
  /* After the sink is removed it is never called again. */
  tier_log_set_sink(NULL, NULL);
  int before = calls;
  REQUIRE_OK(tier_store_open_json(kProfile, NULL, 0, &store));
  REQUIRE_OK(tier_store_load(store, &wrong, 1, &code, NULL));
  tier_store_close(store);
  CHECK(calls == before);
  REQUIRE_OK(tier_log_set_level(level));
}

static void write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  if (!f) exit(1);
  fputs(text, f);
  fclose(f);
}

static void test_curve(void) {
  char path[] = "/tmp/c_api_trace_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd); /* written by name below */
  write_text(path,
             "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
             "{\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 3]}\n"
             "{\"timestamp\": 2, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n");
  tier_curve* c = NULL;
  REQUIRE_OK(tier_curve_from_trace(path, 1.0, 0, &c));
  CHECK(tier_curve_requests(c) == 3 && tier_curve_blocks(c) == 6);
  CHECK(tier_curve_tracked_blocks(c) == 3);
  /* Chained blocks 1, 1-2, 1-3: 1 comes back at stack distance 2 (twice), 1-2 at 3. */
  CHECK(tier_curve_hit_ratio(c, 1) == 0);
  CHECK(tier_curve_hit_ratio(c, 2) == 2.0 / 6);
  CHECK(tier_curve_hit_ratio(c, 3) == 3.0 / 6);
  CHECK(tier_curve_saturation(c) == 3);
  CHECK(tier_curve_error(c, 3) == 0);
  size_t n = 0;
  REQUIRE_OK(tier_curve_steps(c, NULL, NULL, 0, &n));
  CHECK(n == 2);
  uint64_t blocks[2];
  double ratios[2];
  REQUIRE_OK(tier_curve_steps(c, blocks, ratios, 2, &n));
  CHECK(blocks[0] == 2 && blocks[1] == 3 && ratios[1] == 3.0 / 6);
  uint64_t knee = 0;
  double knee_ratio = 0;
  CHECK(tier_curve_knee(c, &knee, &knee_ratio) == 1 && knee == 2);
  tier_curve_free(c);
  CHECK(tier_curve_from_trace(path, 0.0, 0, &c) == TIER_INVALID_ARGUMENT && c == NULL);
  CHECK(tier_curve_from_trace("/nonexistent/trace.jsonl", 1.0, 0, &c) == TIER_NOT_FOUND);
  remove(path);
}

int main(void) {
  test_status();
  test_keys();
  test_store();
  test_one_copy();
  test_threads();
  test_log_stat_metrics();
  test_curve();
  test_engine();
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
