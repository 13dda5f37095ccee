// The offload engine with every rank's KV memory on GPU 0 (dsv4::Dsv4LayoutOptions "memory":
// "device"): the layout's codecs and host access against a host layout holding the same bytes,
// then scenarios of the simulated engine (tests/support/engine_scenarios.hpp) run with device
// memory: save and resume bit exact at TP 2 and 8, foreign and corrupt sidecars never resume, the
// corruption fence, commits rediscovered after a restart; then again with a pinned CPU tier,
// whose direct scattered gets write the device KV with its copy kernel. Exits 77 (Meson: SKIP)
// without a GPU.
#include <doctest/doctest.h>

#include <vector>

#include "gpu.hpp"
#include "support/engine_scenarios.hpp"
#include "support/test_util.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

SimOptions device_opts(std::uint32_t tp = 2) {
  SimOptions o = sim_options(tp);
  o.layout.memory = dsv4::KvMemoryKind::kDevice;
  o.layout.device = 0;
  return o;
}

std::vector<std::byte> encode(const Codec& codec, RegionList src) {
  auto size = codec.encoded_size(src);
  REQUIRE_MESSAGE(size.is_ok(), size.status().to_string());
  std::vector<std::byte> out(*size);
  auto n = codec.encode(src, out);
  REQUIRE_MESSAGE(n.is_ok(), n.status().to_string());
  out.resize(*n);
  return out;
}

}  // namespace

TEST_CASE("device layout: codecs and host access reach the device bytes") {
  const auto geo = small_geometry(128, 64, 4);
  const Key128 ns = default_config().page_namespace;
  dsv4::Dsv4LayoutOptions dev_opts;
  dev_opts.memory = dsv4::KvMemoryKind::kDevice;
  auto host = require_value(dsv4::Dsv4Layout::create(geo, ns, 2, 1));
  auto dev = require_value(dsv4::Dsv4Layout::create(geo, ns, 2, 1, dev_opts));
  CHECK(dev->options().memory == dsv4::KvMemoryKind::kDevice);

  const std::vector<std::uint32_t> blocks = {7, 3, 11};
  auto dev_regions = require_value(dev->page_regions(blocks));
  for (const Region& r : dev_regions) {
    CHECK(r.kind == MemoryKind::kDevice);
    CHECK(r.device == 0);
    CHECK_FALSE(gpu::is_mapped_pinned(r.data));
  }
  for (const Region& r : require_value(dev->slot_regions(2))) CHECK(r.kind == MemoryKind::kDevice);

  // Fresh memory is zero on both; the same fills give the same digests, unlike zero.
  const std::uint64_t zero = require_value(digest_block(*host, 0));
  CHECK(require_value(digest_block(*dev, 0)) == zero);
  CHECK(require_value(digest_slot(*dev, 0)) == require_value(digest_slot(*host, 0)));
  for (std::uint32_t b : blocks) {
    require_ok(fill_block(*host, b, 1000 + b));
    require_ok(fill_block(*dev, b, 1000 + b));
    const std::uint64_t want = require_value(digest_block(*host, b));
    CHECK(want != zero);
    CHECK(require_value(digest_block(*dev, b)) == want);
  }
  require_ok(fill_slot(*host, 2, 99));
  require_ok(fill_slot(*dev, 2, 99));
  CHECK(require_value(digest_slot(*dev, 2)) == require_value(digest_slot(*host, 2)));
  CHECK(require_value(digest_slot(*dev, 2)) != require_value(digest_slot(*dev, 0)));

  // PAGE: the GPU executor's gather equals the host image; its scatter restores other blocks.
  const auto image = encode(host->page_codec(), require_value(host->page_regions(blocks)));
  CHECK(encode(dev->page_codec(), dev_regions) == image);
  const std::vector<std::uint32_t> targets = {20, 21, 22};
  require_ok(dev->page_codec().decode(image, require_value(dev->page_regions(targets))));
  for (std::size_t i = 0; i < blocks.size(); ++i)
    CHECK(require_value(digest_block(*dev, targets[i])) ==
          require_value(digest_block(*host, blocks[i])));
  CHECK(require_value(digest_block(*dev, 23)) == zero);  // nothing beyond the targets

  // SLOT: the same AOS1 frame from both; a restore into another group is bit exact, and a
  // frame with one flipped byte writes nothing.
  const SlotIdentity id{1024, 0x1234, 2, 1};
  auto host_slot = require_value(host->slot_codec(id));
  auto dev_slot = require_value(dev->slot_codec(id));
  const auto frame = encode(*host_slot, require_value(host->slot_regions(2)));
  CHECK(encode(*dev_slot, require_value(dev->slot_regions(2))) == frame);
  require_ok(dev_slot->decode(frame, require_value(dev->slot_regions(1))));
  CHECK(require_value(digest_slot(*dev, 1)) == require_value(digest_slot(*host, 2)));
  auto bad = frame;
  bad[bad.size() - 5] ^= std::byte{0x10};
  const std::uint64_t before = require_value(digest_slot(*dev, 0));
  CHECK(dev_slot->decode(bad, require_value(dev->slot_regions(0))) == Code::kChecksumMismatch);
  CHECK(require_value(digest_slot(*dev, 0)) == before);

  // A different write is seen: the digests read the device, not a stale copy.
  require_ok(fill_block(*dev, 3, 5));
  CHECK(require_value(digest_block(*dev, 3)) != require_value(digest_block(*host, 3)));
  require_ok(zero_block(*dev, 3));
  CHECK(require_value(digest_block(*dev, 3)) == zero);
}

TEST_CASE("device KV: save then resume bit exact at TP 2") {
  resume_bit_exact_on_every_rank(device_opts(2));
}

TEST_CASE("device KV: tp8 resume restores page and slot bit exact on every rank") {
  resume_bit_exact_on_every_rank(device_opts(8));
}

TEST_CASE("device KV: stateful page hit shrinks from 16k to committed 8k sidecar") {
  page_hit_shrinks_to_committed_sidecar(device_opts());
}

TEST_CASE("device KV: commits survive a scheduler restart") {
  commits_survive_restart(device_opts());
}

TEST_CASE("device KV: missing or corrupt sidecar fails whole load and invalidates once") {
  foreign_sidecar_fails_whole_load(device_opts());
}

TEST_CASE("device KV: corrupt sidecar bytes fail the load like a foreign one") {
  corrupt_sidecar_bytes_fail_the_load(device_opts());
}

TEST_CASE("device KV: failed corruption invalidation cannot fake later commit") {
  failed_invalidation_cannot_fake_commit(device_opts());
}

// With a pinned heap tier, PAGE chunks and SLOT sidecars come back by direct scattered gets:
// the tier checks the object and the AOS1 frame on the host, then its copy kernel writes the
// device KV (Codec::direct). The same scenarios hold.
SimOptions pinned_opts(std::uint32_t tp = 2) {
  SimOptions o = device_opts(tp);
  o.profile = [](std::uint32_t) { return cpu_profile("256MiB", true); };
  return o;
}

TEST_CASE("device KV, pinned tier: direct restores resume bit exact at TP 2 and TP 8") {
  resume_bit_exact_on_every_rank(pinned_opts(2));
  resume_bit_exact_on_every_rank(pinned_opts(8));
}

TEST_CASE("device KV, pinned tier: foreign and corrupt sidecars never resume") {
  foreign_sidecar_fails_whole_load(pinned_opts());
  corrupt_sidecar_bytes_fail_the_load(pinned_opts());
  corrupt_sidecar_bytes_fail_the_load(pinned_opts(), true);  // only the AOS1 CRC sees it
}

TEST_CASE("device KV, pinned tier: the hit shrinks to the committed sidecar; restarts") {
  page_hit_shrinks_to_committed_sidecar(pinned_opts());
  commits_survive_restart(pinned_opts());
}
