// tierbench forward [--preset v4-pro-fp8] [--profile profiles/cpu.json] [--layers N]
//                   [--layer-us 200] [--steps 64] [--save-chunks 1] [--slot-every 16]
//                   [--prefix-tokens 16384] [--chunk-blocks 4] [--iters 5] [--restores 11]
//                   [--device 0]
//
// The offload engine (one rank, DSV4 KV in GPU memory) against a synthetic forward pass: each
// step enqueues one kernel per layer that spins --layer-us microseconds of the device's wall
// clock (gpu::wall_clock: %globaltimer on CUDA, s_memrealtime on HIP; one block per
// multiprocessor, so copy kernels may share the SMs) on the engine's compute stream, then waits
// for it, as an engine waits for its logits. Two figures, each against its baseline measured in
// the same run:
//
//  (a) decode step time with offload saves active vs off. "On": every step also hands the
//      worker --save-chunks PAGE chunks (fresh keys, the KV another request's prefill just
//      wrote) and every --slot-every steps a SLOT save, with a DeviceOrder naming an event
//      recorded after the step's forward; a worker thread runs progress(), so the saves drain
//      while the next forward runs; the SLOT snapshot is enqueued on the compute stream at
//      submit() (no host wait). "Off": the same steps without the engine. Target: <= 1.02x.
//  (b) restoring a --prefix-tokens prefix (PAGE chunks + the SLOT at its end) from the tiers into
//      GPU memory (submit + progress until the load's report), vs one bulk host-to-device copy
//      of the same bytes from pinned host memory. Target: <= 1.03x. Beside it, the floor of a
//      restore that moves each stored object by a DMA of its own: the same bytes as one DMA per
//      object (the sidecar, then the chunks) from the runtime alone; and that floor under the
//      restore's contract (after the last DMA, the last chunk's verification and gated copy and
//      the SLOT's commit copy). --restores rounds, each measuring all of them in turn: each ratio
//      is the median of the rounds' ratios to their own bulk copy.
// Exits 77 without a GPU.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "cli.hpp"
#include "gpu.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/kv_layout.hpp"
#include "tier/engine/worker.hpp"
#include "tier/object.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

namespace {

using namespace tier;
using namespace tier::engine;
using tier::bench::median;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs the worker's progress() on its own thread whenever work was submitted, as an engine's
// rank thread would; collects the reports.
class ProgressThread {
 public:
  explicit ProgressThread(Worker& w) : w_(w), thread_([this] { run(); }) {}
  ~ProgressThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void kick() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++kicks_;
    }
    cv_.notify_one();
  }
  // Waits until every submitted save finished; returns the failed reports seen so far.
  std::size_t drain() {
    while (w_.queued_saves() > 0 || w_.queued_loads() > 0) {
      kick();
      std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

 private:
  void run() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || kicks_ != seen; });
        if (stop_) return;
        seen = kicks_;
      }
      w_.progress();
      std::size_t bad = 0;
      for (const OpReport& r : w_.take_reports()) bad += r.ok() ? 0 : 1;
      std::lock_guard<std::mutex> lock(mu_);
      failed_ += bad;
    }
  }
  Worker& w_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::uint64_t kicks_ = 0;
  std::size_t failed_ = 0;
  std::thread thread_;
};

Key128 key_for(std::uint64_t i) { return Key128{0x666f727761726400ULL ^ i, i + 1}; }

SaveOp save_op(std::uint64_t gen, std::span<const std::uint32_t> blocks, std::uint64_t first_key,
               std::size_t chunks, std::size_t blocks_per_chunk, std::uint64_t chunk_tokens) {
  SaveOp op;
  op.id = OperationId{gen, gen};
  op.page_end = chunks * chunk_tokens;
  for (std::size_t c = 0; c < chunks; ++c) op.chunk_keys.push_back(key_for(first_key + c));
  op.block_ids.assign(blocks.begin(), blocks.begin() + chunks * blocks_per_chunk);
  return op;
}

int run_forward(cli::Args& args) {
  const std::string preset = args.get_or("preset", "v4-pro-fp8");
  const std::string profile_path = args.get_or("profile", "profiles/cpu.json");
  const auto layers_opt = args.uint("layers", 1, 4096);
  const std::uint64_t layer_us = args.uint("layer-us", 0, 10'000'000).value_or(200);
  const std::uint64_t steps = args.uint("steps", 1, 1'000'000).value_or(64);
  const std::uint64_t save_chunks = args.uint("save-chunks", 0, 4096).value_or(1);
  const std::uint64_t slot_every = args.uint("slot-every", 1, 1'000'000).value_or(16);
  const std::uint64_t prefix_tokens = args.uint("prefix-tokens", 1, 1ull << 32).value_or(16384);
  const std::uint64_t chunk_blocks = args.uint("chunk-blocks", 1, 4096).value_or(4);
  const int iters = static_cast<int>(args.uint("iters", 1, 10000).value_or(5));
  const int restore_rounds = static_cast<int>(args.uint("restores", 1, 10000).value_or(11));
  const int device = static_cast<int>(args.uint("device", 0, 1023).value_or(0));
  args.finish();
  if (steps == 0 || chunk_blocks == 0 || iters < 1 || layer_us == 0)
    return cli::fail("--steps, --chunk-blocks, --iters and --layer-us must be > 0", 2);
  if (gpu::device_count() == 0) {
    fmt::print("tierbench forward: no {} GPU on this machine\n", gpu::api_name());
    return 77;
  }
  auto info = gpu::device_info(device);
  if (!info) return cli::fail(info.status().to_string());
  // The layers spin on the device's wall clock: refuse up front a rate nobody can tell.
  auto clock = gpu::wall_clock(device);
  if (!clock) return cli::fail(clock.status().to_string());

  auto model = dsv4::preset(preset);
  if (!model) return cli::fail(model.status().to_string(), 2);
  const std::uint64_t block_tokens = model->block_size * model->dcp_size;
  const std::uint64_t chunk_tokens = block_tokens * chunk_blocks;
  const std::uint64_t prefix_chunks = prefix_tokens / chunk_tokens;
  if (prefix_chunks == 0 || prefix_tokens % chunk_tokens != 0)
    return cli::fail(
        fmt::format("--prefix-tokens must be a multiple of the chunk ({} tokens)", chunk_tokens),
        2);
  const std::uint64_t layers = layers_opt.value_or(model->compress_ratios.size());
  // Blocks: the prefix, its restore target, and the decode saves' source blocks.
  const std::uint64_t prefix_blocks = prefix_chunks * chunk_blocks;
  const std::uint64_t save_blocks = std::max<std::uint64_t>(save_chunks, 1) * chunk_blocks;
  model->num_blocks = 2 * prefix_blocks + save_blocks;
  model->num_slots = 3;
  auto geo = dsv4::Geometry::compute(*model);
  if (!geo) return cli::fail(geo.status().to_string());

  EngineConfig cfg;
  cfg.block_tokens = static_cast<std::uint32_t>(block_tokens);
  cfg.chunk_tokens = static_cast<std::uint32_t>(chunk_tokens);
  cfg.checkpoint_interval_tokens = static_cast<std::int64_t>(chunk_tokens);
  cfg.min_load_tokens = chunk_tokens;
  cfg.tp_size = 1;
  cfg.max_pending_saves = 64;
  cfg.page_namespace =
      namespace_id(Json{{"bench", "tierbench forward"}, {"preset", preset}}).value();
  auto profile = load_profile(profile_path, Registry::global());
  if (!profile) return cli::fail(profile.status().to_string(), 2);
  auto stack = TierStack::open(*profile);
  if (!stack) return cli::fail(stack.status().to_string());
  dsv4::Dsv4LayoutOptions lo;
  lo.memory = dsv4::KvMemoryKind::kDevice;
  lo.device = device;
  auto layout = dsv4::Dsv4Layout::create(*geo, cfg.page_namespace, 1, 0, lo);
  if (!layout) return cli::fail(layout.status().to_string());
  auto worker = Worker::create(cfg, 0, **stack, **layout);
  if (!worker) return cli::fail(worker.status().to_string());
  Worker& w = **worker;
  auto compute = gpu::Stream::create(device);
  auto step_done = gpu::Event::create(device);
  if (!compute || !step_done) return cli::fail("cannot create the compute stream and event");

  const std::uint64_t page_block = (*layout)->page_bytes_per_block();
  const std::uint64_t slot_bytes = (*layout)->slot_bytes();
  fmt::print("GPU {}: {} ({}), {} multiprocessors; tiers: {}\n", device, info->name,
             gpu::api_name(), info->multiprocessors, profile_path);
  fmt::print(
      "{}: {} layers x {} us spin per step; block {} tokens = {} bytes of PAGE; chunk {} "
      "tokens; SLOT {} bytes\n",
      preset, layers, layer_us, block_tokens, page_block, chunk_tokens, slot_bytes);
  fmt::print("spin clock: {} at {} kHz (rate from {})\n", clock->counter, clock->khz,
             clock->rate_from);

  auto forward = [&]() -> Status {
    for (std::uint64_t l = 0; l < layers; ++l)
      TIER_RETURN_IF_ERROR(
          gpu::spin_async(compute->handle(), device, layer_us * 1000, info->multiprocessors));
    return Status::ok();
  };

  // (a) Decode steps, offload off then on, alternating rounds so drift hits both alike.
  std::vector<std::uint32_t> save_src;
  for (std::uint64_t b = 2 * prefix_blocks; b < 2 * prefix_blocks + save_blocks; ++b)
    save_src.push_back(static_cast<std::uint32_t>(b));
  std::uint64_t gen = 1, next_key = 1'000'000;
  std::size_t failed = 0;
  std::vector<double> off_steps, on_steps;
  {
    ProgressThread progress(w);
    for (int round = 0; round < iters + 1; ++round) {  // round 0 warms up
      for (int on = 0; on < 2; ++on) {
        auto t0 = Clock::now();
        for (std::uint64_t s = 0; s < steps; ++s) {
          Status st = forward();
          if (st) st = step_done->record(*compute);
          if (st) st = compute->synchronize();  // the engine waits for its logits
          if (!st) return cli::fail(st.to_string());
          if (!on || save_chunks == 0) continue;
          StepPlan plan;
          SaveOp op = save_op(gen++, save_src, next_key, save_chunks, chunk_blocks, chunk_tokens);
          next_key += save_chunks;
          if (slot_every > 0 && s % slot_every == 0) {
            op.slot = Boundary{save_chunks * chunk_tokens, op.chunk_keys.back()};
            op.prefix_keys = op.chunk_keys;
            op.slot_group = 2;
          }
          plan.saves.push_back(std::move(op));
          w.submit(plan, DeviceOrder{compute->handle(), step_done->handle()});
          progress.kick();
        }
        const double per_step = since(t0) / static_cast<double>(steps);
        if (round > 0) (on ? on_steps : off_steps).push_back(per_step);
        if (on) failed = progress.drain();  // the next round starts without a backlog
      }
    }
  }
  const double off = median(off_steps), on = median(on_steps);
  fmt::print("\n(a) decode step, {} steps x {} rounds, median per step\n", steps, iters);
  fmt::print("    offload off                     {:10.3f} ms\n", off * 1e3);
  fmt::print(
      "    offload saves active            {:10.3f} ms   ({} PAGE chunk(s) per step, "
      "SLOT every {} steps; {} failed reports)\n",
      on * 1e3, save_chunks, slot_every, failed);
  fmt::print("    ratio on / off                  {:10.3f}x   (target <= 1.02x)\n",
             off > 0 ? on / off : 0);

  // (b) Restore a prefix: store it once, then load it into other blocks and another group.
  std::vector<std::uint32_t> src, dst;
  for (std::uint64_t b = 0; b < prefix_blocks; ++b) {
    src.push_back(static_cast<std::uint32_t>(b));
    dst.push_back(static_cast<std::uint32_t>(prefix_blocks + b));
  }
  const std::uint64_t first_key = 1;
  SaveOp save = save_op(gen++, src, first_key, prefix_chunks, chunk_blocks, chunk_tokens);
  save.slot = Boundary{prefix_tokens, save.chunk_keys.back()};
  save.prefix_keys = save.chunk_keys;
  save.slot_group = 0;
  StepPlan sp;
  sp.saves.push_back(save);
  w.submit(sp);
  w.progress();
  for (const OpReport& r : w.take_reports())
    if (!r.ok())
      return cli::fail(fmt::format("storing the prefix failed: {}", outcome_name(r.outcome)));
  // Each round measures in turn the restore, the same load without its SLOT (what the sidecar
  // adds), the bulk copy and the two floors below, so that every ratio compares figures taken
  // back to back (the bus's rate drifts by a few percent between runs and within one); each
  // figure is the median over the rounds of its ratio to the same round's bulk copy.
  const std::uint64_t bytes = prefix_blocks * page_block + slot_bytes;
  const std::uint64_t chunk_bytes = chunk_blocks * page_block;
  const std::uint64_t last_at = slot_bytes + (prefix_chunks - 1) * chunk_bytes;
  auto host = gpu::PinnedBuffer::allocate(bytes);
  auto devbuf = gpu::DeviceBuffer::allocate(device, bytes);
  auto up = gpu::Stream::create(device);
  auto landed = gpu::Event::create(device);
  auto exec = gpu::DeviceCopyExecutor::create(gpu::ExecutorOptions{device});
  auto counters = gpu::VerifyCounters::allocate(*compute);
  auto word = gpu::PinnedBuffer::allocate(4);
  auto kv = gpu::DeviceBuffer::allocate(device, chunk_bytes + slot_bytes);
  auto scratch = gpu::DeviceBuffer::allocate(device, gpu::verify_scratch_bytes(chunk_bytes));
  if (!host || !devbuf || !up || !landed || !exec || !counters || !word || !kv || !scratch)
    return cli::fail("cannot allocate the bulk-copy and floor buffers");
  std::fill_n(host->data(), bytes, std::byte{0x5a});
  const Region last_chunk = devbuf->region().slice(last_at, chunk_bytes);
  const std::uint64_t last_sum =
      payload_checksum(std::span<const std::byte>(host->data() + last_at, chunk_bytes));
  const std::vector<CopySpan> last_span{CopySpan{kv->data(), 0, chunk_bytes}};
  auto* verdict = reinterpret_cast<std::uint32_t*>(word->data());
  *reinterpret_cast<volatile std::uint32_t*>(verdict) = 0;
  // Seconds of `run` (enqueues on the GPU), synchronized.
  auto timed = [&](auto&& run) {
    return tier::bench::timed([&] {
      Status st = run();
      if (st) st = up->synchronize();
      return st ? compute->synchronize() : st;
    });
  };
  auto load = [&](bool with_slot) -> Status {
    LoadOp op;
    op.id = OperationId{gen, gen};
    ++gen;
    op.page_end = prefix_tokens;
    op.chunk_keys = save.chunk_keys;
    op.block_ids = dst;
    if (with_slot) op.slot = save.slot;
    op.slot_group = 1;
    StepPlan lp;
    lp.loads.push_back(std::move(op));
    w.submit(lp);
    w.progress();
    auto reports = w.take_reports();
    if (reports.size() != 1 || !reports[0].ok())
      return Status(
          Code::kBadState,
          fmt::format("restore failed: {}", reports.empty() ? std::string_view("no report")
                                                            : outcome_name(reports[0].outcome)));
    return Status::ok();
  };
  auto bulk_copy = [&] { return gpu::copy_async(devbuf->region(), host->region(), *compute); };
  // The floor of any restore that moves each stored object by a DMA of its own (it verifies an
  // object only once all of it landed): the same bytes as one DMA per object, the sidecar then
  // the chunks, back to back on one stream, from the same pinned memory. On the H200 a DMA costs
  // about 2.5 us more than its bytes at the bulk rate, and 1.3 us pass between two.
  auto dmas = [&](const gpu::Stream& s) {
    auto dma = [&](std::uint64_t at, std::uint64_t n) {
      return gpu::copy_async(devbuf->region().slice(at, n), host->region().slice(at, n), s);
    };
    Status st = dma(0, slot_bytes);
    for (std::uint64_t c = 0; c < prefix_chunks && st; ++c)
      st = dma(slot_bytes + c * chunk_bytes, chunk_bytes);
    return st;
  };
  // The floor of such a restore under its contract (each object verified before it is written,
  // the state group changed only once every object verified): the same DMAs on another stream,
  // then, on the compute stream once the last one landed (the handoff every landing takes), what
  // cannot start earlier: the last chunk's verification, its gated copy into the KV and the
  // SLOT's commit (the sidecar's copy into the state group), with no host between them.
  auto verified_floor = [&] {
    Status st = dmas(*up);
    if (st) st = landed->record(*up);
    if (st) st = gpu::stream_wait_event(*compute, landed->handle());
    if (st)
      st = gpu::verify_payload_async(last_chunk, last_sum, scratch->region(), verdict, *counters,
                                     *compute);
    if (st)
      st = (*exec)->scatter_async(CopyPlan{last_span, MemoryKind::kDevice, device, chunk_bytes},
                                  last_chunk, *compute,
                                  reinterpret_cast<const std::uint32_t*>(scratch->data()));
    if (st)
      st = gpu::copy_async(kv->region().slice(chunk_bytes, slot_bytes),
                           devbuf->region().slice(0, slot_bytes), *compute);
    return st;
  };
  std::vector<double> restores, page_only, per_object, verified;         // ratios to the bulk
  std::vector<double> bulk_s, restore_s, page_s;                         // seconds
  for (int round = 0; round < restore_rounds + 1; ++round) {             // round 0 warms up
    auto restore = timed([&] { return load(true); });
    auto page = timed([&] { return load(false); });
    auto bulk = timed(bulk_copy);
    auto floor = timed([&] { return dmas(*compute); });
    auto floor_verified = timed(verified_floor);
    for (const auto* r : {&restore, &page, &bulk, &floor, &floor_verified})
      if (!*r) return cli::fail(r->status().to_string());
    if (round == 0) continue;
    bulk_s.push_back(*bulk);
    restore_s.push_back(*restore);
    page_s.push_back(*page);
    restores.push_back(*restore / *bulk);
    page_only.push_back(*page / *bulk);
    per_object.push_back(*floor / *bulk);
    verified.push_back(*floor_verified / *bulk);
  }
  if (*reinterpret_cast<volatile std::uint32_t*>(verdict) != gpu::kVerdictMatch)
    return cli::fail("the verified floor's verification found no match");
  const double bulk = median(bulk_s);
  auto minmax = [](const std::vector<double>& v) {
    return fmt::format("{:.3f}-{:.3f}", *std::min_element(v.begin(), v.end()),
                       *std::max_element(v.begin(), v.end()));
  };
  fmt::print(
      "\n(b) restore of a {}-token prefix ({} PAGE chunks + SLOT, {:.1f} MiB), {} rounds, each "
      "measuring every row in turn; ratios: the median (and min-max) of the rounds' ratios to "
      "their bulk copy\n",
      prefix_tokens, prefix_chunks, bytes / 1048576.0, restore_rounds);
  fmt::print("    bulk H2D, pinned, 1 copy        {:10.3f} ms   {:8.2f} GB/s\n", bulk * 1e3,
             bytes / bulk / 1e9);
  fmt::print("    engine restore (PAGE + SLOT)    {:10.3f} ms   {:8.2f} GB/s\n",
             median(restore_s) * 1e3, bytes / median(restore_s) / 1e9);
  fmt::print(
      "    ratio restore / bulk            {:10.3f}x   ({} of the rounds; target <= 1.03x)\n",
      median(restores), minmax(restores));
  fmt::print("    floor: one DMA per object       {:10.3f}x   ({}; {} DMAs, no verification)\n",
             median(per_object), minmax(per_object), prefix_chunks + 1);
  fmt::print(
      "    floor, verified                 {:10.3f}x   ({}; the same DMAs, then the last "
      "chunk's verification and gated copy and the SLOT's commit copy)\n",
      median(verified), minmax(verified));
  fmt::print(
      "    the PAGE chunks alone           {:10.3f} ms   {:8.2f} GB/s   ({:.3f} ms more with "
      "the SLOT; {:.3f}x the bulk copy of PAGE and SLOT)\n",
      median(page_s) * 1e3, (bytes - slot_bytes) / median(page_s) / 1e9,
      (median(restore_s) - median(page_s)) * 1e3, median(page_only));
  return 0;
}

}  // namespace

TIER_CLI_COMMAND(forward,
                 "forward [--preset NAME] [--profile PATH] [--layers N] [--layer-us 200] "
                 "[--steps 64] [--save-chunks 1] [--slot-every 16] [--prefix-tokens 16384] "
                 "[--chunk-blocks 4] [--iters 5] [--restores 11] [--device N]",
                 "the offload engine against a synthetic forward pass on the GPU: decode step "
                 "time with saves on vs off, prefix restore vs bulk host-to-device copy",
                 run_forward);
