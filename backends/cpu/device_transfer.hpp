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
  // at least the image's size) and verifies it like copy_verified (header, `key`, exact length,
  // payload checksum). Header, key and length are checked first: when they are wrong no image
  // byte is copied. Then the DMA of the whole image is enqueued at once and the payload is
  // verified on the host (tier::verify_payload, on the verification threads) while it runs.
  // Returns when the copy has finished and every chunk was verified: Ok only if both succeeded.
  // On ChecksumMismatch or DeviceError the destination's 96 header bytes are zeroed before this
  // returns, so the device never keeps a valid-looking copy of a corrupt object; the rest of the
  // destination is unspecified (it may hold the corrupt bytes, never reported as valid). Until
  // this returns, the destination's contents are unspecified whatever the result.
  // Returns: Ok, ChecksumMismatch, DeviceError, InvalidArgument (destination too small or on no
  // GPU: untouched).
  virtual Status get_to_device(Region dst, std::span<const Piece> pieces,
                               const ObjectKey& key) noexcept = 0;
};

}  // namespace tier::cpu
