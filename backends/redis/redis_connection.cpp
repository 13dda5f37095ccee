#include "redis_connection.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <charconv>
#include <cstring>
#include <limits>

#if TIER_REDIS_TLS
#include "redis_tls.hpp"
#include "tier/log.hpp"
#endif

namespace tier::redis {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

constexpr std::size_t kMaxWriteBuffers = 192;  // gathered per async_write (3 per SET)
constexpr std::size_t kMaxWriteBytes = 8 << 20;
constexpr int kSocketBuffer = 4 << 20;
constexpr std::string_view kAsking = "*1\r\n$6\r\nASKING\r\n";

std::int64_t ms(std::chrono::microseconds d) { return d.count() / 1000; }

const char* command_of(const Request& r) {
  if (r.command != nullptr) return r.command;
  switch (r.op) {
    case Op::kPut:
      return "SET";
    case Op::kGet:
      return "GET";
    case Op::kContains:
      return "STRLEN";
    case Op::kRemove:
      return "UNLINK";
  }
  return "?";
}

// Written by the owner thread only, read from any.
void raise_to(Counter& peak, std::uint64_t v) {
  if (v > peak.get()) peak.v.store(v, std::memory_order_relaxed);
}

// Completion condition of async_write/async_read: everything, with no cap per system call.
// Asio's transfer_all moves at most 64 KiB per call, so a SET of a 64 KiB value took two sendmsg
// calls with a trip through the handler queue between them, and the server could not start the
// command before the second (64 KiB puts: 0.78-0.97x redis-benchmark that way).
struct TransferAll {
  std::size_t operator()(const error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : std::numeric_limits<std::size_t>::max();
  }
};

}  // namespace

Connection::Connection(asio::io_context& io, Endpoint endpoint, const RedisConfig& cfg,
                       ConnectionOwner& owner, RedisStats& stats, TlsContext* tls)
    : endpoint_(std::move(endpoint)),
      cfg_(cfg),
      owner_(owner),
      stats_(stats),
      socket_(io),
      tls_ctx_(tls),
      resolver_(io),
      backoff_timer_(io),
      backoff_(cfg.backoff_min),
      rbuf_(kReadBufferBytes) {
  raise_to(stats_.read_buffer_peak, rbuf_.size());
}

void Connection::connect() {
  if (state_ != State::kIdle) return;
  state_ = State::kConnecting;
  connect_deadline_ = Clock::now() + cfg_.connect_timeout;
  const std::uint64_t g = ++gen_;
#if TIER_REDIS_TLS
  if (tls_ctx_ != nullptr) {
    // A stream per attempt: the one of a failed attempt lives on in its aborted handlers.
    tls_ = std::make_shared<TlsStream>(socket_.get_executor(), *tls_ctx_);
    if (Status s = prepare_tls_stream(*tls_, tls_ctx_->config, endpoint_.host); !s) {
      fail(Status::io_error(fmt::format("redis {}: {}", endpoint_.address(), s.message())));
      return;
    }
  }
#endif
  auto on_connect = [this, g](const error_code& ec) {
    if (g != gen_) return;
    if (ec) {
      fail(Status::io_error(
          fmt::format("redis {}: connect failed: {}", endpoint_.address(), ec.message())));
      return;
    }
    on_tcp_connected();
  };
  error_code ec;
  auto addr = asio::ip::make_address(endpoint_.host, ec);
  if (!ec) {
    socket().async_connect(asio::ip::tcp::endpoint(addr, endpoint_.port), on_connect);
    return;
  }
  resolver_.async_resolve(
      endpoint_.host, std::to_string(endpoint_.port),
      [this, g, on_connect](const error_code& rec, asio::ip::tcp::resolver::results_type results) {
        if (g != gen_) return;
        if (rec) {
          fail(Status::io_error(
              fmt::format("redis {}: cannot resolve: {}", endpoint_.address(), rec.message())));
          return;
        }
        asio::async_connect(socket(), results,
                            [on_connect](const error_code& cec, const asio::ip::tcp::endpoint&) {
                              on_connect(cec);
                            });
      });
}

asio::ip::tcp::socket& Connection::socket() noexcept {
#if TIER_REDIS_TLS
  if (tls_) return tls_->stream.next_layer();
#endif
  return socket_;
}

template <class F>
void Connection::with_stream(F&& f) {
#if TIER_REDIS_TLS
  if (tls_) {
    f(tls_->stream, tls_);
    return;
  }
#endif
  f(socket_, nullptr);
}

void Connection::on_tcp_connected() {
  error_code ec;
  socket().set_option(asio::ip::tcp::no_delay(true), ec);
  // Room for a whole large value in the kernel, so a SET is handed over in one write. The
  // receive side keeps the kernel's autotuning.
  socket().set_option(asio::socket_base::send_buffer_size(kSocketBuffer), ec);
#if TIER_REDIS_TLS
  if (tls_) {
    // Still connecting: the handshake counts against connect_timeout (check_deadlines).
    const std::uint64_t g = gen_;
    tls_->stream.async_handshake(asio::ssl::stream_base::client, [this, g, keep = tls_](
                                                                     const error_code& hec) {
      if (g != gen_) return;
      if (hec) {
        fail(Status::io_error(fmt::format("redis {}: TLS handshake failed: {}", endpoint_.address(),
                                          tls_handshake_error(*keep, hec))));
        return;
      }
      on_connected();
    });
    return;
  }
#endif
  on_connected();
}

void Connection::on_connected() {
  state_ = State::kReady;
  stats_.connects.add();
  // The handshake has its own connect_timeout from here: the owner may have driven the connect's
  // completion late (handlers run only inside submit and poll).
  connect_deadline_ = Clock::now() + cfg_.connect_timeout;
  push_handshake();
  start_read();
  maybe_write();
}

void Connection::push_handshake() {
  std::vector<RequestPtr> hs;
  auto control = [&](std::string head, const char* what) {
    auto r = std::make_unique<Request>();
    r->head = std::move(head);
    r->deadline = connect_deadline_;
    r->command = what;
    r->on_reply = [this, what](const Status& s, Reply& reply) {
      if (!s) return;  // the connection is already failing
      if (reply.type == Reply::Type::kError)
        fail(Status::io_error(
            fmt::format("redis {}: {} failed: {}", endpoint_.address(), what, reply.str)));
    };
    hs.push_back(std::move(r));
  };
  if (!cfg_.password.empty()) {
    if (cfg_.username.empty())
      control(encode_command({"AUTH", cfg_.password}), "AUTH");
    else
      control(encode_command({"AUTH", cfg_.username, cfg_.password}), "AUTH");
  }
  if (cfg_.db != 0 && cfg_.mode == Mode::kSingle)
    control(encode_command({"SELECT", std::to_string(cfg_.db)}), "SELECT");
  // A PING ends the handshake: its reply proves the server answers, and resets the backoff.
  auto ping = std::make_unique<Request>();
  ping->head = encode_command({"PING"});
  ping->deadline = connect_deadline_;
  ping->command = "PING";
  ping->on_reply = [this](const Status& s, Reply& reply) {
    if (!s) return;
    if (reply.type == Reply::Type::kError) {
      fail(Status::io_error(fmt::format("redis {}: {}", endpoint_.address(), reply.str)));
      return;
    }
    backoff_ = cfg_.backoff_min;
  };
  hs.push_back(std::move(ping));
  for (auto it = hs.rbegin(); it != hs.rend(); ++it) wq_.push_front(std::move(*it));
}

void Connection::enqueue(RequestPtr r) {
  if (state_ == State::kBackoff) {
    stats_.fast_failures.add();
    owner_.complete(std::move(r),
                    Status::io_error(
                        fmt::format("redis {}: not connected (reconnecting)", endpoint_.address())),
                    0);
    return;
  }
  wq_.push_back(std::move(r));
  if (state_ == State::kIdle) connect();
  maybe_write();
}

void Connection::fail(const Status& why) {
  const bool was_ready = state_ == State::kReady;
  ++gen_;
  error_code ec;
  socket().close(ec);
  resolver_.cancel();
  writing_ = false;
  streaming_ = false;
  rpos_ = rend_ = 0;
  state_ = State::kBackoff;
  (was_ready ? stats_.disconnects : stats_.connect_failures).add();
  if (log_enabled(LogLevel::kWarn))  // on the I/O thread (docs/logging.md)
    log(LogLevel::kWarn, fmt::format("redis {}: {}: {}; retrying in {} ms", endpoint_.address(),
                                     was_ready ? "connection lost" : "cannot connect",
                                     why.message(), ms(backoff_)));

  const std::uint64_t g = gen_;
  backoff_timer_.expires_after(backoff_);
  backoff_timer_.async_wait([this, g](const error_code& tec) {
    if (tec || g != gen_ || state_ != State::kBackoff) return;
    state_ = State::kIdle;
    connect();
  });
  backoff_ = std::min(backoff_ * 2, cfg_.backoff_max);

  std::deque<RequestPtr> reqs = std::move(inflight_);
  inflight_.clear();
  for (auto& r : wq_) reqs.push_back(std::move(r));
  wq_.clear();
  Reply none;
  for (auto& r : reqs) {
    if (r->on_reply)
      r->on_reply(why, none);
    else
      owner_.complete(std::move(r), why, 0);
  }
  owner_.connection_lost(why);
}

void Connection::check_deadlines(Clock::time_point now) {
  if (state_ == State::kConnecting) {
    if (now >= connect_deadline_) {
      fail(Status(Code::kTimedOut, fmt::format("redis {}: connect timed out after {} ms",
                                               endpoint_.address(), ms(cfg_.connect_timeout))));
      return;
    }
    // Requests waiting for the connection time out one by one; the attempt goes on.
    for (auto it = wq_.begin(); it != wq_.end();) {
      if ((*it)->deadline > now || (*it)->on_reply) {
        ++it;
        continue;
      }
      RequestPtr r = std::move(*it);
      it = wq_.erase(it);
      owner_.complete(std::move(r),
                      Status(Code::kTimedOut, fmt::format("redis {}: still connecting after {} ms",
                                                          endpoint_.address(), ms(cfg_.timeout))),
                      0);
    }
    return;
  }
  if (state_ != State::kReady) return;
  bool late = (!inflight_.empty() && inflight_.front()->deadline <= now) ||
              (!wq_.empty() && wq_.front()->deadline <= now);
  if (!late) return;
  stats_.timeouts.add();
  fail(Status(Code::kTimedOut, fmt::format("redis {}: no reply within {} ms", endpoint_.address(),
                                           ms(cfg_.timeout))));
}

void Connection::maybe_write() {
  if (writing_ || state_ != State::kReady || wq_.empty()) return;
  write_bufs_.clear();
  std::size_t bytes = 0;
  while (!wq_.empty() && write_bufs_.size() + 4 <= kMaxWriteBuffers && bytes < kMaxWriteBytes) {
    Request& r = *wq_.front();
    if (r.asking) write_bufs_.emplace_back(kAsking.data(), kAsking.size());
    write_bufs_.emplace_back(r.head.data(), r.head.size());
    bytes += r.head.size();
    if (r.value != nullptr) {
      write_bufs_.emplace_back(r.value, r.value_bytes);
      write_bufs_.emplace_back(r.tail.data(), r.tail.size());
      bytes += r.value_bytes + r.tail.size();
    }
    inflight_.push_back(std::move(wq_.front()));
    wq_.pop_front();
  }
  writing_ = true;
  if (tls_) {
    // One TLS record per buffer would be one system call per command head: copy the batch into
    // one buffer instead (encryption copies it anyway).
    tls_out_.clear();
    for (const auto& b : write_bufs_) tls_out_.append(static_cast<const char*>(b.data()), b.size());
    write_bufs_.assign(1, asio::const_buffer(tls_out_.data(), tls_out_.size()));
  }
  const std::uint64_t g = gen_;
  with_stream([&](auto& stream, auto keep) {
    asio::async_write(
        stream, write_bufs_, TransferAll{}, [this, g, keep](const error_code& ec, std::size_t) {
          if (g != gen_) return;
          writing_ = false;
          if (ec) {
            fail(Status::io_error(
                fmt::format("redis {}: write failed: {}", endpoint_.address(), ec.message())));
            return;
          }
          maybe_write();
        });
  });
}

void Connection::start_read() {
  const std::uint64_t g = gen_;
  if (streaming_ && stream_fits_ && stream_left_ > 0 && rpos_ == rend_) {
    // The rest of a large value goes straight into the caller's buffer.
    with_stream([&](auto& stream, auto keep) {
      asio::async_read(stream, asio::buffer(stream_dst_, stream_left_), TransferAll{},
                       [this, g, keep](const error_code& ec, std::size_t n) {
                         if (g != gen_) return;
                         if (ec) {
                           fail(Status::io_error(fmt::format("redis {}: read failed: {}",
                                                             endpoint_.address(), ec.message())));
                           return;
                         }
                         stream_dst_ += n;
                         stream_left_ -= n;
                         read_done(g);
                       });
    });
    return;
  }
  if (rpos_ == rend_) {
    rpos_ = rend_ = 0;
  } else if (rpos_ > 0 && rend_ == rbuf_.size()) {
    std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
    rend_ -= rpos_;
    rpos_ = 0;
  }
  if (rend_ == rbuf_.size()) {
    // The buffer holds part of one reply only (pipelined replies come after it): it grows for a
    // reply whose limits allow more (CLUSTER SLOTS), up to them; the parser has refused any other.
    std::size_t cap = inflight_.empty() ? 0 : inflight_.front()->limits.max_bytes + kReplyFraming;
    if (cap <= rbuf_.size()) {
      protocol_failure(Status::io_error(
          fmt::format("redis protocol error: reply over {} bytes without an end", rbuf_.size())));
      return;
    }
    rbuf_.resize(std::min(rbuf_.size() * 2, cap));
    raise_to(stats_.read_buffer_peak, rbuf_.size());
  }
  with_stream([&](auto& stream, auto keep) {
    stream.async_read_some(
        asio::buffer(rbuf_.data() + rend_, rbuf_.size() - rend_),
        [this, g, keep](const error_code& ec, std::size_t n) {
          if (g != gen_) return;
          if (ec) {
            fail(Status::io_error(fmt::format("redis {}: {}", endpoint_.address(),
                                              ec == asio::error::eof
                                                  ? std::string("server closed the connection")
                                                  : "read failed: " + ec.message())));
            return;
          }
          rend_ += n;
          read_done(g);
        });
  });
}

void Connection::read_done(std::uint64_t g) {
  process();
  if (g != gen_) return;
  // A reply still incomplete after a read is checked against its deadline here too: poll() runs
  // ready handlers back to back, so a server that keeps sending would never let it sweep.
  if ((streaming_ || rpos_ != rend_) && !inflight_.empty() &&
      Clock::now() >= inflight_.front()->deadline) {
    stats_.timeouts.add();
    fail(
        Status(Code::kTimedOut,
               fmt::format("redis {}: reply to {} still incomplete at its deadline ({} ms)",
                           endpoint_.address(), command_of(*inflight_.front()), ms(cfg_.timeout))));
    return;
  }
  start_read();
}

void Connection::protocol_failure(const Status& why) {
  stats_.protocol_errors.add();
  fail(Status(why.code(), fmt::format("redis {}: {}{}{}", endpoint_.address(), why.message(),
                                      inflight_.empty() ? "" : ", in the reply to ",
                                      inflight_.empty() ? "" : command_of(*inflight_.front()))));
}

void Connection::finish_stream() {
  streaming_ = false;
  RequestPtr r = std::move(inflight_.front());
  inflight_.pop_front();
  Status s = stream_fits_ ? Status::ok()
                          : Status::invalid(fmt::format("buffer of {} bytes is too small for {}",
                                                        r->dst_bytes, stream_total_));
  owner_.complete(std::move(r), std::move(s), stream_total_);
}

void Connection::process() {
  const std::uint64_t g = gen_;
  while (g == gen_) {
    if (streaming_) {
      std::size_t avail = rend_ - rpos_;
      std::size_t n = std::min(avail, stream_left_);
      if (n > 0) {
        if (stream_fits_) {
          std::memcpy(stream_dst_, rbuf_.data() + rpos_, n);
          stream_dst_ += n;
        }
        rpos_ += n;
        stream_left_ -= n;
        avail -= n;
      }
      if (stream_left_ > 0) return;
      std::size_t c = std::min(avail, stream_crlf_);
      rpos_ += c;
      stream_crlf_ -= c;
      if (stream_crlf_ > 0) return;
      finish_stream();
      continue;
    }
    if (rpos_ == rend_) return;
    if (inflight_.empty()) {
      protocol_failure(Status::io_error("redis protocol error: reply without a request"));
      return;
    }
    Request& front = *inflight_.front();
    std::string_view in(rbuf_.data() + rpos_, rend_ - rpos_);
    if (!front.asking && !front.on_reply && front.op == Op::kGet && in[0] == '$') {
      std::int64_t len = 0;
      auto n = parse_integer_line(in.substr(1), len);
      if (!n) {
        protocol_failure(n.status());
        return;
      }
      if (*n == 0) return;
      const std::uint64_t bound = std::max<std::uint64_t>(front.dst_bytes, cfg_.max_object_bytes);
      if (len > 0 && static_cast<std::uint64_t>(len) > bound) {
        protocol_failure(Status::io_error(fmt::format(
            "redis protocol error: value of {} bytes is over the limit of {} bytes", len, bound)));
        return;
      }
      rpos_ += 1 + *n;
      if (len < 0) {
        RequestPtr r = std::move(inflight_.front());
        inflight_.pop_front();
        owner_.complete(std::move(r), Status::not_found(), 0);
        continue;
      }
      streaming_ = true;
      stream_total_ = static_cast<std::size_t>(len);
      stream_left_ = stream_total_;
      stream_crlf_ = 2;
      stream_fits_ = stream_total_ <= front.dst_bytes;
      stream_dst_ = front.dst;
      continue;
    }
    Reply reply;
    auto n = parse_reply(in, reply, front.limits);
    if (!n) {
      protocol_failure(n.status());
      return;
    }
    if (*n == 0) return;
    rpos_ += *n;
    if (front.asking) {  // the reply to ASKING
      front.asking = false;
      if (reply.type != Reply::Type::kError) continue;
    }
    RequestPtr r = std::move(inflight_.front());
    inflight_.pop_front();
    handle_reply(std::move(r), reply);
  }
}

void Connection::handle_reply(RequestPtr r, Reply& reply) {
  if (r->on_reply) {
    r->on_reply(Status::ok(), reply);
    return;
  }
  using T = Reply::Type;
  if (reply.type == T::kError) {
    std::string_view e = reply.str;
    bool moved = e.starts_with("MOVED "), ask = e.starts_with("ASK ");
    if (moved || ask) {
      // "MOVED <slot> <host>:<port>"
      std::string_view rest = e.substr(moved ? 6 : 4);
      std::size_t sp = rest.find(' ');
      unsigned slot = 0;
      auto [p, ec] = std::from_chars(rest.data(), rest.data() + std::min(sp, rest.size()), slot);
      if (sp != std::string_view::npos && ec == std::errc() && slot < kClusterSlots) {
        owner_.redirect(std::move(r), ask, static_cast<std::uint16_t>(slot), rest.substr(sp + 1));
        return;
      }
    }
    owner_.complete(std::move(r),
                    Status::io_error(fmt::format("redis {}: {}", endpoint_.address(), e)), 0);
    return;
  }
  const Op op = r->op;
  switch (op) {
    case Op::kPut:
      if (reply.type == T::kSimple) {
        std::size_t bytes = r->value_bytes;
        owner_.complete(std::move(r), Status::ok(), bytes);
      } else if (reply.type == T::kNil) {
        owner_.complete(std::move(r), Status(Code::kAlreadyExists, ""), 0);
      } else {
        break;
      }
      return;
    case Op::kGet:
      if (reply.type != T::kNil) break;
      owner_.complete(std::move(r), Status::not_found(), 0);
      return;
    case Op::kContains:
    case Op::kRemove:
      if (reply.type != T::kInteger) break;
      if (reply.integer > 0)
        owner_.complete(std::move(r), Status::ok(),
                        op == Op::kContains ? static_cast<std::size_t>(reply.integer) : 0);
      else
        owner_.complete(std::move(r), Status::not_found(), 0);
      return;
  }
  owner_.complete(std::move(r),
                  Status::io_error(fmt::format("redis {}: unexpected reply to {}",
                                               endpoint_.address(), op_name(op))),
                  0);
}

}  // namespace tier::redis
