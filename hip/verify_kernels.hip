// Version 2 payload verification on the device (gpu.hpp: verify_payload_async).
//
// Launches on the caller's stream: chunk_hashes (one per landed part of the payload, or one for
// all of it), then list_verdict. chunk_hashes: one thread block per 64 KiB chunk. XXH3's
// long path is a chain over 1,024-byte blocks (each block's stripe sums are added to the eight
// accumulators, which are then scrambled), but the sums themselves are independent: 512
// threads, one per (block, accumulator lane), load their lane's word of the block's 16 stripes
// (8-byte aligned: chunks start at multiples of 64 KiB of an aligned payload) and add them up
// at once; the partner lane's word sum comes through shared memory; then eight threads run the
// cheap chain of scrambles over the 64 rows and thread 0 merges. list_verdict: one thread block
// hashes the chunk list the same way (64 rows per pass), compares it with the header's payload
// checksum and writes the verdict to device memory (for the gated copy that follows) and to
// mapped host memory (for the poller). Inputs of at most 240 bytes take xxh3::short_hash64.
// With a codec's CRC claim, more blocks of the first launch compute it meanwhile (crc_pieces: a
// thread per 256-byte piece, a tree per block, one atomic xor per block); list_verdict finishes
// the CRC and requires it too.
#include <algorithm>

#include "crc32.hpp"
#include "gpu.hpp"
#include "gpu_runtime.hpp"
#include "object_chunks.hpp"
#include "xxh3.hpp"

namespace tier::gpu {
namespace {

using xxh3::u64;
using xxh3::u8;

constexpr unsigned kRows = 64;               // XXH3 blocks summed per pass
constexpr unsigned kThreads = kRows * 8;     // one per (block, accumulator lane)

// Per thread block: the secret, the rows' word and stripe sums, the final accumulators.
struct Shared {
  alignas(8) u8 secret[xxh3::kSecretBytes];
  u64 words[kRows][8];
  u64 sums[kRows][8];
  u64 acc[8];
};

__device__ void load_secret(Shared& sh, const xxh3::Secret& secret) {
  if (threadIdx.x < xxh3::kSecretBytes / 8)
    reinterpret_cast<u64*>(sh.secret)[threadIdx.x] =
        reinterpret_cast<const u64*>(secret.bytes)[threadIdx.x];
  __syncthreads();
}

// XXH3-64 (seed 0) of `len` bytes at `p` (8-byte aligned), by all kThreads threads of the
// block (every one with the same arguments, the secret already in `sh`); thread 0 returns it.
__device__ u64 block_hash(const u8* p, u64 len, Shared& sh) {
  if (len <= xxh3::kMidsizeMax) return xxh3::short_hash64(p, len, sh.secret);
  const unsigned lane = threadIdx.x % 8, row = threadIdx.x / 8;
  const u64 blocks = (len - 1) / xxh3::kBlockBytes;  // full blocks, each followed by a scramble
  const unsigned stripes =
      static_cast<unsigned>(((len - 1) - blocks * xxh3::kBlockBytes) / xxh3::kStripeBytes);
  u64 acc = xxh3::acc_init(lane);  // the chain's state, in threads 0..7
  const u64 scramble_key = xxh3::load64_aligned(sh.secret + xxh3::kScrambleAt + 8 * lane);
  for (u64 first = 0; first <= blocks; first += kRows) {
    const u64 b = first + row;
    u64 words = 0, products = 0;
    if (b <= blocks) {
      // Block b: 16 stripes, or the partial block's stripes and the input's last 64 bytes.
      const unsigned n = b < blocks ? xxh3::kStripesPerBlock : stripes;
      const u8* at = p + b * xxh3::kBlockBytes + 8 * lane;
#pragma unroll
      for (unsigned s = 0; s < xxh3::kStripesPerBlock; ++s) {
        if (s < n) {
          const u64 v = xxh3::load64_aligned(at + s * xxh3::kStripeBytes);
          words += v;
          products +=
              xxh3::stripe_product(v, xxh3::load64_aligned(sh.secret + 8 * s + 8 * lane));
        }
      }
      if (b == blocks) {
        const u64 v = xxh3::load64(p + len - xxh3::kStripeBytes + 8 * lane);
        words += v;
        products += xxh3::stripe_product(v, xxh3::read64(sh.secret + xxh3::kLastStripeAt + 8 * lane));
      }
    }
    sh.words[row][lane] = words;
    __syncthreads();
    sh.sums[row][lane] = products + sh.words[row][lane ^ 1];  // acc[i ^ 1] gets lane i's words
    __syncthreads();
    if (threadIdx.x < 8) {
      for (unsigned r = 0; r < kRows && first + r <= blocks; ++r) {
        acc += sh.sums[r][lane];
        if (first + r < blocks) acc = xxh3::scramble(acc, scramble_key);
      }
    }
    __syncthreads();  // the rows are refilled by the next pass
  }
  if (threadIdx.x < 8) sh.acc[lane] = acc;
  __syncthreads();
  return threadIdx.x == 0 ? xxh3::merge(sh.acc, len, sh.secret) : 0;
}

constexpr u64 kCrcPiece = 256;
constexpr u64 kCrcSpan = kCrcPiece * kThreads;  // bytes per CRC block

// Shift factors the host computes once per payload (a GF(2) power is a long chain of dependent
// steps: slow on one GPU thread): x^(8 * kCrcPiece * 2^k) for the tree's levels, x^(8 *
// kCrcSpan * 2^k) for the blocks' shifts, and the term the initial value adds over the range.
struct CrcConsts {
  crc32::u32 level[16];
  crc32::u32 span[48];
  crc32::u32 finish;
};

// CrcConsts' tables (finish left 0): squares of x^(8 * kCrcPiece) and of x^(8 * kCrcSpan).
CrcConsts crc_powers() {
  CrcConsts c{};
  c.level[0] = crc32::shift_factor(kCrcPiece);
  for (int k = 1; k < 16; ++k) c.level[k] = crc32::multiply(c.level[k - 1], c.level[k - 1]);
  c.span[0] = crc32::shift_factor(kCrcSpan);
  for (int k = 1; k < 48; ++k) c.span[k] = crc32::multiply(c.span[k - 1], c.span[k - 1]);
  return c;
}

// The raw CRC register of the `len` bytes at `data`, xor-ed into *acc by CRC block `block`. The
// bytes are right-aligned in whole blocks of kCrcSpan (leading zeros leave a raw register from
// 0 unchanged), so every piece and every block has its full size: a thread's 256-byte piece,
// then a tree over the block's pieces whose level k multiplies the left half by x^(8 * 256 *
// 2^k), then one shift of the block past the blocks after it.
__device__ void crc_pieces(const u8* __restrict__ data, u64 len, u64 block, u64 blocks,
                           const CrcConsts& consts, unsigned int* acc) {
  __shared__ crc32::u32 table[256];
  __shared__ crc32::u32 part[kThreads];
  if (threadIdx.x < 256) table[threadIdx.x] = crc32::table_entry(threadIdx.x);
  __syncthreads();
  const u64 pad = blocks * kCrcSpan - len;                 // leading zeros
  const u64 vlo = block * kCrcSpan + threadIdx.x * kCrcPiece;  // the piece, padded coordinates
  crc32::u32 c = 0;
  if (vlo + kCrcPiece > pad) {
    const u64 lo = vlo > pad ? vlo - pad : 0, hi = vlo + kCrcPiece - pad;
    const u8* p = data + lo;
    const u64 n = hi - lo;
    u64 i = 0;
    if ((reinterpret_cast<unsigned long long>(p) & 7u) == 0) {
      for (; i + 8 <= n; i += 8) {  // eight bytes per load
        const u64 w = xxh3::load64_aligned(p + i);
#pragma unroll
        for (int k = 0; k < 8; ++k)
          c = table[(c ^ static_cast<crc32::u32>(w >> (8 * k))) & 0xffu] ^ (c >> 8);
      }
    }
    c = crc32::raw_update(c, p + i, n - i, table);
  }
  part[threadIdx.x] = c;
  __syncthreads();
  for (unsigned k = 0, stride = 1; stride < kThreads; ++k, stride <<= 1) {
    if (threadIdx.x % (2 * stride) == 0)
      part[threadIdx.x] =
          crc32::multiply(part[threadIdx.x], consts.level[k]) ^ part[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0 && part[0] != 0) {
    crc32::u32 shifted = part[0];  // past the blocks after this one
    for (u64 m = blocks - 1 - block, k = 0; m != 0; m >>= 1, ++k)
      if ((m & 1u) != 0) shifted = crc32::multiply(shifted, consts.span[k]);
    atomicXor(acc, shifted);
  }
}

// Which chunks and CRC blocks one launch takes: `chunk_count` chunks from `chunk_first`, then
// `crc_count` of the `crc_blocks` CRC blocks from `crc_first`.
struct Units {
  u64 chunk_first, chunk_count, crc_first, crc_count, crc_blocks;
};

// Its first blocks hash one chunk each, the blocks after them compute CRC blocks of the
// `crc_len` bytes at `crc_data`: both at once, on different multiprocessors.
__global__ void __launch_bounds__(kThreads)
    chunk_hashes(const u8* __restrict__ payload, u64 bytes, Units u, u64* __restrict__ out,
                 xxh3::Secret secret, const u8* __restrict__ crc_data, u64 crc_len,
                 CrcConsts consts, unsigned int* crc_acc) {
  if (blockIdx.x >= u.chunk_count) {
    crc_pieces(crc_data, crc_len, u.crc_first + (blockIdx.x - u.chunk_count), u.crc_blocks,
               consts, crc_acc);
    return;
  }
  __shared__ Shared sh;
  load_secret(sh, secret);
  const u64 chunk = u.chunk_first + blockIdx.x;
  const u64 lo = chunk * kChunkBytes;
  const u64 len = bytes - lo < kChunkBytes ? bytes - lo : kChunkBytes;
  const u64 h = block_hash(payload + lo, len, sh);
  if (threadIdx.x == 0) out[chunk] = h;
}

// The raw CRC register in *crc_acc, xor `finish` (CrcConsts::finish), must be `crc` (when
// with_crc).
__global__ void __launch_bounds__(kThreads)
    list_verdict(const u64* __restrict__ list, u64 chunks, u64 expected, unsigned int* verdict,
                 unsigned int* host_verdict, xxh3::Secret secret, bool with_crc,
                 unsigned int finish, unsigned int crc, const unsigned int* crc_acc) {
  __shared__ Shared sh;
  load_secret(sh, secret);
  const u64 h = block_hash(reinterpret_cast<const u8*>(list), chunks * 8, sh);
  if (threadIdx.x == 0) {
    const bool crc_ok = !with_crc || (*crc_acc ^ finish) == crc;
    const unsigned int v = h == expected && crc_ok ? kVerdictMatch : kVerdictMismatch;
    *verdict = v;
    if (host_verdict != nullptr) *host_verdict = v;
  }
}

// A batch of payloads verified by one launch (verify_payloads_async): batch_hashes' blocks are
// every item's chunks in item order (at least one block per item, so an empty payload gets its
// verdict too), then every item's CRC blocks. Each block counts itself in its item's counter
// (VerifyCounters: zero before the launch); the item's last block hashes the chunk list, writes
// the verdict and zeroes the counter again. Passed by value (kernel parameters: at most
// kMaxVerifyBatch items, ~1.7 KiB).
struct BatchItem {
  const u8* payload;
  u64 bytes, chunks;
  u64 chunk_base;  // the launch's block of this item's first chunk
  u64* list;
  unsigned int* verdict;
  unsigned int* host_verdict;
  u64 expected;
  const u8* crc_data;
  u64 crc_len, crc_blocks, crc_base;  // crc_base: the first CRC block's index among CRC blocks
  unsigned int crc, crc_finish, with_crc;
  unsigned int units;  // the item's blocks: its chunk blocks and CRC blocks
};
struct Batch {
  unsigned int count;
  u64 chunk_blocks;        // blocks hashing chunks; CRC blocks follow
  unsigned int* counters;  // per item: finished blocks, then the raw CRC register
  BatchItem items[kMaxVerifyBatch];
};

__global__ void __launch_bounds__(kThreads)
    batch_hashes(const Batch b, xxh3::Secret secret, CrcConsts consts) {
  __shared__ Shared sh;
  __shared__ bool last;
  load_secret(sh, secret);
  const u64 block = blockIdx.x;
  unsigned int i = 0;
  if (block >= b.chunk_blocks) {
    const u64 c = block - b.chunk_blocks;
    while (i + 1 < b.count && c >= b.items[i + 1].crc_base) ++i;
    const BatchItem& it = b.items[i];
    crc_pieces(it.crc_data, it.crc_len, c - it.crc_base, it.crc_blocks, consts,
               b.counters + 2 * i + 1);
  } else {
    while (i + 1 < b.count && block >= b.items[i + 1].chunk_base) ++i;
    const BatchItem& it = b.items[i];
    const u64 chunk = block - it.chunk_base;
    if (chunk < it.chunks) {  // else the one block of an empty payload
      const u64 lo = chunk * kChunkBytes;
      const u64 len = it.bytes - lo < kChunkBytes ? it.bytes - lo : kChunkBytes;
      const u64 h = block_hash(it.payload + lo, len, sh);
      if (threadIdx.x == 0) it.list[chunk] = h;
    }
  }
  // Thread 0 wrote this block's hash or CRC part: visible before its count, and the item's
  // last block sees every other block's after its own fence.
  const BatchItem& it = b.items[i];
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(b.counters + 2 * i, 1u) + 1 == it.units;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const u64 h = block_hash(reinterpret_cast<const u8*>(it.list), it.chunks * 8, sh);
  if (threadIdx.x == 0) {
    volatile unsigned int* words = b.counters + 2 * i;
    const bool crc_ok = it.with_crc == 0 || (words[1] ^ it.crc_finish) == it.crc;
    const unsigned int v = h == it.expected && crc_ok ? kVerdictMatch : kVerdictMismatch;
    *it.verdict = v;
    if (it.host_verdict != nullptr) *it.host_verdict = v;
    words[0] = 0;  // zero for the next launch
    words[1] = 0;
  }
}

// The checks verify_payload_async makes of one payload.
Status check_item(Region payload, Region scratch, const CrcClaim* crc) noexcept {
  if (payload.kind != MemoryKind::kDevice || scratch.kind != MemoryKind::kDevice)
    return Status::invalid("verify_payload_async: payload and scratch must be device memory");
  if (reinterpret_cast<std::uintptr_t>(payload.data) % 8 != 0 ||
      reinterpret_cast<std::uintptr_t>(scratch.data) % 8 != 0)
    return Status::invalid("verify_payload_async: payload and scratch must be 8-byte aligned");
  if (scratch.size < verify_scratch_bytes(payload.size))
    return Status::invalid("verify_payload_async: scratch smaller than verify_scratch_bytes()");
  if (crc != nullptr && crc->from > payload.size)
    return Status::invalid("verify_payload_async: CRC claim past the payload's end");
  return Status::ok();
}

// The device address of a host verdict word (mapped pinned memory), or null for none.
Status map_verdict(std::uint32_t* host_verdict, unsigned int*& mapped) noexcept {
  mapped = nullptr;
  if (host_verdict == nullptr) return Status::ok();
  mapped = static_cast<unsigned int*>(rt::mapped_device_pointer(host_verdict));
  if (mapped == nullptr)
    return Status::invalid("verify_payload_async: the host verdict is not mapped pinned memory");
  return Status::ok();
}

const xxh3::Secret& secret_bytes() {
  static const xxh3::Secret secret = xxh3::default_secret();
  return secret;
}

const CrcConsts& crc_tables() {
  static const CrcConsts powers = crc_powers();  // the same for every payload
  return powers;
}

}  // namespace

// Scratch: the verdict (4 bytes), the CRC accumulator (4 bytes), then the chunk list.
std::size_t verify_scratch_bytes(std::size_t payload_bytes) noexcept {
  return 8 + 8 * chunk_count(payload_bytes);
}

Status verify_payload_async(Region payload, std::uint64_t expected, Region scratch,
                            std::uint32_t* host_verdict, const Stream& s, const CrcClaim* crc,
                            std::span<const Landing> landings) noexcept {
  TIER_RETURN_IF_ERROR(check_item(payload, scratch, crc));
  for (std::size_t i = 0; i < landings.size(); ++i)
    if (landings[i].event == nullptr || landings[i].bytes > payload.size ||
        (i > 0 && landings[i].bytes < landings[i - 1].bytes))
      return Status::invalid("verify_payload_async: landings must grow within the payload");
  if (!landings.empty() && landings.back().bytes != payload.size)
    return Status::invalid("verify_payload_async: the last landing must be the whole payload");
  unsigned int* mapped = nullptr;
  TIER_RETURN_IF_ERROR(map_verdict(host_verdict, mapped));
  DeviceGuard guard(s.device());
  TIER_RETURN_IF_ERROR(guard.status());
  const xxh3::Secret& secret = secret_bytes();
  const u64 chunks = chunk_count(payload.size);
  auto* verdict = reinterpret_cast<unsigned int*>(scratch.data);
  auto* crc_acc = reinterpret_cast<unsigned int*>(scratch.data + 4);
  auto* list = reinterpret_cast<u64*>(scratch.data + 8);
  auto stream = static_cast<rt::StreamHandle>(s.handle());
  const u64 crc_len = crc != nullptr ? payload.size - crc->from : 0;
  const u64 crc_blocks = (crc_len + kCrcSpan - 1) / kCrcSpan;
  if (chunks + crc_blocks > 0x7fffffffu)
    return Status::invalid("verify_payload_async: payload of more than 2^31 chunks");
  CrcConsts consts = crc_tables();
  if (crc != nullptr) {
    consts.finish = crc32::finish(0, crc_len);
    TIER_GPU_TRY(rt::memset_async(crc_acc, 0, 4, stream));
  }
  // Launches the chunks and CRC blocks that lie wholly in the payload's first `landed` bytes
  // and no earlier launch took. CRC block b covers the claim's bytes [b * span - pad,
  // (b + 1) * span - pad) (right-aligned: crc_pieces).
  const u64 pad = crc_blocks * kCrcSpan - crc_len;
  Units u{0, 0, 0, 0, crc_blocks};
  auto launch_landed = [&](u64 landed) -> Status {
    const u64 chunk_to = landed == payload.size ? chunks : landed / kChunkBytes;
    u64 crc_to = 0;
    if (crc != nullptr && landed >= crc->from)
      crc_to = std::min<u64>(crc_blocks, (landed - crc->from + pad) / kCrcSpan);
    u.chunk_first += u.chunk_count;
    u.crc_first += u.crc_count;
    u.chunk_count = chunk_to > u.chunk_first ? chunk_to - u.chunk_first : 0;
    u.crc_count = crc_to > u.crc_first ? crc_to - u.crc_first : 0;
    if (u.chunk_count + u.crc_count == 0) return Status::ok();
    chunk_hashes<<<static_cast<unsigned>(u.chunk_count + u.crc_count), kThreads, 0, stream>>>(
        reinterpret_cast<const u8*>(payload.data), payload.size, u, list, secret,
        reinterpret_cast<const u8*>(payload.data) + (crc != nullptr ? crc->from : 0), crc_len,
        consts, crc_acc);
    TIER_GPU_TRY(rt::clear_last_error());
    return Status::ok();
  };
  if (landings.empty()) TIER_RETURN_IF_ERROR(launch_landed(payload.size));
  for (const Landing& l : landings) {
    TIER_RETURN_IF_ERROR(stream_wait_event(s, l.event->handle()));
    TIER_RETURN_IF_ERROR(launch_landed(l.bytes));
  }
  list_verdict<<<1, kThreads, 0, stream>>>(list, chunks, expected, verdict, mapped, secret,
                                           crc != nullptr, consts.finish,
                                           crc != nullptr ? crc->crc : 0u, crc_acc);
  TIER_GPU_TRY(rt::clear_last_error());
  return Status::ok();
}

Result<VerifyCounters> VerifyCounters::allocate(const Stream& s) noexcept {
  TIER_ASSIGN_OR_RETURN(DeviceBuffer words,
                        DeviceBuffer::allocate(s.device(), kWords * sizeof(std::uint32_t)));
  DeviceGuard guard(s.device());
  TIER_RETURN_IF_ERROR(guard.status());
  TIER_GPU_TRY(rt::memset_async(words.data(), 0, words.size(),
                                static_cast<rt::StreamHandle>(s.handle())));
  VerifyCounters c;
  c.words_ = std::move(words);
  return std::move(c);
}

Status verify_payloads_async(std::span<const VerifyItem> items, VerifyCounters& counters,
                             const Stream& s) noexcept {
  if (items.size() > kMaxVerifyBatch)
    return Status::invalid("verify_payloads_async: more than kMaxVerifyBatch payloads");
  if (counters.words() == nullptr || counters.device() != s.device())
    return Status::invalid("verify_payloads_async: counters not allocated on the stream's GPU");
  if (items.empty()) return Status::ok();
  Batch b{};
  b.count = static_cast<unsigned int>(items.size());
  b.counters = reinterpret_cast<unsigned int*>(counters.words());
  u64 chunk_blocks = 0, crc_blocks = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const VerifyItem& v = items[i];
    TIER_RETURN_IF_ERROR(check_item(v.payload, v.scratch, v.crc));
    BatchItem& it = b.items[i];
    it.payload = reinterpret_cast<const u8*>(v.payload.data);
    it.bytes = v.payload.size;
    it.chunks = chunk_count(v.payload.size);
    it.chunk_base = chunk_blocks;
    it.verdict = reinterpret_cast<unsigned int*>(v.scratch.data);
    it.list = reinterpret_cast<u64*>(v.scratch.data + 8);
    TIER_RETURN_IF_ERROR(map_verdict(v.host_verdict, it.host_verdict));
    it.expected = v.expected;
    it.crc_base = crc_blocks;
    if (v.crc != nullptr) {
      it.with_crc = 1;
      it.crc = v.crc->crc;
      it.crc_data = it.payload + v.crc->from;
      it.crc_len = v.payload.size - v.crc->from;
      it.crc_blocks = (it.crc_len + kCrcSpan - 1) / kCrcSpan;
      it.crc_finish = crc32::finish(0, it.crc_len);
    }
    const u64 blocks = std::max<u64>(1, it.chunks);
    it.units = static_cast<unsigned int>(blocks + it.crc_blocks);  // launched only if < 2^31
    chunk_blocks += blocks;
    crc_blocks += it.crc_blocks;
  }
  if (chunk_blocks + crc_blocks > 0x7fffffffu)
    return Status::invalid("verify_payloads_async: more than 2^31 chunks");
  b.chunk_blocks = chunk_blocks;
  DeviceGuard guard(s.device());
  TIER_RETURN_IF_ERROR(guard.status());
  auto stream = static_cast<rt::StreamHandle>(s.handle());
  batch_hashes<<<static_cast<unsigned>(chunk_blocks + crc_blocks), kThreads, 0, stream>>>(
      b, secret_bytes(), crc_tables());
  TIER_GPU_TRY(rt::clear_last_error());
  return Status::ok();
}

}  // namespace tier::gpu
