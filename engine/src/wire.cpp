#include "tier/engine/wire.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "tier/engine/worker.hpp"
#include "tier/object.hpp"

namespace tier::engine::wire {
namespace {

// docs/engine.md "Wire format" is this file's layout, byte by byte; keep them together.
constexpr char kMagic[4] = {'L', 'T', 'W', 'M'};
constexpr std::uint8_t kKindPlan = 1;
constexpr std::uint8_t kKindReports = 2;
constexpr std::uint16_t kRequired = 1;  // section flag: a decoder that does not know it refuses
constexpr std::size_t kSectionHeadBytes = 8;
// Plan sections.
constexpr std::uint16_t kStepSection = 1;
constexpr std::uint16_t kLoadSection = 2;
constexpr std::uint16_t kSaveSection = 3;
// Reports sections.
constexpr std::uint16_t kReportsSection = 1;
// The fixed heads of version 1's records; a longer head is read up to these and skipped after.
constexpr std::uint16_t kStepBytes = 8;
constexpr std::uint16_t kLoadHeadBytes = 80;
constexpr std::uint16_t kSaveHeadBytes = 80;
constexpr std::uint16_t kReportBytes = 24;
// Op record flags.
constexpr std::uint16_t kHasSlot = 1;
constexpr std::uint16_t kChunksInPrefix = 2;  // save: chunk keys are prefix keys [first, +count)
constexpr std::size_t kKeyBytes = 16;

// A report's reason on the wire is its WorkerOutcome's stable number (tier/engine/plan.hpp: a
// number is never renumbered or reused; a new outcome takes the next one).

const char* kind_name(std::uint8_t kind) {
  return kind == kKindPlan ? "plan" : kind == kKindReports ? "reports" : "unknown";
}

// ---- writing ---------------------------------------------------------------------------------

class Writer {
 public:
  explicit Writer(std::uint8_t kind) : kind_(kind) { out_.resize(kHeaderBytes); }
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { le(v, 2); }
  void u32(std::uint32_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void key(const Key128& k) {
    u64(k.lo);
    u64(k.hi);
  }
  // Starts a section; end() patches its length in.
  std::size_t begin(std::uint16_t tag, std::uint16_t flags) {
    u16(tag);
    u16(flags);
    u32(0);
    return out_.size();
  }
  Status end(std::size_t payload_at) {
    const std::size_t n = out_.size() - payload_at;
    if (n > UINT32_MAX) return Status::invalid("wire: a section larger than 4 GiB");
    patch_u32(payload_at - 4, static_cast<std::uint32_t>(n));
    return Status::ok();
  }
  // Fills in the header; the writer is spent afterwards.
  Result<std::vector<std::byte>> finish() {
    const std::size_t body = out_.size() - kHeaderBytes;
    if (body > UINT32_MAX) return Status::invalid("wire: a message body larger than 4 GiB");
    std::memcpy(out_.data(), kMagic, 4);
    patch_u16(4, kWireVersion);
    out_[6] = static_cast<std::byte>(kind_);
    out_[7] = std::byte{0};
    patch_u32(8, static_cast<std::uint32_t>(body));
    patch_u32(12, 0);
    patch_u64(16,
              payload_checksum(std::span(out_).subspan(kHeaderBytes), kObjectVersionWholePayload));
    return std::move(out_);
  }

 private:
  void le(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>(v >> (8 * i)));
  }
  void patch(std::size_t at, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_[at + i] = static_cast<std::byte>(v >> (8 * i));
  }
  void patch_u16(std::size_t at, std::uint16_t v) { patch(at, v, 2); }
  void patch_u32(std::size_t at, std::uint32_t v) { patch(at, v, 4); }
  void patch_u64(std::size_t at, std::uint64_t v) { patch(at, v, 8); }

  std::uint8_t kind_;
  std::vector<std::byte> out_;
};

Result<std::uint32_t> count_of(std::size_t n, const char* what) {
  if (n > UINT32_MAX) return Status::invalid(fmt::format("wire: {} {} exceed 2^32", n, what));
  return static_cast<std::uint32_t>(n);
}

// Where `part` lies in `whole` as a contiguous run (a save's chunk keys inside its prefix keys:
// usually the tail), so it need not be sent twice.
std::optional<std::size_t> slice_of(const std::vector<Key128>& whole,
                                    const std::vector<Key128>& part) {
  if (part.empty() || part.size() > whole.size()) return std::nullopt;
  auto at = [&](std::size_t first) {
    return std::equal(part.begin(), part.end(), whole.begin() + static_cast<std::ptrdiff_t>(first));
  };
  const std::size_t tail = whole.size() - part.size();
  if (at(tail)) return tail;
  for (std::size_t i = 0; i < tail; ++i)
    if (whole[i] == part[0] && at(i)) return i;
  return std::nullopt;
}

// The fields a load and a save record start with, after the head length and flags.
template <class Op>
void write_common(Writer& w, const Op& op) {
  w.u32(static_cast<std::uint32_t>(op.slot_group));
  w.u64(op.id.request);
  w.u64(op.id.generation);
  w.u64(op.page_start);
  w.u64(op.page_end);
}

// The slot fields of an op: tokens and key, zero without a slot.
void write_slot(Writer& w, const std::optional<Boundary>& slot) {
  w.u64(slot ? slot->tokens : 0);
  w.key(slot ? slot->key : Key128{});
}

Status write_load(Writer& w, const LoadOp& op) {
  TIER_ASSIGN_OR_RETURN(std::uint32_t chunks, count_of(op.chunk_keys.size(), "chunk keys"));
  TIER_ASSIGN_OR_RETURN(std::uint32_t blocks, count_of(op.block_ids.size(), "block ids"));
  const std::size_t at = w.begin(kLoadSection, kRequired);
  w.u16(kLoadHeadBytes);
  w.u16(op.slot ? kHasSlot : 0);
  write_common(w, op);
  w.u64(op.lease);
  write_slot(w, op.slot);
  w.u32(chunks);
  w.u32(blocks);
  for (const Key128& k : op.chunk_keys) w.key(k);
  for (std::uint32_t b : op.block_ids) w.u32(b);
  return w.end(at);
}

Status write_save(Writer& w, const SaveOp& op) {
  TIER_ASSIGN_OR_RETURN(std::uint32_t chunks, count_of(op.chunk_keys.size(), "chunk keys"));
  TIER_ASSIGN_OR_RETURN(std::uint32_t blocks, count_of(op.block_ids.size(), "block ids"));
  TIER_ASSIGN_OR_RETURN(std::uint32_t prefix, count_of(op.prefix_keys.size(), "prefix keys"));
  const std::optional<std::size_t> first = slice_of(op.prefix_keys, op.chunk_keys);
  const std::size_t at = w.begin(kSaveSection, kRequired);
  w.u16(kSaveHeadBytes);
  w.u16(static_cast<std::uint16_t>((op.slot ? kHasSlot : 0) | (first ? kChunksInPrefix : 0)));
  write_common(w, op);
  write_slot(w, op.slot);
  w.u32(chunks);
  w.u32(blocks);
  w.u32(prefix);
  w.u32(first ? static_cast<std::uint32_t>(*first) : 0);
  for (const Key128& k : op.prefix_keys) w.key(k);
  if (!first)
    for (const Key128& k : op.chunk_keys) w.key(k);
  for (std::uint32_t b : op.block_ids) w.u32(b);
  return w.end(at);
}

// ---- reading ---------------------------------------------------------------------------------

std::uint64_t read_le(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

// A bounds-checked cursor over one record or section. Every read is checked by the caller's
// need() first, so the readers themselves cannot run past the end.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, std::size_t offset, const char* what)
      : bytes_(bytes), offset_(offset), what_(what) {}
  std::size_t left() const noexcept { return bytes_.size() - pos_; }
  std::size_t pos() const noexcept { return pos_; }
  Status need(std::uint64_t n, const char* field) const {
    if (n <= left()) return Status::ok();
    return error(fmt::format("{} needs {} bytes, {} left", field, n, left()));
  }
  std::uint8_t u8() { return static_cast<std::uint8_t>(read_le(take(1), 1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(read_le(take(2), 2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(read_le(take(4), 4)); }
  std::uint64_t u64() { return read_le(take(8), 8); }
  Key128 key() {
    Key128 k;
    k.lo = u64();
    k.hi = u64();
    return k;
  }
  // `count` keys; need(count * 16) must have been checked.
  std::vector<Key128> keys(std::uint32_t count) {
    std::vector<Key128> out(count);
    for (Key128& k : out) k = key();
    return out;
  }
  std::vector<std::uint32_t> u32s(std::uint32_t count) {
    std::vector<std::uint32_t> out(count);
    for (std::uint32_t& v : out) v = u32();
    return out;
  }
  void seek(std::size_t pos) noexcept { pos_ = pos; }
  // "plan message at byte N: text" (N: from the start of the message).
  Status error(const std::string& text) const {
    return Status::invalid(fmt::format("{} message at byte {}: {}", what_, offset_ + pos_, text));
  }

 private:
  const std::byte* take(std::size_t n) noexcept {
    const std::byte* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::span<const std::byte> bytes_;
  std::size_t offset_;
  std::size_t pos_ = 0;
  const char* what_;
};

// Checks the header of a message of `kind`; returns its body.
Result<std::span<const std::byte>> open(std::span<const std::byte> m, std::uint8_t kind,
                                        const DecodeLimits& limits) {
  const char* what = kind_name(kind);
  if (m.size() > limits.max_message_bytes)
    return Status(Code::kNoSpace, fmt::format("{} message of {} bytes: the limit is {}", what,
                                              m.size(), limits.max_message_bytes));
  Reader r(m, 0, what);
  if (m.size() < kHeaderBytes)
    return r.error(
        fmt::format("truncated: {} bytes, the header alone is {}", m.size(), kHeaderBytes));
  if (std::memcmp(m.data(), kMagic, 4) != 0) return r.error("not a libtier wire message (magic)");
  r.seek(4);
  const std::uint16_t version = r.u16();
  if (version != kWireVersion)
    return Status(Code::kNotSupported,
                  fmt::format("{} message: wire format version {}; this decoder reads version {}",
                              what, version, kWireVersion));
  const std::uint8_t got = r.u8();
  if (got != kind)
    return r.error(
        fmt::format("a {} message (kind {}), expected a {} message", kind_name(got), got, what));
  if (r.u8() != 0) return r.error("header flags set");
  const std::uint32_t body = r.u32();
  if (r.u32() != 0) return r.error("reserved header bytes set");
  if (body != m.size() - kHeaderBytes)
    return r.error(fmt::format("the header says {} body bytes, {} follow (truncated or extended)",
                               body, m.size() - kHeaderBytes));
  const std::uint64_t checksum = r.u64();
  std::span<const std::byte> b = m.subspan(kHeaderBytes);
  if (payload_checksum(b, kObjectVersionWholePayload) != checksum)
    return Status(Code::kChecksumMismatch,
                  fmt::format("{} message: the body's checksum differs (corrupt)", what));
  return b;
}

// Calls `on(tag, payload, offset)` for every section of `body` in order; `on` returns whether it
// knew the tag. An unknown section is skipped unless it is required.
template <class F>
Status for_each_section(std::span<const std::byte> body, const char* what, F&& on) {
  Reader r(body, kHeaderBytes, what);
  while (r.left() > 0) {
    TIER_RETURN_IF_ERROR(r.need(kSectionHeadBytes, "a section header"));
    const std::size_t start = r.pos();
    const std::uint16_t tag = r.u16();
    const std::uint16_t flags = r.u16();
    const std::uint32_t length = r.u32();
    if ((flags & ~kRequired) != 0) return r.error(fmt::format("section flags {:#x}", flags));
    TIER_RETURN_IF_ERROR(r.need(length, "the section's payload"));
    const std::size_t at = kHeaderBytes + r.pos();
    TIER_ASSIGN_OR_RETURN(bool known, on(tag, body.subspan(r.pos(), length), at));
    if (!known && (flags & kRequired) != 0)
      return Status(Code::kNotSupported,
                    fmt::format("{} message at byte {}: section {} is required and unknown to "
                                "this decoder (wire format version {})",
                                what, kHeaderBytes + start, tag, kWireVersion));
    r.seek(r.pos() + length);
  }
  return Status::ok();
}

// A record's head: its length (the arrays start there) and its flags.
struct Head {
  std::uint16_t bytes = 0;
  std::uint16_t flags = 0;
};

// Reads a record's head length and flags; checks that the head holds version 1's `fixed` bytes.
Result<Head> record_head(Reader& r, std::uint16_t fixed, std::uint16_t known_flags) {
  TIER_RETURN_IF_ERROR(r.need(4, "the record's head length and flags"));
  Head h;
  h.bytes = r.u16();
  if (h.bytes < fixed)
    return r.error(fmt::format("a record head of {} bytes, at least {}", h.bytes, fixed));
  TIER_RETURN_IF_ERROR(r.need(h.bytes - 2u, "the record's head"));
  h.flags = r.u16();
  if ((h.flags & ~known_flags) != 0) return r.error(fmt::format("record flags {:#x}", h.flags));
  return h;
}

// The fields write_common() wrote.
template <class Op>
void read_common(Reader& r, Op& op) {
  op.slot_group = static_cast<std::int32_t>(r.u32());
  op.id.request = r.u64();
  op.id.generation = r.u64();
  op.page_start = r.u64();
  op.page_end = r.u64();
}

// A slot read from an op's head: set only with kHasSlot, all zero otherwise.
Result<std::optional<Boundary>> read_slot(Reader& r, std::uint16_t flags) {
  Boundary b;
  b.tokens = r.u64();
  b.key = r.key();
  if (flags & kHasSlot) return std::optional<Boundary>(b);
  if (b.tokens != 0 || !b.key.is_zero()) return r.error("slot fields set without the slot flag");
  return std::optional<Boundary>();
}

// The arrays after a head must fill the record exactly.
Status exact(const Reader& r, std::uint64_t array_bytes) {
  if (array_bytes == r.left()) return Status::ok();
  return r.error(fmt::format("the counts need {} bytes of arrays, the record holds {}", array_bytes,
                             r.left()));
}

Result<LoadOp> read_load(std::span<const std::byte> p, std::size_t at) {
  Reader r(p, at, "plan");
  TIER_ASSIGN_OR_RETURN(const Head head, record_head(r, kLoadHeadBytes, kHasSlot));
  LoadOp op;
  read_common(r, op);
  op.lease = r.u64();
  TIER_ASSIGN_OR_RETURN(op.slot, read_slot(r, head.flags));
  const std::uint32_t chunks = r.u32();
  const std::uint32_t blocks = r.u32();
  r.seek(head.bytes);  // past head fields a later version appended
  TIER_RETURN_IF_ERROR(exact(r, kKeyBytes * std::uint64_t{chunks} + 4 * std::uint64_t{blocks}));
  op.chunk_keys = r.keys(chunks);
  op.block_ids = r.u32s(blocks);
  return op;
}

Result<SaveOp> read_save(std::span<const std::byte> p, std::size_t at) {
  Reader r(p, at, "plan");
  TIER_ASSIGN_OR_RETURN(const Head head,
                        record_head(r, kSaveHeadBytes, kHasSlot | kChunksInPrefix));
  SaveOp op;
  read_common(r, op);
  TIER_ASSIGN_OR_RETURN(op.slot, read_slot(r, head.flags));
  const std::uint32_t chunks = r.u32();
  const std::uint32_t blocks = r.u32();
  const std::uint32_t prefix = r.u32();
  const std::uint32_t first = r.u32();
  const bool in_prefix = (head.flags & kChunksInPrefix) != 0;
  if (in_prefix ? std::uint64_t{first} + chunks > prefix : first != 0)
    return r.error(fmt::format("chunk keys [{}, +{}) of {} prefix keys", first, chunks, prefix));
  r.seek(head.bytes);  // past head fields a later version appended
  TIER_RETURN_IF_ERROR(exact(r, kKeyBytes * (std::uint64_t{prefix} + (in_prefix ? 0 : chunks)) +
                                    4 * std::uint64_t{blocks}));
  op.prefix_keys = r.keys(prefix);
  if (in_prefix)
    op.chunk_keys.assign(op.prefix_keys.begin() + first, op.prefix_keys.begin() + first + chunks);
  else
    op.chunk_keys = r.keys(chunks);
  op.block_ids = r.u32s(blocks);
  return op;
}

Result<std::vector<OpReport>> read_reports(std::span<const std::byte> p, std::size_t at) {
  Reader r(p, at, "reports");
  TIER_RETURN_IF_ERROR(r.need(8, "the reports' record size and count"));
  const std::uint16_t size = r.u16();
  if (size < kReportBytes)
    return r.error(fmt::format("report records of {} bytes, at least {}", size, kReportBytes));
  if (r.u16() != 0) return r.error("reserved bytes set");
  const std::uint32_t count = r.u32();
  TIER_RETURN_IF_ERROR(exact(r, std::uint64_t{size} * count));
  std::vector<OpReport> out(count);
  for (OpReport& rep : out) {
    const std::size_t start = r.pos();
    const std::uint8_t channel = r.u8();
    const std::uint8_t ok = r.u8();
    const std::uint16_t code = r.u16();
    if (channel >= kChannelCount) return r.error(fmt::format("channel {}", channel));
    if (ok > 1) return r.error(fmt::format("ok is {}", ok));
    if ((ok != 0) != (code == 0))
      return r.error(fmt::format("ok is {} with reason code {}", ok, code));
    if (code >= kWorkerOutcomeCount)
      return Status(Code::kNotSupported,
                    fmt::format("reports message at byte {}: reason code {} is unknown to this "
                                "decoder (wire format version {})",
                                at + start, code, kWireVersion));
    rep.channel = static_cast<Channel>(channel);
    rep.outcome = static_cast<WorkerOutcome>(code);
    rep.rank = r.u32();
    rep.id.request = r.u64();
    rep.id.generation = r.u64();
    r.seek(start + size);
  }
  return out;
}

}  // namespace

Result<std::vector<std::byte>> encode_plan(const StepPlan& plan) {
  Writer w(kKindPlan);
  const std::size_t at = w.begin(kStepSection, kRequired);
  w.u64(plan.step);
  TIER_RETURN_IF_ERROR(w.end(at));
  for (const LoadOp& op : plan.loads) TIER_RETURN_IF_ERROR(write_load(w, op));
  for (const SaveOp& op : plan.saves) TIER_RETURN_IF_ERROR(write_save(w, op));
  return w.finish();
}

Result<StepPlan> decode_plan(std::span<const std::byte> message, const DecodeLimits& limits) {
  TIER_ASSIGN_OR_RETURN(auto body, open(message, kKindPlan, limits));
  StepPlan plan;
  bool stepped = false;
  TIER_RETURN_IF_ERROR(for_each_section(
      body, "plan",
      [&](std::uint16_t tag, std::span<const std::byte> p, std::size_t at) -> Result<bool> {
        switch (tag) {
          case kStepSection: {
            Reader r(p, at, "plan");
            if (stepped) return r.error("a second step section");
            TIER_RETURN_IF_ERROR(r.need(kStepBytes, "the step"));
            plan.step = r.u64();
            stepped = true;
            return true;
          }
          case kLoadSection: {
            TIER_ASSIGN_OR_RETURN(LoadOp op, read_load(p, at));
            plan.loads.push_back(std::move(op));
            return true;
          }
          case kSaveSection: {
            TIER_ASSIGN_OR_RETURN(SaveOp op, read_save(p, at));
            plan.saves.push_back(std::move(op));
            return true;
          }
          default:
            return false;
        }
      }));
  if (!stepped) return Status::invalid("plan message: no step section");
  return plan;
}

Result<std::vector<std::byte>> encode_reports(std::span<const OpReport> reports) {
  TIER_ASSIGN_OR_RETURN(std::uint32_t count, count_of(reports.size(), "reports"));
  Writer w(kKindReports);
  const std::size_t at = w.begin(kReportsSection, kRequired);
  w.u16(kReportBytes);
  w.u16(0);
  w.u32(count);
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const OpReport& rep = reports[i];
    const auto channel = static_cast<std::size_t>(rep.channel);
    if (channel >= kChannelCount)
      return Status::invalid(fmt::format("wire: report {}: channel {}", i, channel));
    const auto code = static_cast<std::uint16_t>(rep.outcome);
    if (code >= kWorkerOutcomeCount)
      return Status::invalid(fmt::format("wire: report {}: outcome {}", i, code));
    w.u8(static_cast<std::uint8_t>(channel));
    w.u8(rep.ok() ? 1 : 0);
    w.u16(code);
    w.u32(rep.rank);
    w.u64(rep.id.request);
    w.u64(rep.id.generation);
  }
  TIER_RETURN_IF_ERROR(w.end(at));
  return w.finish();
}

Result<std::vector<OpReport>> decode_reports(std::span<const std::byte> message,
                                             const DecodeLimits& limits) {
  TIER_ASSIGN_OR_RETURN(auto body, open(message, kKindReports, limits));
  std::optional<std::vector<OpReport>> out;
  TIER_RETURN_IF_ERROR(for_each_section(
      body, "reports",
      [&](std::uint16_t tag, std::span<const std::byte> p, std::size_t at) -> Result<bool> {
        if (tag != kReportsSection) return false;
        if (out) return Reader(p, at, "reports").error("a second reports section");
        TIER_ASSIGN_OR_RETURN(out, read_reports(p, at));
        return true;
      }));
  if (!out) return Status::invalid("reports message: no reports section");
  return std::move(*out);
}

}  // namespace tier::engine::wire
