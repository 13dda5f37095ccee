#pragma once
// DeviceTransfer: how a pinned mode moves images between its page-locked pieces and device memory
// (kind kDevice regions). The interface needs no GPU runtime header, so the tier's host side
// (cpu_backend.cpp, shm/mode.cpp) calls it in every build; PinnedTransfer (pinned_transfer.hpp)
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

// How far DeviceTransfer::ahead() looks: a caller stops counting there, so a submit of many
// small gets costs each window a bounded look at the later ones, not all of them.
inline constexpr std::uint64_t kAheadHorizon = 16u << 20;

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

  // A scattered get into device memory (Capabilities::scatter_gets with a tail of kDevice regions
  // of one GPU): first checks the stored image held by `pieces` as check_scattered() does (the
  // caller's expected header in `header`, `key`, exact length, a payload of exactly `skip` + the
  // tail's bytes, the payload checksum on the verification threads, then `check`); only then
  // enqueues the copy of the payload after its first `skip` bytes into `payload` (one
  // copy-kernel launch per piece, reading the page-locked bytes).
  // Nothing is written when a check fails. Returns a ticket for scatter_done(); the pieces must
  // keep their bytes, and `header` and `payload` stay valid, until it reported the ticket done.
  // Returns: the ticket, InvalidArgument (layout, stage or size), ChecksumMismatch, DeviceError.
  virtual Result<std::uint64_t> scatter_to_device(std::span<const Piece> pieces,
                                                  std::span<std::byte> header, RegionList payload,
                                                  const ObjectKey& key, std::size_t skip,
                                                  const PayloadCheck* check) noexcept = 0;
  // Whether the copy of `ticket` has finished (`wait`: blocks until it has). When it has, the
  // stored header is written into the ticket's `header` and the ticket ends: Ok(true). Ok(false):
  // still copying. DeviceError: the copy failed (the payload regions hold unspecified bytes, the
  // header is untouched) and the ticket ends. An unknown ticket is InvalidArgument.
  virtual Result<bool> scatter_done(std::uint64_t ticket, bool wait) noexcept = 0;
  // Between plug() and unplug() the caller submits several scattered gets at once (one window of
  // a Backend::submit): they may wait to be enqueued together (fewer, larger transfers) rather
  // than each going at once. unplug(false) enqueues whatever waits; unplug(true) says that more
  // gets of the same submit follow in the next plug() (its next window): what waits stays open
  // for them (a poll or a later get enqueues it if none come). Nests not: the tier's submit calls
  // them.
  virtual void plug() noexcept = 0;
  virtual void unplug(bool more) noexcept = 0;
  // Inside plug(): the payload bytes of the submit's gets into device memory that follow the next
  // scatter_to_device(), in this window and later ones (0: it is the submit's last), so that
  // batches may be long in the middle of a submit and short at its end. Counted up to
  // kAheadHorizon: from there on it means at least that much.
  virtual void ahead(std::uint64_t bytes) noexcept = 0;
  // Waits for every copy still in flight (their tickets stay to be reported by scatter_done):
  // before any change that could move, free or overwrite stored bytes.
  virtual void quiesce() noexcept = 0;
};

}  // namespace tier::cpu
