#pragma once
// DeviceTransfer: how a pinned mode moves images between its page-locked pieces and device memory
// (kind kDevice regions). The interface needs no GPU runtime header, so the tier's host side
// (cpu_backend.cpp, shm_mode.cpp) calls it in every build; PinnedTransfer (pinned_transfer.hpp)
// implements it, in builds with a GPU runtime only.
//
// Errors: NotSupported, InvalidArgument, ChecksumMismatch, DeviceError; nothing throws. Threads:
// the tier's owner thread only.

#include <span>

#include "cpu_mode.hpp"
#include "tier/key.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier::cpu {

class DeviceTransfer {
 public:
  virtual ~DeviceTransfer() = default;

  // A put from device memory: copies `src` (kind kDevice, exactly the image) into `pieces` and
  // waits for it; then checks what check_request() checks for host images (an object header that
  // names `key` and declares at most the image's length).
  // Returns: Ok, InvalidArgument (bad header), DeviceError.
  virtual Status put_from_device(std::span<const Piece> pieces, Region src,
                                 const ObjectKey& key) noexcept = 0;

  // A get into device memory: copies the stored image held by `pieces` into `dst` (kind kDevice,
  // at least the image's size), verifying it on the way like copy_verified (header, `key`, exact
  // length, payload checksum). On a mismatch the destination's header is zeroed before this
  // returns, so the device never holds a valid-looking copy of a corrupt object; nothing is
  // copied at all when the header or key is wrong. Returns when the copy has finished.
  // Returns: Ok, ChecksumMismatch, DeviceError.
  virtual Status get_to_device(Region dst, std::span<const Piece> pieces,
                               const ObjectKey& key) noexcept = 0;
};

}  // namespace tier::cpu
