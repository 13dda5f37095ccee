#pragma once
// TLS for the remote tier (rediss://): Boost.Asio's ssl::stream over a connection's TCP socket, on
// OpenSSL. Included only by the tier's sources built with the Meson feature `tls`
// (TIER_REDIS_TLS); redis_connection.hpp and redis_backend.hpp know these types by name only.
//
// One TlsContext per backend (trust store, client certificate); one TlsStream per connection
// attempt, shared with the handlers of its pending operations so that a stream closed by a
// failure lives until they have run. Everything runs on the owner's thread, like the rest of the
// tier.

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <string>

#include "redis_config.hpp"

namespace tier::redis {

struct TlsContext {
  explicit TlsContext(const TlsConfig& cfg)
      : ctx(boost::asio::ssl::context::tls_client), config(cfg) {}
  boost::asio::ssl::context ctx;
  TlsConfig config;
};

struct TlsStream {
  TlsStream(const boost::asio::any_io_executor& ex, TlsContext& tls) : stream(ex, tls.ctx) {}
  boost::asio::ssl::stream<boost::asio::ip::tcp::socket> stream;
};

// Sets SNI and the name the server's certificate must carry (a DNS name or an IP address) on a
// new stream for `host`. Errors: IoError when OpenSSL refuses the name.
Status prepare_tls_stream(TlsStream& s, const TlsConfig& cfg, const std::string& host);

// The reason a handshake failed: Asio's message, and OpenSSL's verification result when the
// server's certificate was refused ("certificate has expired", "hostname mismatch", ...).
std::string tls_handshake_error(TlsStream& s, const boost::system::error_code& ec);

}  // namespace tier::redis
