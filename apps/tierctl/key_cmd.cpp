// tierctl key --namespace JSON --tokens 1,2,3 [--chunk N] [--rank R]
#include <charconv>

#include <fmt/format.h>

#include "cli.hpp"
#include "tier/key.hpp"

namespace {

int run_key(tier::cli::Args& args) {
  auto ns_text = args.get("namespace");
  auto tokens_text = args.get("tokens");
  std::uint64_t chunk = args.uint("chunk", 0, 1ull << 32).value_or(0);
  bool partial = args.flag("partial");
  args.finish();
  if (!ns_text || !tokens_text)
    return tier::cli::fail("usage: tierctl key --namespace JSON --tokens 1,2,3 [--chunk N]", 2);
  auto identity = tier::parse_json(*ns_text, "--namespace");
  if (!identity) return tier::cli::fail(identity.status().message(), 2);
  std::vector<std::uint32_t> tokens;
  std::string_view s = *tokens_text;
  while (!s.empty()) {
    auto comma = s.find(',');
    std::string_view item = s.substr(0, comma);
    std::uint32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || p != item.data() + item.size())
      return tier::cli::fail(fmt::format("--tokens: \"{}\" is not a token id (u32)", item), 2);
    tokens.push_back(v);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  auto ns = tier::namespace_id(*identity);
  if (!ns) return tier::cli::fail(ns.status().to_string());
  fmt::print("canonical {}\n", tier::canonical_json(*identity));
  fmt::print("namespace {}\n", ns->hex());
  if (chunk == 0) chunk = tokens.size();
  auto keys = tier::chunk_keys(*ns, tokens, chunk, partial);
  for (std::size_t i = 0; i < keys.size(); ++i)
    fmt::print("chunk {} tokens [{}, {}) key {}\n", i, i * chunk,
               std::min<std::size_t>((i + 1) * chunk, tokens.size()), keys[i].hex());
  return 0;
}

}  // namespace

TIER_CLI_COMMAND(key,
                 "key --namespace JSON --tokens 1,2,3,... [--chunk N] [--partial]",
                 "print the namespace id and the chained chunk keys (docs/keys.md), for "
                 "cross-language checks",
                 run_key);
