#pragma once
// One TCP (or TLS over TCP) connection to one Redis server, driven only by the backend's owner
// thread (its handlers run inside the backend's submit() and poll()).
//
// Requests are pipelined: enqueue() appends to the write queue, a single gathered async_write
// sends as many as fit (SET values go out of the caller's buffer, never copied), and replies are
// matched to requests in order. GET payloads are streamed into the caller's buffer; a payload
// larger than the buffer is read and dropped, and the request ends with InvalidArgument and the
// size needed.
//
// Faults: a request whose deadline passes while written or queued on a ready connection means the
// server is stalled: the connection is closed, every request on it ends with TimedOut, and it
// reconnects after a backoff (reconnect_min, doubling up to reconnect_max, reset by a successful
// handshake). Any socket or protocol error ends every request on it with IoError the same way.
// While the connection waits for its backoff, enqueue() fails requests at once (IoError), so a
// caller never waits for a server that is known to be down.
//
// TLS (rediss://, redis_tls.hpp): each connection attempt makes a new ssl::stream over a new
// socket and completes its handshake (server verification, SNI, client certificate) within
// connect_timeout before the Redis handshake; a handshake failure is a connect failure (IoError
// naming OpenSSL's reason, reconnect with backoff). A plain connection has no TLS state at all.
//
// Hostile servers: every reply is read within bounds taken from its request (Request::limits), so
// whatever the server sends, a connection holds at most max(kReadBufferBytes, the largest limit
// of its requests + kReplyFraming) bytes of read buffer (RedisStats::read_buffer_peak) and a
// reply that breaks its bounds ends every request on the connection with IoError ("redis
// protocol error: ..."). A GET value may be as long as max(max_object_bytes, the caller's
// buffer) and is streamed (into the caller's buffer, or dropped when it does not fit), never
// buffered. A reply still incomplete at its request's deadline ends it with TimedOut, checked on
// every read that leaves it incomplete as well as by check_deadlines(), so a server that keeps
// sending never holds the caller past the timeout.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "redis_config.hpp"
#include "resp.hpp"
#include "tier/metrics.hpp"
#include "tier/status.hpp"

namespace tier::redis {

using Clock = std::chrono::steady_clock;

// A connection's read buffer; it grows only for a reply with larger limits (CLUSTER SLOTS).
inline constexpr std::size_t kReadBufferBytes = 256 * 1024;
// Replies other than GET values and CLUSTER SLOTS: status lines, errors (MOVED/ASK included),
// integers, nil; no legitimate one comes near.
inline constexpr ReplyLimits kSmallReply{64 * 1024, 64};
// CLUSTER SLOTS: room for 16384 ranges of a master and a few replicas each. At most 512Ki
// elements, about 37 MiB of parsed Reply, and only from bytes that have arrived.
inline constexpr ReplyLimits kSlotMapReply{8 << 20, 1 << 19};

// One command. A user request finishes through ConnectionOwner::complete(); a control request
// (AUTH, SELECT, CLUSTER SLOTS) has `on_reply`, called from a handler with the reply or with
// the error that ended the connection.
struct Request {
  std::uint64_t user_data = 0;  // the core's request id, returned in the Completion
  Op op = Op::kGet;
  std::string head;                  // RESP text before the value (the whole command if none)
  const std::byte* value = nullptr;  // kPut: the image, sent after `head`, then `tail`
  std::size_t value_bytes = 0;
  std::string_view tail;     // text after the value; points into the backend
  std::byte* dst = nullptr;  // kGet: where the value goes
  std::size_t dst_bytes = 0;
  Clock::time_point deadline;
  std::uint16_t slot = 0;            // cluster hash slot of the key
  std::uint8_t redirects = 0;        // MOVED/ASK followed so far
  bool asking = false;               // prefix ASKING (its +OK reply is skipped)
  ReplyLimits limits = kSmallReply;  // bounds of the reply (a GET value's: see Connection)
  const char* command = nullptr;     // a control request's command, for messages
  std::function<void(const Status&, Reply&)> on_reply;
};
using RequestPtr = std::unique_ptr<Request>;

// Counters of connection-level events, readable from any thread.
struct RedisStats {
  Counter connects;          // connections established
  Counter connect_failures;  // connect attempts that failed or timed out
  Counter disconnects;       // established connections lost (error, EOF, timeout)
  Counter timeouts;          // connections closed because a request passed its deadline
  Counter fast_failures;     // requests failed at once: no connection to their server
  Counter moved;             // MOVED redirections followed
  Counter asked;             // ASK redirections followed
  Counter map_refreshes;     // cluster slot maps applied
  Counter protocol_errors;   // connections closed for a reply that was not RESP2 or broke its
                             // request's limits
  Counter read_buffer_peak;  // the largest read buffer any connection has held, in bytes (a
                             // maximum, not a sum)
};

struct TlsContext;  // redis_tls.hpp
struct TlsStream;
// The TLS context of a rediss:// tier: trust store and client certificate from `cfg`.
// Errors: InvalidArgument naming the option whose file does not load; NotSupported in a build
// without TLS.
Result<std::shared_ptr<TlsContext>> make_tls_context(const TlsConfig& cfg);

// The connection's owner (the backend's router); called from the connection's handlers.
class ConnectionOwner {
 public:
  virtual ~ConnectionOwner() = default;
  // A user request finished with `s` (`bytes` as Completion::bytes).
  virtual void complete(RequestPtr r, Status s, std::size_t bytes) = 0;
  // The server answered `-MOVED slot address` or `-ASK slot address` for `r`.
  virtual void redirect(RequestPtr r, bool ask, std::uint16_t slot, std::string_view address) = 0;
  // The connection went down; its requests have already been finished.
  virtual void connection_lost(const Status& why) = 0;
};

class Connection {
 public:
  enum class State : std::uint8_t { kIdle, kConnecting, kReady, kBackoff };

  // `tls`: the backend's TLS context for rediss:// (outlives the connection), else nullptr.
  Connection(boost::asio::io_context& io, Endpoint endpoint, const RedisConfig& cfg,
             ConnectionOwner& owner, RedisStats& stats, TlsContext* tls);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  State state() const noexcept { return state_; }
  const Endpoint& endpoint() const noexcept { return endpoint_; }
  // Requests queued or written and not yet answered.
  std::size_t pending() const noexcept { return wq_.size() + inflight_.size(); }

  // Starts connecting (kIdle only).
  void connect();
  // Queues a request; starts connecting when idle; fails it at once while in backoff.
  void enqueue(RequestPtr r);
  // Enforces request and connect deadlines. The backend calls it from poll() after running every
  // ready handler, so a reply that has arrived is never mistaken for a late one.
  void check_deadlines(Clock::time_point now);

 private:
  void on_connected();
  void on_tcp_connected();
  // The socket under the stream in use: the plain one, or the current TLS stream's.
  boost::asio::ip::tcp::socket& socket() noexcept;
  // Calls f(stream, keep): the plain socket with keep = nullptr, or the TLS stream with keep =
  // the shared_ptr that its handlers hold until they have run.
  template <class F>
  void with_stream(F&& f);
  void fail(const Status& why);
  void maybe_write();
  void start_read();
  void process();
  void finish_stream();
  void handle_reply(RequestPtr r, Reply& reply);
  void protocol_failure(const Status& why);
  void read_done(std::uint64_t g);
  void push_handshake();

  Endpoint endpoint_;
  const RedisConfig& cfg_;
  ConnectionOwner& owner_;
  RedisStats& stats_;
  boost::asio::ip::tcp::socket socket_;  // plain connections only
  TlsContext* tls_ctx_;                  // rediss://: the backend's, else nullptr
  std::shared_ptr<TlsStream> tls_;       // the current attempt's stream (rediss://)
  std::string tls_out_;                  // a write batch made contiguous for TLS records
  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::steady_timer backoff_timer_;

  State state_ = State::kIdle;
  std::uint64_t gen_ = 0;  // bumped on every close; stale handlers compare and return
  Clock::time_point connect_deadline_;
  std::chrono::microseconds backoff_{0};
  bool writing_ = false;

  std::deque<RequestPtr> wq_;        // not yet written
  std::deque<RequestPtr> inflight_;  // written, awaiting replies in order
  std::vector<boost::asio::const_buffer> write_bufs_;

  std::vector<char> rbuf_;
  std::size_t rpos_ = 0, rend_ = 0;
  // A GET payload being streamed into the front request's buffer (or dropped when too big).
  bool streaming_ = false;
  std::byte* stream_dst_ = nullptr;
  std::size_t stream_left_ = 0;  // payload bytes still to come
  std::size_t stream_crlf_ = 0;  // bytes of the trailing "\r\n" still to skip
  std::size_t stream_total_ = 0;
  bool stream_fits_ = false;
};

}  // namespace tier::redis
