#pragma once
// The remote tier: objects in a Redis server or a Redis Cluster shared by many engine nodes.
//
// Threads: the backend owns a boost::asio::io_context run by one internal I/O thread. submit()
// (owner thread) turns requests into RESP commands and posts them to the I/O thread; every reply,
// timeout or connection failure becomes a Completion pushed into a mutex-guarded queue that
// poll() drains on the owner's thread, waiting on a condition variable as poll()'s `min` and
// `wait` say. Handlers on the I/O thread never call user code.
//
// Commands: put = SET key image NX [PX ttl] (AlreadyExists when the key exists; recency is the
// server's business), get = GET (streamed into the caller's buffer), contains = STRLEN,
// remove = UNLINK. Keys are formed by redis_key() (redis_config.hpp; docs/remote.md).
//
// Faults never block the caller beyond the configured timeout: a request with no reply within
// `timeout` ends with TimedOut, a request for a server that is down ends at once with IoError, and
// connections come back by themselves with backoff. The server being down when the backend is
// created is not an error: create() succeeds and the connections keep trying in the background.
//
// Capacity: a shared store's memory is governed by the server (maxmemory and its eviction
// policy); the tier's capacity is advisory. usage() reports what this client knows: the image
// bytes and objects it stored successfully since it started (removals and server-side evictions
// by anyone are not seen). The backend never calls notify_evicted().
//
// Cluster mode: the slot map comes from CLUSTER SLOTS (at start, after a MOVED, after a lost
// connection); each key is routed by its CRC16 hash slot; MOVED updates the slot and retries,
// ASK retries once on the named node behind ASKING.

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "redis_config.hpp"
#include "redis_connection.hpp"
#include "tier/backend.hpp"

namespace tier::redis {

class RedisBackend final : public Backend, private ConnectionOwner {
 public:
  // Errors: InvalidArgument (bad options or url), NotSupported (rediss://). Never fails because
  // the server is unreachable.
  static Result<std::unique_ptr<RedisBackend>> create(const BackendContext& ctx);
  RedisBackend(std::string tier_name, std::uint64_t capacity, RedisConfig cfg);
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

  // I/O thread only below.
  void complete(RequestPtr r, Status s, std::size_t bytes) override;
  void redirect(RequestPtr r, bool ask, std::uint16_t slot, std::string_view address) override;
  void connection_lost(const Status& why) override;
  void drain_submissions();
  void dispatch(RequestPtr r);
  void send_to(Node& node, RequestPtr r);
  Node& node_for(const Endpoint& endpoint);
  Connection* pick(Node& node);
  void refresh_map();
  void retry_refresh_later();
  void apply_slot_map(const Reply& reply, const Endpoint& from);
  void sweep();

  RedisConfig cfg_;
  std::uint64_t capacity_;
  std::string put_tail_;  // the SET command after the value: "\r\n" NX [PX ms]
  RedisStats stats_;
  Counter stored_bytes_;
  Counter stored_objects_;

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::steady_timer sweep_timer_;
  boost::asio::steady_timer refresh_timer_;
  std::chrono::microseconds sweep_interval_;
  std::vector<std::unique_ptr<Node>> nodes_;  // nodes_[0] is the seed
  std::vector<Node*> slots_;                  // cluster: slot -> master; nullptr = unknown
  bool refreshing_ = false;
  bool refresh_again_ = false;
  bool refresh_timer_armed_ = false;
  std::size_t refresh_next_ = 0;
  std::deque<RequestPtr> waiting_for_map_;
  bool wake_posted_ = false;  // a flush of completions to a waiting poller is queued

  std::mutex submit_mu_;  // owner thread -> I/O thread
  std::vector<RequestPtr> submitted_;
  bool drain_posted_ = false;

  std::mutex done_mu_;  // I/O thread -> owner thread
  std::condition_variable done_cv_;
  std::deque<Completion> done_;
  bool poller_waiting_ = false;

  std::size_t outstanding_ = 0;  // owner thread: submitted, not yet handed out by do_poll
  std::thread thread_;           // last: started after everything above exists
};

}  // namespace tier::redis
