#pragma once
// The wire format of the messages between a scheduler process and its TP rank processes
// (docs/engine.md "Wire format" describes it byte by byte; "Ranks as processes" how to wire it).
//
//   scheduler process                              rank process r (one per TP rank)
//   bytes = encode_plan(scheduler.build_step())  -> plan = decode_plan(bytes); worker.submit(plan)
//   scheduler.process(decode_reports(bytes))     <- bytes = encode_reports(worker.take_reports())
//
// The reports are all the scheduler needs back: Scheduler::process turns every rank's reports
// into its loaded, load_failed and freeable lists (nothing else crosses for them).
//
// A message is a 24-byte header (magic "LTWM", format version, kind, body length, XXH3-64 of the
// body) and a body of sections (tag, flags, length, payload). Compatible additions never change
// the version: a new section a decoder does not know is skipped unless it is marked required
// (then the message is refused), and a record's fixed head says its own length, so fields
// appended to it are skipped by an older decoder. An incompatible change bumps kWireVersion,
// and a decoder refuses every version but its own.
//
// Decoding trusts nothing: the length, the checksum, every section, count and index are checked
// before use, and every allocation is bounded by the message's own size (a count is checked
// against the bytes that must hold it before anything is reserved). A truncated, corrupt or
// foreign message is an error with the byte offset, never a crash and never a partial plan.
//
// Threads: every function is pure (no state), safe to call from any thread concurrently.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tier/engine/plan.hpp"
#include "tier/status.hpp"

namespace tier::engine::wire {

inline constexpr std::uint16_t kWireVersion = 1;
inline constexpr std::size_t kHeaderBytes = 24;
// The largest message a decoder accepts unless told otherwise (DecodeLimits).
inline constexpr std::size_t kDefaultMaxMessageBytes = std::size_t{64} << 20;

struct DecodeLimits {
  std::size_t max_message_bytes = kDefaultMaxMessageBytes;
};

// A plan as one message. Errors: InvalidArgument when the plan cannot be framed (a count or the
// body beyond 32 bits).
Result<std::vector<std::byte>> encode_plan(const StepPlan& plan);
// Reports as one message. Errors: InvalidArgument (a channel out of range; a reason that is not
// one of the worker's outcome names, docs/engine.md "Wire format").
Result<std::vector<std::byte>> encode_reports(std::span<const OpReport> reports);

// Errors (both decoders): InvalidArgument (not a message of this kind, truncated, malformed: the
// text names the byte offset), ChecksumMismatch (the body's checksum differs), NotSupported
// (another format version, an unknown required section, an unknown reason code), NoSpace (larger
// than limits.max_message_bytes). A decoded report's `reason` is a string with static lifetime.
Result<StepPlan> decode_plan(std::span<const std::byte> message, const DecodeLimits& limits = {});
Result<std::vector<OpReport>> decode_reports(std::span<const std::byte> message,
                                             const DecodeLimits& limits = {});

}  // namespace tier::engine::wire
