#include "tier/status.hpp"

#include <fmt/format.h>

#include "tier/region.hpp"

namespace tier {

std::string_view code_name(Code code) noexcept {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kNotFound: return "not_found";
    case Code::kRejected: return "rejected";
    case Code::kRetry: return "retry";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kNotSupported: return "not_supported";
    case Code::kIoError: return "io_error";
    case Code::kDeviceError: return "device_error";
    case Code::kChecksumMismatch: return "checksum_mismatch";
    case Code::kCancelled: return "cancelled";
    case Code::kTimedOut: return "timed_out";
    case Code::kBadState: return "bad_state";
    case Code::kAlreadyExists: return "already_exists";
    case Code::kNoSpace: return "no_space";
  }
  return "unknown";
}

Status::Status(Code code, std::string message) : code_(code) {
  if (code != Code::kOk && !message.empty())
    msg_ = std::make_shared<const std::string>(std::move(message));
}

std::string Status::to_string() const {
  if (!msg_) return std::string(code_name(code_));
  return fmt::format("{}: {}", code_name(code_), *msg_);
}

std::string_view memory_kind_name(MemoryKind k) noexcept {
  switch (k) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kPinnedHost: return "pinned_host";
    case MemoryKind::kDevice: return "device";
    case MemoryKind::kShm: return "shm";
  }
  return "unknown";
}

}  // namespace tier
