// tierctl shm inspect|verify|remove NAME: the cpu tier's shared-memory segments (docs/shm.md).
#include <fmt/format.h>
#include <unistd.h>

#include <map>

#include "cli.hpp"
#include "shm/store.hpp"
#include "tier/json.hpp"
#include "tier/options.hpp"

namespace {

using tier::cpu::ShmStore;

tier::Json stats_json(const tier::cpu::ShmStats& s) {
  return tier::Json{{"segment", s.segment},
                    {"segment_bytes", s.segment_bytes},
                    {"capacity_bytes", s.capacity_bytes},
                    {"block_bytes", s.block_bytes},
                    {"max_objects", s.max_objects},
                    {"used_bytes", s.used_bytes},
                    {"image_bytes", s.image_bytes},
                    {"objects", s.objects},
                    {"writing", s.writing},
                    {"doomed", s.doomed},
                    {"clients", s.clients},
                    {"recoveries", s.recoveries},
                    {"reaped_clients", s.reaped_clients},
                    {"corruptions", s.corruptions}};
}

tier::Json leases_json(const tier::cpu::ShmLeases& l) {
  return {{"objects", l.objects}, {"longest_ms", l.longest_ms}, {"longest_pid", l.longest_pid}};
}

// "leases      3 objects held against eviction; the longest for 3599.2 s more (pid 4711)"
void print_leases(const tier::cpu::ShmLeases& l) {
  if (l.objects == 0) {
    fmt::print("leases      none\n");
    return;
  }
  fmt::print(
      "leases      {} object{} held against eviction (puts that need their room fail); "
      "the longest for {:.1f} s more ({})\n",
      l.objects, l.objects == 1 ? "" : "s", static_cast<double>(l.longest_ms) / 1000,
      l.longest_pid ? fmt::format("pid {}", l.longest_pid) : "several processes");
}

int inspect(const std::string& name, bool json, bool list_objects) {
  auto store = ShmStore::attach(name);
  if (!store) return tier::cli::fail(store.status().to_string());
  auto found = (*store)->inspect();
  if (!found) return tier::cli::fail(found.status().to_string());
  auto& [st, clients, objects, leases] = *found;
  // Our own client slot is not worth listing.
  std::erase_if(clients,
                [](const auto& c) { return c.pid == static_cast<std::int32_t>(::getpid()); });
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> per_ns;  // ns -> objects, bytes
  for (const auto& o : objects) {
    auto& [n, bytes] = per_ns[o.key.ns.hex()];
    ++n;
    bytes += o.image_bytes;
  }
  if (json) {
    tier::Json j = stats_json(st);
    j["clients"] = clients.size();
    j["client_list"] = tier::Json::array();
    for (const auto& c : clients)
      j["client_list"].push_back({{"pid", c.pid}, {"alive", c.alive}, {"pinning", c.pinning}});
    j["namespaces"] = tier::Json::object();
    for (const auto& [ns, v] : per_ns)
      j["namespaces"][ns] = {{"objects", v.first}, {"bytes", v.second}};
    j["leases"] = leases_json(leases);
    if (list_objects) {
      j["object_list"] = tier::Json::array();
      for (const auto& o : objects)
        j["object_list"].push_back({{"key", o.key.to_string()},
                                    {"image_bytes", o.image_bytes},
                                    {"blocks", o.blocks},
                                    {"state", o.state},
                                    {"lease_ms", o.lease_ms},
                                    {"lease_pid", o.lease_pid}});
    }
    fmt::print("{}\n", tier::json_text(j, 2));
    return 0;
  }
  fmt::print("segment     {} ({} mapped)\n", st.segment, tier::format_size(st.segment_bytes));
  fmt::print("capacity    {} in {} blocks of {}, {} index entries\n",
             tier::format_size(st.capacity_bytes), st.capacity_bytes / st.block_bytes,
             tier::format_size(st.block_bytes), st.max_objects);
  fmt::print("used        {} in blocks ({} of images)\n", tier::format_size(st.used_bytes),
             tier::format_size(st.image_bytes));
  fmt::print("objects     {} ready, {} being written, {} removed while read\n", st.objects,
             st.writing, st.doomed);
  fmt::print(
      "recoveries  {} lock-holder deaths repaired, {} dead clients reaped, {} corrupt "
      "fields met and repaired\n",
      st.recoveries, st.reaped_clients, st.corruptions);
  fmt::print("clients     {}\n", clients.size());
  for (const auto& c : clients)
    fmt::print("  pid {:<8} {}{}\n", c.pid, c.alive ? "alive" : "dead (reaped on next use)",
               c.pinning ? ", reading" : "");
  print_leases(leases);
  fmt::print("namespaces  {}\n", per_ns.size());
  for (const auto& [ns, v] : per_ns)
    fmt::print("  {} {} objects, {}\n", ns, v.first, tier::format_size(v.second));
  if (list_objects)
    for (const auto& o : objects)
      fmt::print("  {} {} ({} blocks) {}{}\n", o.key.to_string(), tier::format_size(o.image_bytes),
                 o.blocks, o.state,
                 o.lease_ms ? fmt::format(", leased for {:.1f} s more", o.lease_ms / 1000.0) : "");
  return 0;
}

int verify(const std::string& name, bool json) {
  auto store = ShmStore::attach(name);
  if (!store) return tier::cli::fail(store.status().to_string());
  auto r = (*store)->verify();
  if (!r) return tier::cli::fail(r.status().to_string());
  if (json) {
    fmt::print("{}\n", tier::json_text(tier::Json{{"checked", r->checked},
                                                  {"corrupt", r->corrupt},
                                                  {"index_problems", r->index_problems},
                                                  {"dropped_entries", r->dropped_entries},
                                                  {"reaped_clients", r->reaped_clients},
                                                  {"leases", leases_json(r->leases)},
                                                  {"problems", r->problems}},
                                       2));
  } else {
    for (const auto& p : r->problems) fmt::print("{}\n", p);
    fmt::print(
        "{}: {} index problems (repaired, {} malformed entries dropped), {} objects "
        "verified, {} corrupt (removed), {} dead clients reaped\n",
        name, r->index_problems, r->dropped_entries, r->checked, r->corrupt, r->reaped_clients);
    print_leases(r->leases);
  }
  return r->corrupt == 0 && r->problems.empty() ? 0 : 1;
}

int run_shm(tier::cli::Args& args) {
  bool json = args.flag("json");
  bool list_objects = args.flag("objects");
  args.finish();
  const auto& pos = args.positional();
  constexpr const char* kUsage =
      "usage: tierctl shm inspect|verify|remove NAME [--json] [--objects]";
  if (pos.size() != 2) return tier::cli::fail(kUsage, 2);
  const std::string& verb = pos[0];
  const std::string& name = pos[1];
  if (verb == "inspect") return inspect(name, json, list_objects);
  if (verb == "verify") return verify(name, json);
  if (verb == "remove") {
    tier::Status s = ShmStore::remove_segment(name);
    if (!s) return tier::cli::fail(s.to_string());
    fmt::print("removed shm segment {}\n", name);
    return 0;
  }
  return tier::cli::fail(kUsage, 2);
}

}  // namespace

TIER_CLI_COMMAND(
    shm, "shm inspect|verify|remove NAME [--json] [--objects]",
    "the cpu tier's shared-memory segments: inspect usage, clients and namespaces; "
    "verify the index (each corrupt field named, then repaired) and every object (corrupt ones "
    "are removed); exit 1 on any problem; remove the segment",
    run_shm);
