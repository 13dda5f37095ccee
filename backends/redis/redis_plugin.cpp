// Registration of the redis backend (built in when Boost.Asio is available).
#include "redis_backend.hpp"
#include "tier/plugin.hpp"

namespace {
constexpr const char kRedisOptions[] = R"JSON([
  {"name": "url", "type": "string", "default": "redis://127.0.0.1:6379",
   "doc": "redis://[[user]:password@]host[:port][/db], or rediss:// for TLS (tls_* options); in cluster mode any one master (the seed)"},
  {"name": "mode", "type": "enum", "choices": ["single", "cluster"], "default": "single",
   "doc": "single = one server (or a proxy); cluster = Redis Cluster: slot map from CLUSTER SLOTS, CRC16 routing, MOVED/ASK followed"},
  {"name": "username", "type": "string", "default": "",
   "doc": "ACL user for AUTH user password (overrides the url's); empty: the url's, or AUTH with the password only"},
  {"name": "password", "type": "string", "default": "", "secret": true,
   "doc": "password for AUTH (overrides the url's; ${VAR} keeps it out of the file); empty: the url's, or no AUTH"},
  {"name": "db", "type": "int", "default": -1, "min": -1, "max": 65535,
   "doc": "database for SELECT in single mode; -1: the url's /db, else 0"},
  {"name": "key_prefix", "type": "string", "default": "libtier:",
   "doc": "prepended to every key; each namespace then has its own prefix <key_prefix><namespace hex>:. Must not contain braces"},
  {"name": "hash_tag", "type": "enum", "choices": ["none", "namespace_rank"], "default": "none",
   "doc": "none: keys spread over the cluster by the whole key; namespace_rank: {<namespace>:r<rank>} is a hash tag, so every object of a namespace and rank (PAGE chunks and SLOT sidecars of a resume point) lands on one shard"},
  {"name": "connections", "type": "uint", "default": 4, "min": 1, "max": 256,
   "doc": "connections per server (per master in cluster mode); requests are pipelined on each and go to the one with the fewest pending"},
  {"name": "timeout", "type": "duration", "default": "1s", "min": 1000,
   "doc": "per-request deadline from submit to reply; a request without a reply in time ends with TimedOut and its connection is reopened"},
  {"name": "connect_timeout", "type": "duration", "default": "1s", "min": 1000,
   "doc": "deadline of a TCP connect plus the AUTH/SELECT handshake"},
  {"name": "reconnect_min", "type": "duration", "default": "20ms",
   "doc": "first delay before reconnecting a failed connection; doubles per failure up to reconnect_max, reset by a good handshake"},
  {"name": "reconnect_max", "type": "duration", "default": "1s",
   "doc": "longest delay between reconnect attempts"},
  {"name": "ttl", "type": "duration", "default": 0,
   "doc": "expiry of stored objects (SET ... PX); 0: no expiry, the server's maxmemory policy evicts"},
  {"name": "max_in_flight", "type": "uint", "default": 4096, "min": 1,
   "doc": "requests submitted and not yet polled; submit() accepts no more beyond this"},
  {"name": "max_object_bytes", "type": "size", "default": "512MiB",
   "doc": "largest image accepted (Redis's proto-max-bulk-len is 512MiB by default); also the longest GET reply read, so a server cannot make the tier read more"},
  {"name": "tls_verify", "type": "bool", "default": true,
   "doc": "rediss:// only: verify the server's certificate chain and name (false: encrypt without knowing who answers; for tests only)"},
  {"name": "tls_ca_file", "type": "string", "default": "",
   "doc": "rediss:// only: PEM file of the CA certificates trusted to sign the server's; empty (and tls_ca_path empty): the system's trust store"},
  {"name": "tls_ca_path", "type": "string", "default": "",
   "doc": "rediss:// only: directory of trusted CA certificates in OpenSSL's hashed layout (c_rehash / openssl rehash)"},
  {"name": "tls_cert_file", "type": "string", "default": "",
   "doc": "rediss:// only: client certificate chain (PEM) for servers that require one (mutual TLS, redis tls-auth-clients)"},
  {"name": "tls_key_file", "type": "string", "default": "",
   "doc": "rediss:// only: private key (PEM, unencrypted) of tls_cert_file; empty: the key is in tls_cert_file"},
  {"name": "tls_server_name", "type": "string", "default": "",
   "doc": "rediss:// only: name sent as SNI and required in the server's certificate; empty: the host of each connection (the url's, or the address a cluster announces)"}
])JSON";
constexpr tier_plugin kRedis = tier::make_backend_plugin<tier::redis::RedisBackend>(
    "redis", "Redis / Redis Cluster tier over Boost.Asio (shared by many nodes)", kRedisOptions);
}  // namespace

TIER_REGISTER_PLUGIN(redis, kRedis)
