#pragma once
// The remote tier: objects in a Redis server or a Redis Cluster shared by many engine nodes.
//
// Threads: none of its own. The backend's boost::asio::io_context is driven by the owner's
// thread inside submit() and poll(): submit() turns requests into RESP commands and starts their
// writes at once (Asio writes speculatively, in the calling thread, when the socket has room);
// poll() runs ready handlers (replies, timers, reconnects) until `min` completions are there
// (all of them when `min` is 0) or `wait` has passed, with the thread blocked in epoll_wait
// meanwhile. Like the io_uring tier's completions, replies wait in the kernel until the owner
// polls; the core calls poll() in every operation and in progress(). One thread, no hand-offs:
// measured on 2 cores, an I/O thread with a mutex/condvar hand-off both ways cost up to 30% of the
// GET rate of 64 KiB values (docs/remote.md). Handlers never call user code.
//
// Commands: put = SET key image NX [PX ttl] (AlreadyExists when the key exists; recency is the
// server's business), get = GET (streamed into the caller's buffer), contains = STRLEN,
// remove = UNLINK. Keys are formed by redis_key() (redis_config.hpp; docs/remote.md).
//
// Faults never block the caller beyond the configured timeout: a request with no reply within
// `timeout` ends with TimedOut, a request for a server that is down ends at once with IoError, and
// connections come back by themselves with backoff. The server being down when the backend is
// created is not an error: create() succeeds and the connections keep trying inside the owner's
// calls.
//
// Capacity: a shared store's memory is governed by the server (maxmemory and its eviction
// policy); the tier's capacity is advisory. usage() reports what this client knows: the image
// bytes and objects it stored successfully since it started (removals and server-side evictions
// by anyone are not seen). The backend never calls notify_evicted().
//
// TLS (rediss://): every connection, to the seed and to each cluster master, is TLS with the same
// context (trust store, client certificate); see redis_connection.hpp and docs/remote.md.
//
// Cluster mode: the slot map comes from CLUSTER SLOTS (at start, after a MOVED, after a lost
// connection); each key is routed by its CRC16 hash slot; MOVED updates the slot and retries,
// ASK retries once on the named node behind ASKING.

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <memory>
#include <vector>

#include "redis_config.hpp"
#include "redis_connection.hpp"
#include "tier/backend.hpp"

namespace tier::redis {

class RedisBackend final : public Backend, private ConnectionOwner {
 public:
  // Errors: InvalidArgument (bad options or url, a TLS file that does not load), NotSupported
  // (rediss:// in a build without TLS). Never fails because the server is unreachable.
  static Result<std::unique_ptr<RedisBackend>> create(const BackendContext& ctx);
  // `tls`: the TLS context when cfg.tls.enabled (make_tls_context), else nullptr.
  RedisBackend(std::string tier_name, std::uint64_t capacity, RedisConfig cfg,
               std::shared_ptr<TlsContext> tls = nullptr);
  ~RedisBackend() override;

  Capabilities capabilities() const noexcept override;
  Usage usage() const noexcept override;
  std::string describe() const override;

  const RedisConfig& config() const noexcept { return cfg_; }
  // Connection-level counters (reconnects, timeouts, redirects), readable from any thread.
  const RedisStats& stats() const noexcept { return stats_; }

 protected:
  Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept override;
  Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                              std::chrono::microseconds wait) noexcept override;

 private:
  struct Node {
    Endpoint endpoint;
    std::vector<std::unique_ptr<Connection>> pool;
    std::size_t next = 0;
  };

  // Called from inside submit() and poll() (handlers run there).
  void complete(RequestPtr r, Status s, std::size_t bytes) override;
  void redirect(RequestPtr r, bool ask, std::uint16_t slot, std::string_view address) override;
  void connection_lost(const Status& why) override;
  void dispatch(RequestPtr r);
  void send_to(Node& node, RequestPtr r);
  Node& node_for(const Endpoint& endpoint);
  Connection* pick(Node& node);
  void refresh_map();
  void retry_refresh_later();
  void apply_slot_map(const Reply& reply, const Endpoint& from);
  // Deadlines of every connection and of requests waiting for the slot map, at most once per
  // sweep interval.
  void sweep(Clock::time_point now);

  RedisConfig cfg_;
  std::uint64_t capacity_;
  std::string put_tail_;  // the SET command after the value: "\r\n" NX [PX ms]
  RedisStats stats_;
  Counter stored_bytes_;
  Counter stored_objects_;

  std::shared_ptr<TlsContext> tls_;  // before io_: outlives every stream and handler
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::steady_timer refresh_timer_;
  std::chrono::microseconds sweep_interval_;
  Clock::time_point next_sweep_{};
  std::vector<std::unique_ptr<Node>> nodes_;  // nodes_[0] is the seed
  std::vector<Node*> slots_;                  // cluster: slot -> master; nullptr = unknown
  bool refreshing_ = false;
  bool refresh_again_ = false;
  bool refresh_timer_armed_ = false;
  std::size_t refresh_next_ = 0;
  std::deque<RequestPtr> waiting_for_map_;
  std::deque<Completion> done_;  // finished, not yet handed out by do_poll
  std::size_t outstanding_ = 0;  // submitted, not yet handed out by do_poll
};

}  // namespace tier::redis
