// The metrics endpoint a profile's "metrics" section starts (docs/metrics.md): GET /metrics over
// HTTP/1.1 (Boost.Beast), one request per connection, on a thread and an io_context of its own.
// The thread renders TierStack::metrics_prometheus(), which reads counters only: it never takes
// the stack's lock and never calls user code. A request is bounded in size (kMaxRequestBytes, no
// body) and in time (MetricsEndpoint::timeout_us for reading it and writing the answer); at most
// MetricsEndpoint::max_connections are served at once, and a connection beyond them is closed.
#include <fmt/format.h>

#include "tier/log.hpp"
#include "tier/tier_stack.hpp"
#include "tier_stack_impl.hpp"

#if TIER_METRICS_HTTP
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <memory>
#include <thread>
#endif

namespace tier {

#if TIER_METRICS_HTTP

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {
// Request line and headers together; a scraper sends a few hundred bytes.
constexpr std::size_t kMaxRequestBytes = 8192;
}  // namespace

class TierStack::Impl::MetricsServer {
 public:
  MetricsServer(const MetricsEndpoint& cfg, const TierStack& stack) : cfg_(cfg), stack_(stack) {}
  ~MetricsServer() {  // the sessions left end with ioc_, after the thread
    ioc_.stop();
    if (thread_.joinable()) thread_.join();
  }

  // Binds and listens, then starts the thread. Errors: IoError.
  Status start() {
    beast::error_code ec;
    const auto address = asio::ip::make_address(cfg_.host, ec);
    tcp::endpoint ep(address, cfg_.port);
    if (!ec) acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return Status(Code::kIoError,
                    fmt::format("metrics: cannot listen on {}: {} (processes that share a "
                                "profile need a port each: \"listen\": "
                                "\"127.0.0.1:${{TIER_METRICS_PORT}}\", or port 0 for any)",
                                address_text(cfg_.host, cfg_.port), ec.message()));
    const tcp::endpoint bound = acceptor_.local_endpoint(ec);
    endpoint_ = address_text(cfg_.host, ec ? cfg_.port : bound.port());
    accept();
    thread_ = std::thread([this] {
      for (;;) {
        try {
          ioc_.run();
          return;
        } catch (const std::exception& e) {  // a handler failed (out of memory): keep serving
          log(LogLevel::kError, fmt::format("metrics endpoint: {}", e.what()));
        }
      }
    });
    return Status::ok();
  }
  const std::string& endpoint() const noexcept { return endpoint_; }

 private:
  class Session;

  static std::string address_text(const std::string& host, std::uint16_t port) {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                               : fmt::format("{}:{}", host, port);
  }
  void accept();

  const MetricsEndpoint cfg_;
  const TierStack& stack_;
  std::string endpoint_;
  std::uint32_t open_ = 0;  // sessions alive; touched by the thread only (declared before ioc_,
                            // whose destructor ends the sessions left)
  asio::io_context ioc_{1};
  tcp::acceptor acceptor_{ioc_};
  asio::steady_timer retry_{ioc_};
  std::thread thread_;
};

// One connection: read one request within the deadline, answer it, close.
class TierStack::Impl::MetricsServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(MetricsServer& server, tcp::socket socket) : server_(server), stream_(std::move(socket)) {
    ++server_.open_;
  }
  ~Session() { --server_.open_; }

  void start() {
    parser_.header_limit(kMaxRequestBytes);
    parser_.body_limit(0);
    // One deadline for the whole exchange: a client that trickles bytes is cut off too.
    stream_.expires_after(std::chrono::microseconds(server_.cfg_.timeout_us));
    http::async_read(
        stream_, buffer_, parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec) {
      log(LogLevel::kDebug, fmt::format("metrics endpoint: request dropped: {}", ec.message()));
      return close();
    }
    const auto& req = parser_.get();
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    res_.version(11);
    res_.keep_alive(false);
    res_.set(http::field::server, "libtier");
    if (req.method() != http::verb::get) {
      res_.result(http::status::method_not_allowed);
      res_.set(http::field::allow, "GET");
      res_.set(http::field::content_type, "text/plain; charset=utf-8");
      res_.body() = "only GET /metrics is served\n";
    } else if (path != "/metrics") {
      res_.result(http::status::not_found);
      res_.set(http::field::content_type, "text/plain; charset=utf-8");
      res_.body() = "only GET /metrics is served\n";
    } else {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res_.body() = server_.stack_.metrics_prometheus();
    }
    res_.prepare_payload();
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, std::size_t) {
      self->close();
    });
  }
  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  MetricsServer& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMaxRequestBytes};
  http::request_parser<http::empty_body> parser_;
  http::response<http::string_body> res_;
};

void TierStack::Impl::MetricsServer::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;  // stopping
    if (ec) {  // out of descriptors, say: try again a little later rather than spin
      log(LogLevel::kWarn, fmt::format("metrics endpoint: accept failed: {}", ec.message()));
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](beast::error_code e) {
        if (!e) accept();
      });
      return;
    }
    if (open_ >= cfg_.max_connections) {
      log(LogLevel::kDebug,
          fmt::format("metrics endpoint: {} connections open; one refused", open_));
      socket.close(ec);
    } else {
      std::make_shared<Session>(*this, std::move(socket))->start();
    }
    accept();
  });
}

void TierStack::Impl::MetricsServerStop::operator()(MetricsServer* s) const noexcept { delete s; }

Status TierStack::Impl::start_endpoint(const MetricsEndpoint& endpoint, const TierStack& self) {
  auto server =
      std::unique_ptr<MetricsServer, MetricsServerStop>(new MetricsServer(endpoint, self));
  TIER_RETURN_IF_ERROR(server->start());
  metrics_endpoint_ = server->endpoint();
  metrics_server_ = std::move(server);
  return Status::ok();
}

#else  // built without Boost's headers: a profile's "metrics" section cannot be served

class TierStack::Impl::MetricsServer {};

void TierStack::Impl::MetricsServerStop::operator()(MetricsServer* s) const noexcept { delete s; }

Status TierStack::Impl::start_endpoint(const MetricsEndpoint&, const TierStack&) {
  return Status(Code::kNotSupported,
                "metrics: this libtier was built without the metrics endpoint (Boost.Beast "
                "headers, Meson option metrics_http)");
}

#endif

}  // namespace tier
