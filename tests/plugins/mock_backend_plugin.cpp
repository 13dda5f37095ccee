// A backend plugin built outside the core, as a third party would: a tiny in-memory tier that
// can be told to fail every Nth request or to corrupt what it stores (fault injection over the
// real plugin path). Keys are told apart by their id's low word only, which is enough for tests.
#include <map>
#include <vector>

#include "tier/plugin.hpp"

namespace {

class MockBackend final : public tier::Backend {
 public:
  static tier::Result<std::unique_ptr<MockBackend>> create(const tier::BackendContext& ctx) {
    if (ctx.options.at("refuse_start").get<bool>())
      return tier::Status::invalid("asked to refuse to start");
    if (ctx.options.at("unsupported").get<bool>())
      return tier::Status(tier::Code::kNotSupported, "this machine lacks what the mock needs");
    return std::make_unique<MockBackend>(ctx);
  }
  explicit MockBackend(const tier::BackendContext& ctx)
      : Backend(ctx.tier_name),
        capacity_(ctx.capacity_bytes),
        fail_every_(ctx.options.at("fail_every").get<std::uint64_t>()),
        fail_op_(ctx.options.at("fail_op").get<std::string>()),
        corrupt_stored_(ctx.options.at("corrupt_stored").get<bool>()) {}

  tier::Capabilities capabilities() const noexcept override { return {}; }
  tier::Usage usage() const noexcept override { return {capacity_, used_, objects_.size()}; }

 protected:
  tier::Result<std::size_t> do_submit(std::span<const tier::IoRequest> reqs) noexcept override {
    for (const auto& r : reqs) {
      ++count_;
      if (fail_every_ && count_ % fail_every_ == 0 &&
          (fail_op_ == "any" || fail_op_ == tier::op_name(r.op))) {
        ready_.push_back({r.user_data, tier::Status::io_error("injected failure"), 0});
        continue;
      }
      auto it = objects_.find(r.key.id.lo);
      switch (r.op) {
        case tier::Op::kPut:
          if (it != objects_.end()) {
            ready_.push_back({r.user_data, tier::Status(tier::Code::kAlreadyExists, ""), 0});
          } else {
            auto& stored = objects_[r.key.id.lo];
            stored.assign(r.buf.data, r.buf.data + r.buf.size);
            if (corrupt_stored_) stored.back() ^= std::byte{0x20};  // bit rot at rest
            used_ += r.buf.size;
            ready_.push_back({r.user_data, tier::Status::ok(), r.buf.size});
          }
          break;
        case tier::Op::kGet:
          if (it == objects_.end()) {
            ready_.push_back({r.user_data, tier::Status::not_found(), 0});
          } else {
            std::copy(it->second.begin(), it->second.end(), r.buf.data);
            ready_.push_back({r.user_data, tier::Status::ok(), it->second.size()});
          }
          break;
        case tier::Op::kContains:
          ready_.push_back({r.user_data, it == objects_.end() ? tier::Status::not_found()
                                                              : tier::Status::ok(),
                            it == objects_.end() ? 0 : it->second.size()});
          break;
        case tier::Op::kRemove:
          if (it != objects_.end()) {
            used_ -= it->second.size();
            objects_.erase(it);
            ready_.push_back({r.user_data, tier::Status::ok(), 0});
          } else {
            ready_.push_back({r.user_data, tier::Status::not_found(), 0});
          }
          break;
      }
    }
    return reqs.size();
  }
  tier::Result<std::size_t> do_poll(std::span<tier::Completion> out, std::size_t,
                                    std::chrono::microseconds) noexcept override {
    std::size_t n = std::min(out.size(), ready_.size());
    for (std::size_t i = 0; i < n; ++i) out[i] = ready_[i];
    ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
    return n;
  }

 private:
  std::uint64_t capacity_, used_ = 0, count_ = 0, fail_every_;
  std::string fail_op_;
  bool corrupt_stored_;
  std::map<std::uint64_t, std::vector<std::byte>> objects_;
  std::vector<tier::Completion> ready_;
};

constexpr const char kOptions[] = R"JSON([
  {"name": "fail_every", "type": "uint", "default": 0,
   "doc": "fail every Nth request with IoError (0 = never)"},
  {"name": "fail_op", "type": "enum", "choices": ["any", "put", "get", "contains", "remove"],
   "default": "any", "doc": "which operation fail_every applies to"},
  {"name": "refuse_start", "type": "bool", "default": false, "doc": "make create() fail"},
  {"name": "unsupported", "type": "bool", "default": false,
   "doc": "make create() report not_supported, as a backend missing kernel or device support"},
  {"name": "corrupt_stored", "type": "bool", "default": false,
   "doc": "flip a bit of every stored object's last byte (corruption at rest)"}
])JSON";
constexpr tier_plugin kMock =
    tier::make_backend_plugin<MockBackend>("mock", "in-memory test backend (plugin)", kOptions);

}  // namespace

TIER_REGISTER_PLUGIN(mock, kMock)
