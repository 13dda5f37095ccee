// tierctl sidecar_key --hash HEX --fingerprint HEX32 [--tp SIZE/RANK] [--namespace HEX32]
#include <charconv>

#include <fmt/format.h>

#include "cli.hpp"
#include "tier/dsv4/slot_codec.hpp"

namespace {

int run_sidecar_key(tier::cli::Args& args) {
  auto hash = args.get("hash");
  auto fp = args.get("fingerprint");
  std::string tp = args.get_or("tp", "1/0");
  std::string ns_hex = args.get_or("namespace", std::string(32, '0'));
  args.finish();
  const char* usage =
      "usage: tierctl sidecar_key --hash HEX --fingerprint HEX32 [--tp SIZE/RANK] "
      "[--namespace HEX32]";
  if (!hash || !fp || fp->size() != 32) return tier::cli::fail(usage, 2);
  std::uint64_t h = 0;
  std::string_view hs = *hash;
  if (hs.starts_with("0x")) hs.remove_prefix(2);
  auto [hp, hec] = std::from_chars(hs.data(), hs.data() + hs.size(), h, 16);
  if (hec != std::errc() || hp != hs.data() + hs.size())
    return tier::cli::fail("--hash: expected a hexadecimal u64", 2);
  tier::dsv4::SlotIdentity id;
  for (std::size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    auto [p, ec] = std::from_chars(fp->data() + 2 * i, fp->data() + 2 * i + 2, v, 16);
    if (ec != std::errc() || p != fp->data() + 2 * i + 2)
      return tier::cli::fail("--fingerprint: expected 32 hex digits", 2);
    id.fingerprint[i] = static_cast<std::byte>(v);
  }
  if (std::sscanf(tp.c_str(), "%u/%u", &id.tp_size, &id.tp_rank) != 2 || id.tp_size == 0 ||
      id.tp_rank >= id.tp_size)
    return tier::cli::fail("--tp: expected SIZE/RANK with RANK < SIZE", 2);
  auto ns = tier::Key128::from_hex(ns_hex);
  if (!ns) return tier::cli::fail("--namespace: " + ns.status().to_string(), 2);
  std::string canonical = tier::dsv4::sidecar_canonical(h, id);
  tier::ObjectKey key = tier::dsv4::slot_key(*ns, {1, h}, id);
  fmt::print("canonical {}\n", canonical);
  fmt::print("atom_storage_hash {}\n", tier::dsv4::atom_storage_hash(canonical));
  fmt::print("key {}\n", key.to_string());
  return 0;
}

}  // namespace

TIER_CLI_COMMAND(sidecar_key,
                 "sidecar_key --hash HEX --fingerprint HEX32 [--tp SIZE/RANK] [--namespace HEX32]",
                 "print a DSV4 sidecar's canonical string, the reference's storage hash and the "
                 "libtier key, for cross-implementation checks",
                 run_sidecar_key);
