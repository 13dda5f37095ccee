#pragma once
// FaultInjectingBackend: a "faulty" backend for tests that wraps a real cpu tier and, under the
// test's control, fails removes, puts or gets, rewrites images on their way in (to plant corrupt
// objects), acknowledges puts without storing them, or hides stored objects from contains and get
// (acknowledged but not yet visible). Every request is counted per op and can be observed in
// order. Register once with register_faulty_backend(); all instances share fault_control().

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "tier/object.hpp"
#include "tier/plugin.hpp"
#include "tier/registry.hpp"

namespace tier::test {

struct FaultControl {
  bool fail_remove = false;  // removes complete with IoError and leave the object in place
  // Puts of keys it returns true for complete with IoError and store nothing.
  std::function<bool(const ObjectKey&)> fail_put;
  // Gets of keys it returns true for complete with IoError (a storage I/O failure).
  std::function<bool(const ObjectKey&)> fail_get;
  // Puts of keys it returns true for complete Ok but store nothing (a store that skips silently).
  std::function<bool(const ObjectKey&)> drop_put;
  // Contains and gets of keys it returns true for complete NotFound although the object may be
  // stored (not visible yet). Called once per such request, so it can count probes.
  std::function<bool(const ObjectKey&)> hide;
  // Puts of keys it returns true for are taken but not passed on (no completion) while it keeps
  // returning true: asked again at every poll, the put goes to the inner tier once it returns
  // false. A put held this way is a tier that has not answered yet.
  std::function<bool(const ObjectKey&)> hold_put;
  // The same for gets: a get held this way is a read that has not finished yet.
  std::function<bool(const ObjectKey&)> hold_get;
  // Called with each put's image (a private copy) before the inner tier stores it.
  std::function<void(const ObjectKey&, std::vector<std::byte>&)> mutate_put;
  // Called with every request the tier takes, in submission order.
  std::function<void(Op, const ObjectKey&)> observe;
  // Called with the number of requests of each call into the tier's submit (at most the base
  // class's window of 16).
  std::function<void(std::size_t)> observe_submit;
  // Called with the number of requests of the same submit after each such call's (the base
  // class's submit_rest()).
  std::function<void(std::size_t)> observe_rest;
  // Called with each put's and get's IoRequest::batch_bytes, in submission order.
  std::function<void(std::uint64_t)> observe_batch_bytes;
  // capabilities() hides the inner tier's seals_puts, so a stack that opens the tier while it is
  // set hashes its gathered puts itself (this tier still seals them, to the same checksum).
  bool unsealed = false;
  // Requests seen, per op: counted by every rank's thread (engine tests run ranks as threads).
  std::array<std::atomic<std::uint64_t>, kOpCount> ops{};
  void reset() {
    fail_remove = false;
    fail_put = fail_get = drop_put = hide = hold_put = hold_get = nullptr;
    mutate_put = nullptr;
    observe = nullptr;
    observe_submit = nullptr;
    observe_rest = nullptr;
    observe_batch_bytes = nullptr;
    unsealed = false;
    for (auto& n : ops) n = 0;
  }
  std::uint64_t count(Op op) const { return ops[static_cast<std::size_t>(op)].load(); }
};

inline FaultControl& fault_control() {
  static FaultControl control;
  return control;
}

class FaultInjectingBackend final : public Backend {
 public:
  static Result<std::unique_ptr<FaultInjectingBackend>> create(const BackendContext& ctx) {
    BackendContext inner_ctx{ctx.tier_name + ".inner", ctx.capacity_bytes, Json{{"mode", "heap"}}};
    auto inner = Registry::global().create_backend("cpu", inner_ctx);
    if (!inner) return inner.status();
    return std::make_unique<FaultInjectingBackend>(ctx.tier_name, std::move(inner).value());
  }
  FaultInjectingBackend(std::string name, PluginPtr<Backend> inner)
      : Backend(std::move(name)), inner_(std::move(inner)) {}

  Capabilities capabilities() const noexcept override {
    Capabilities c = inner_->capabilities();
    c.concurrent = false;  // its own queues are one thread's
    if (fault_control().unsealed) c.seals_puts = false;
    return c;
  }
  Usage usage() const noexcept override { return inner_->usage(); }

 protected:
  Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept override {
    FaultControl& fc = fault_control();
    if (fc.observe_submit) fc.observe_submit(reqs.size());
    if (fc.observe_rest) fc.observe_rest(submit_rest().size());
    std::size_t n = 0;
    auto taken = [&](const IoRequest& r) {
      ++fc.ops[static_cast<std::size_t>(r.op)];
      if (fc.observe) fc.observe(r.op, r.key);
      if (fc.observe_batch_bytes && (r.op == Op::kPut || r.op == Op::kGet))
        fc.observe_batch_bytes(r.batch_bytes);
    };
    for (const IoRequest& r : reqs) {
      IoRequest fwd = r;
      const bool probe = r.op == Op::kContains || r.op == Op::kGet;
      if ((r.op == Op::kRemove && fc.fail_remove) ||
          (r.op == Op::kPut && fc.fail_put && fc.fail_put(r.key)) ||
          (r.op == Op::kGet && fc.fail_get && fc.fail_get(r.key))) {
        taken(r);
        ready_.push_back({r.user_data, Status::io_error("injected failure"), 0});
        ++n;
        continue;
      }
      if ((probe && fc.hide && fc.hide(r.key)) ||
          (r.op == Op::kPut && fc.drop_put && fc.drop_put(r.key))) {
        taken(r);
        ready_.push_back(probe ? Completion{r.user_data, Status::not_found(), 0}
                               : Completion{r.user_data, Status::ok(), r.buf.size});
        ++n;
        continue;
      }
      if (r.op == Op::kPut && (fc.mutate_put || !r.tail.empty())) {
        // The whole image, also of a gather put (header in buf, payload in the tail regions),
        // copied now as gather_puts promises (a held put is submitted later) and sealed as the
        // inner tier's seals_puts promises.
        auto copy = std::make_unique<std::vector<std::byte>>(r.buf.data, r.buf.data + r.buf.size);
        if (!r.tail.empty()) {
          copy->resize(r.buf.size + total_bytes(r.tail));
          std::span<std::byte> image(*copy);
          if (Status s = seal_into(std::span(&image, 1), r.buf.bytes(), r.tail); !s) {
            taken(r);  // refused as the inner tier would refuse it: this request fails alone
            ready_.push_back({r.user_data, std::move(s), 0});
            ++n;
            continue;
          }
        }
        if (fc.mutate_put) fc.mutate_put(r.key, *copy);
        fwd.buf = host_region(*copy);
        fwd.tail = {};
        copies_[r.user_data] = std::move(copy);
      }
      if (held(r)) {
        taken(r);
        held_.push_back(fwd);
        ++n;
        continue;
      }
      auto accepted = inner_->submit(std::span(&fwd, 1));
      if (!accepted) return accepted.status();
      if (*accepted == 0) {
        copies_.erase(r.user_data);
        break;
      }
      taken(r);
      ++n;
    }
    return n;
  }
  Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                              std::chrono::microseconds wait) noexcept override {
    for (std::size_t i = 0; i < held_.size();) {
      if (held(held_[i])) {
        ++i;
        continue;
      }
      auto accepted = inner_->submit(std::span(&held_[i], 1));
      if (!accepted || *accepted == 0) break;
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (!held_.empty()) wait = std::chrono::microseconds(0);  // a held request never completes here
    std::size_t n = std::min(out.size(), ready_.size());
    for (std::size_t i = 0; i < n; ++i) out[i] = ready_[i];
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
    if (n < out.size() && inner_->in_flight() > 0) {
      auto m = inner_->poll(out.subspan(n), min > n ? min - n : 0, n > 0 ? std::chrono::microseconds(0) : wait);
      if (!m) return m.status();
      for (std::size_t i = n; i < n + *m; ++i) copies_.erase(out[i].user_data);
      n += *m;
    }
    return n;
  }

 private:
  // Whether FaultControl holds `r` back now (hold_put, hold_get).
  static bool held(const IoRequest& r) {
    const FaultControl& fc = fault_control();
    return (r.op == Op::kPut && fc.hold_put && fc.hold_put(r.key)) ||
           (r.op == Op::kGet && fc.hold_get && fc.hold_get(r.key));
  }

  PluginPtr<Backend> inner_;
  std::vector<Completion> ready_;
  std::vector<IoRequest> held_;  // requests held by FaultControl::hold_put and hold_get
  std::map<std::uint64_t, std::unique_ptr<std::vector<std::byte>>> copies_;
};

inline void register_faulty_backend() {
  static constexpr tier_plugin kFaulty = make_backend_plugin<FaultInjectingBackend>(
      "faulty", "cpu tier with injectable faults (tests)", "[]");
  static const bool once = [] {
    Registry::global().add(&kFaulty, "test").ignore();
    return true;
  }();
  (void)once;
}

}  // namespace tier::test
