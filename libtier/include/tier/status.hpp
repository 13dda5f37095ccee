#pragma once
// Status and Result<T>: the error vocabulary of libtier's data path.
//
// A Status is a code plus an optional message. An OK status allocates nothing; an error status
// shares one immutable message string, so copying it is cheap. Codes have stable numbers because
// they cross the plugin C ABI (tier/plugin.h) and appear in metrics and logs.
//
// Result<T> holds either a value or a non-OK Status. It is a small, C++20-compatible stand-in for
// std::expected (libtier builds as C++20 so that nvcc and hipcc can include its headers).
// Nothing on the data path throws; constructors and config parsing may throw internally, and the
// plugin factories translate those exceptions into a Status at the edge.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tier {

enum class Code : std::uint8_t {
  kOk = 0,
  kNotFound = 1,          // the key is not stored (a miss)
  kRejected = 2,          // refused by policy: fenced key, full queue, admission
  kRetry = 3,             // transient; the same call may succeed later
  kInvalidArgument = 4,   // the caller's input is wrong (bad region, buffer too small, bad config)
  kNotSupported = 5,      // the backend or codec lacks this capability
  kIoError = 6,           // the medium failed (errno, socket, protocol)
  kDeviceError = 7,       // the GPU runtime failed
  kChecksumMismatch = 8,  // stored bytes failed verification; they are never handed out
  kCancelled = 9,
  kTimedOut = 10,
  kBadState = 11,         // the object is used in a state that does not allow the call
  kAlreadyExists = 12,    // put-if-absent found the key (not an error for a cache)
  kNoSpace = 13,          // capacity or the medium is full
};

// Stable lower-case name of a code ("ok", "not_found", ...), used in metrics and JSON.
std::string_view code_name(Code code) noexcept;

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  // OK
  Status(Code code, std::string message);

  static Status ok() noexcept { return {}; }
  static Status not_found(std::string m = {}) { return {Code::kNotFound, std::move(m)}; }
  static Status invalid(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status io_error(std::string m) { return {Code::kIoError, std::move(m)}; }

  bool is_ok() const noexcept { return code_ == Code::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  Code code() const noexcept { return code_; }
  std::string_view message() const noexcept {
    return msg_ ? std::string_view(*msg_) : std::string_view();
  }
  // "checksum_mismatch: <message>" or "ok".
  std::string to_string() const;
  // Marks a status as deliberately dropped (the counterpart of [[nodiscard]]).
  void ignore() const noexcept {}

  friend bool operator==(const Status& a, Code c) noexcept { return a.code_ == c; }

 private:
  Code code_ = Code::kOk;
  std::shared_ptr<const std::string> msg_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Status error) : v_(std::in_place_index<1>, std::move(error)) {  // NOLINT
    if (std::get<1>(v_).is_ok()) v_.template emplace<1>(Code::kBadState, "Result from an OK Status");
  }

  bool is_ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return is_ok(); }
  // The error; OK when a value is held.
  Status status() const { return is_ok() ? Status() : std::get<1>(v_); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  template <class U>
  T value_or(U&& fallback) const& {
    return is_ok() ? value() : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tier

// Returns a non-OK Status from the enclosing function.
#define TIER_RETURN_IF_ERROR(expr)                      \
  do {                                                  \
    ::tier::Status tier_status_ = (expr);               \
    if (!tier_status_.is_ok()) return tier_status_;     \
  } while (0)

#define TIER_CONCAT_INNER_(a, b) a##b
#define TIER_CONCAT_(a, b) TIER_CONCAT_INNER_(a, b)
// `TIER_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its error.
#define TIER_ASSIGN_OR_RETURN(lhs, expr)                                          \
  auto TIER_CONCAT_(tier_result_, __LINE__) = (expr);                             \
  if (!TIER_CONCAT_(tier_result_, __LINE__).is_ok())                              \
    return TIER_CONCAT_(tier_result_, __LINE__).status();                         \
  lhs = std::move(TIER_CONCAT_(tier_result_, __LINE__)).value()
