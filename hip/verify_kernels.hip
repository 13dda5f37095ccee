// Version 2 payload verification on the device (gpu.hpp: verify_payload_async,
// verify_payloads_async).
//
// One kernel, batch_hashes, on the caller's stream: one thread block per 64 KiB chunk of each
// payload, then the blocks of their CRC claims. XXH3's long path is a chain over 1,024-byte
// blocks (each block's stripe sums are added to the eight accumulators, which are then
// scrambled), but the sums themselves are independent: 512 threads, one per (block, accumulator
// lane), load their lane's word of the block's 16 stripes (8-byte aligned: chunks start at
// multiples of 64 KiB of an aligned payload) and add them up at once; the partner lane's word sum
// comes through shared memory; then eight threads run the chain of scrambles over the 64 rows
// and thread 0 merges. Every block then counts itself in its payload's counter (VerifyCounters);
// the payload's last block hashes the chunk list the same way, compares it with the header's
// payload checksum and writes the verdict to device memory (for the gated copy that follows) and
// to mapped host memory (for the poller). Inputs of at most 240 bytes (a list of up to 30
// chunks, a payload's short last chunk) take xxh3::short_hash64 on thread 0.
//
// The verdict's latency is the path: a verification starts once the last byte landed and the
// gated copy waits for it. By ncu on the H200 (1 MiB, 16 blocks), a block took 13.7k cycles and
// the last one 37k (20 us in all): the chain stepped with a predicate and a branch per row, and
// the list's hash read bytes and shuffled them in code run once, fetched cold. With the chain
// unpredicated and the list read as words, the last block took 26k cycles (15 us); the secret's
// unaligned words (the last stripe's, the merge's) are read as words too since. In the tier's
// pipeline (CUPTI) the launch for a 4 MiB batch runs 8.8 us (13 us before).
//
// A CRC claim's blocks compute it meanwhile (crc_pieces: a thread per 256-byte piece, a tree per
// block, one atomic xor per block into the payload's second counter word); the verdict requires
// it too. A large payload that lands in parts has one launch per part, all counting into the
// same words.
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

// Per thread block: the secret, its unaligned words the long path reads (the last stripe's and
// the merge's: each a byte-wise read, long code on the verdict's path, read once here), the rows'
// word and stripe sums, the final accumulators.
struct Shared {
  alignas(8) u8 secret[xxh3::kSecretBytes];
  u64 last_key[8];
  u64 merge_key[8];
  u64 words[kRows][8];
  u64 sums[kRows][8];
  u64 acc[8];
};

__device__ void load_secret(Shared& sh, const xxh3::Secret& secret) {
  if (threadIdx.x < xxh3::kSecretBytes / 8)
    reinterpret_cast<u64*>(sh.secret)[threadIdx.x] =
        reinterpret_cast<const u64*>(secret.bytes)[threadIdx.x];
  __syncthreads();
  if (threadIdx.x < 8) {
    sh.last_key[threadIdx.x] = xxh3::read64(sh.secret + xxh3::kLastStripeAt + 8 * threadIdx.x);
    sh.merge_key[threadIdx.x] = xxh3::merge_key(sh.secret, threadIdx.x);
  }
  __syncthreads();
}

// XXH3-64 (seed 0) of `len` bytes at `p` (8-byte aligned), by all kThreads threads of the
// block (every one with the same arguments, the secret already in `sh`); thread 0 returns it.
// An input of at most 240 bytes is thread 0's alone, with word loads when `len` is a multiple of
// 8 (a chunk list always is).
__device__ u64 block_hash(const u8* p, u64 len, Shared& sh) {
  if (len <= xxh3::kMidsizeMax) {
    if (threadIdx.x != 0) return 0;
    return len % 8 == 0 ? xxh3::short_hash64<true>(p, len, sh.secret)
                        : xxh3::short_hash64(p, len, sh.secret);
  }
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
      // Every load is issued before any is used: a load followed by its use, stripe after
      // stripe, waited for one memory round trip after another (by ncu on the H200, a 4 MiB
      // batch's launch took 22.2 us that way, 19.2 us this way).
      const unsigned n = b < blocks ? xxh3::kStripesPerBlock : stripes;
      const u8* at = p + b * xxh3::kBlockBytes + 8 * lane;
      u64 v[xxh3::kStripesPerBlock];
#pragma unroll
      for (unsigned s = 0; s < xxh3::kStripesPerBlock; ++s)
        v[s] = s < n ? xxh3::load64_aligned(at + s * xxh3::kStripeBytes) : 0;
#pragma unroll
      for (unsigned s = 0; s < xxh3::kStripesPerBlock; ++s) {
        if (s < n) {
          words += v[s];
          products +=
              xxh3::stripe_product(v[s], xxh3::load64_aligned(sh.secret + 8 * s + 8 * lane));
        }
      }
      if (b == blocks) {
        const u64 v = xxh3::load64(p + len - xxh3::kStripeBytes + 8 * lane);
        words += v;
        products += xxh3::stripe_product(v, sh.last_key[lane]);
      }
    }
    sh.words[row][lane] = words;
    __syncthreads();
    sh.sums[row][lane] = products + sh.words[row][lane ^ 1];  // acc[i ^ 1] gets lane i's words
    __syncthreads();
    if (threadIdx.x < 8) {
      // The chain: every row but the input's last block (b == blocks) ends in a scramble. No
      // branch or predicate per step, and each group's eight sums read from shared memory while
      // the group before runs: the chain's steps are all that is left on its path (by ncu on the
      // H200, a predicated step with its branch made the 64-row chain most of a block's time).
      const u64 left = blocks - first + 1;
      const unsigned rows = left < kRows ? static_cast<unsigned>(left) : kRows;
      const unsigned scrambles = first + rows <= blocks ? rows : rows - 1;
      unsigned r = 0;
      u64 next[8];
#pragma unroll
      for (unsigned k = 0; k < 8; ++k) next[k] = sh.sums[k][lane];
      for (; r + 8 <= scrambles; r += 8) {
        u64 sum[8];
#pragma unroll
        for (unsigned k = 0; k < 8; ++k) sum[k] = next[k];
        if (r + 16 <= kRows) {
#pragma unroll
          for (unsigned k = 0; k < 8; ++k) next[k] = sh.sums[r + 8 + k][lane];
        }
#pragma unroll
        for (unsigned k = 0; k < 8; ++k) acc = xxh3::scramble(acc + sum[k], scramble_key);
      }
      for (; r < scrambles; ++r) acc = xxh3::scramble(acc + sh.sums[r][lane], scramble_key);
      if (scrambles < rows) acc += sh.sums[rows - 1][lane];
    }
    __syncthreads();  // the rows are refilled by the next pass
  }
  if (threadIdx.x < 8) sh.acc[lane] = acc;
  __syncthreads();
  return threadIdx.x == 0 ? xxh3::merge_keys(sh.acc, len, sh.merge_key) : 0;
}

constexpr u64 kCrcPiece = 256;
constexpr u64 kCrcSpan = kCrcPiece * kThreads;  // bytes per CRC block

// Shift factors the host computes once (a GF(2) power is a long chain of dependent steps: slow
// on one GPU thread): x^(8 * kCrcPiece * 2^k) for the tree's levels, x^(8 * kCrcSpan * 2^k) for
// the blocks' shifts.
struct CrcConsts {
  crc32::u32 level[16];
  crc32::u32 span[48];
};

// CrcConsts' tables: squares of x^(8 * kCrcPiece) and of x^(8 * kCrcSpan).
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
      // Eight words per round, all loaded before the first is used (one memory round trip per
      // round instead of one per word).
      auto feed = [&](u64 w) {  // eight bytes, lowest first
#pragma unroll
        for (int k = 0; k < 8; ++k)
          c = table[(c ^ static_cast<crc32::u32>(w >> (8 * k))) & 0xffu] ^ (c >> 8);
      };
      constexpr u64 kRound = 8;
      for (; i + 8 * kRound <= n; i += 8 * kRound) {
        u64 w[kRound];
#pragma unroll
        for (u64 j = 0; j < kRound; ++j) w[j] = xxh3::load64_aligned(p + i + 8 * j);
#pragma unroll
        for (u64 j = 0; j < kRound; ++j) feed(w[j]);
      }
      for (; i + 8 <= n; i += 8) feed(xxh3::load64_aligned(p + i));
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

// Payloads verified by one launch (verify_payloads_async, and each part of verify_payload_async):
// batch_hashes' blocks are every item's chunks of this launch in item order, then every item's
// CRC blocks of this launch. Each block counts itself in its item's counter (VerifyCounters:
// zero before an item's first launch); the item's last block, in whichever launch, hashes the
// chunk list, writes the verdict and zeroes the counter again. An item has at least one chunk
// block, so an empty payload gets its verdict too. Passed by value (kernel parameters: at most
// kMaxVerifyBatch items, ~1.9 KiB).
struct BatchItem {
  const u8* payload;
  u64 bytes, chunks;
  u64 chunk_first;  // this launch's first chunk of the item
  u64 chunk_base;   // the launch's block of that chunk
  u64* list;
  unsigned int* verdict;
  unsigned int* host_verdict;
  u64 expected;
  const u8* crc_data;
  u64 crc_len, crc_blocks;
  u64 crc_first;  // this launch's first CRC block of the item
  u64 crc_base;   // its index among the launch's CRC blocks
  unsigned int crc, crc_finish, with_crc;
  unsigned int units;  // the item's blocks over all its launches: chunk blocks and CRC blocks
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
    crc_pieces(it.crc_data, it.crc_len, it.crc_first + (c - it.crc_base), it.crc_blocks, consts,
               b.counters + 2 * i + 1);
  } else {
    while (i + 1 < b.count && block >= b.items[i + 1].chunk_base) ++i;
    const BatchItem& it = b.items[i];
    const u64 chunk = it.chunk_first + (block - it.chunk_base);
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

const xxh3::Secret& secret_bytes() {
  static const xxh3::Secret secret = xxh3::default_secret();
  return secret;
}

const CrcConsts& crc_tables() {
  static const CrcConsts powers = crc_powers();  // the same for every payload
  return powers;
}

// The launch-independent part of one item of batch_hashes: its payload, scratch, verdict and
// CRC claim, with `units` its blocks over all launches, after the checks verify_payload_async
// makes of one payload.
Status describe_item(const VerifyItem& v, BatchItem& it) noexcept {
  const Region payload = v.payload, scratch = v.scratch;
  if (payload.kind != MemoryKind::kDevice || scratch.kind != MemoryKind::kDevice)
    return Status::invalid("verify_payload_async: payload and scratch must be device memory");
  if (reinterpret_cast<std::uintptr_t>(payload.data) % 8 != 0 ||
      reinterpret_cast<std::uintptr_t>(scratch.data) % 8 != 0)
    return Status::invalid("verify_payload_async: payload and scratch must be 8-byte aligned");
  if (scratch.size < verify_scratch_bytes(payload.size))
    return Status::invalid("verify_payload_async: scratch smaller than verify_scratch_bytes()");
  if (v.crc != nullptr && v.crc->from > payload.size)
    return Status::invalid("verify_payload_async: CRC claim past the payload's end");
  it = BatchItem{};
  if (v.host_verdict != nullptr) {  // its device address: mapped pinned memory
    it.host_verdict = static_cast<unsigned int*>(rt::mapped_device_pointer(v.host_verdict));
    if (it.host_verdict == nullptr)
      return Status::invalid("verify_payload_async: the host verdict is not mapped pinned memory");
  }
  it.payload = reinterpret_cast<const u8*>(payload.data);
  it.bytes = payload.size;
  it.chunks = chunk_count(payload.size);
  it.verdict = reinterpret_cast<unsigned int*>(scratch.data);
  it.list = reinterpret_cast<u64*>(scratch.data + 8);
  it.expected = v.expected;
  if (v.crc != nullptr) {
    it.with_crc = 1;
    it.crc = v.crc->crc;
    it.crc_data = it.payload + v.crc->from;
    it.crc_len = payload.size - v.crc->from;
    it.crc_blocks = (it.crc_len + kCrcSpan - 1) / kCrcSpan;
    it.crc_finish = crc32::finish(0, it.crc_len);
  }
  const u64 units = std::max<u64>(1, it.chunks) + it.crc_blocks;
  if (units > 0x7fffffffu)
    return Status::invalid("verify_payload_async: payload of more than 2^31 chunks");
  it.units = static_cast<unsigned int>(units);
  return Status::ok();
}

Status check_counters(const VerifyCounters& counters, const Stream& s) noexcept {
  if (counters.words() == nullptr || counters.device() != s.device())
    return Status::invalid("verification counters not allocated on the stream's GPU");
  return Status::ok();
}

Status launch(const Batch& b, u64 blocks, const Stream& s) noexcept {
  if (blocks > 0x7fffffffu)
    return Status::invalid("verification of more than 2^31 chunks in one launch");
  batch_hashes<<<static_cast<unsigned>(blocks), kThreads, 0,
                 static_cast<rt::StreamHandle>(s.handle())>>>(b, secret_bytes(), crc_tables());
  TIER_GPU_TRY(rt::clear_last_error());
  return Status::ok();
}

}  // namespace

// Scratch: the verdict (4 bytes), 4 bytes unused (the list stays 8-byte aligned), the chunk list.
std::size_t verify_scratch_bytes(std::size_t payload_bytes) noexcept {
  return 8 + 8 * chunk_count(payload_bytes);
}

Status verify_payload_async(Region payload, std::uint64_t expected, Region scratch,
                            std::uint32_t* host_verdict, VerifyCounters& counters, const Stream& s,
                            const CrcClaim* crc, std::span<const Landing> landings) noexcept {
  TIER_RETURN_IF_ERROR(check_counters(counters, s));
  Batch b{};
  b.count = 1;
  b.counters = reinterpret_cast<unsigned int*>(counters.words());
  BatchItem& it = b.items[0];
  TIER_RETURN_IF_ERROR(describe_item(VerifyItem{payload, expected, scratch, host_verdict, crc}, it));
  for (std::size_t i = 0; i < landings.size(); ++i)
    if (landings[i].event == nullptr || landings[i].bytes > payload.size ||
        (i > 0 && landings[i].bytes < landings[i - 1].bytes))
      return Status::invalid("verify_payload_async: landings must grow within the payload");
  if (!landings.empty() && landings.back().bytes != payload.size)
    return Status::invalid("verify_payload_async: the last landing must be the whole payload");
  DeviceGuard guard(s.device());
  TIER_RETURN_IF_ERROR(guard.status());
  // Each launch takes the chunks and CRC blocks that lie wholly in the payload's first `landed`
  // bytes and no earlier launch took (the last one the rest, and an empty payload's one block).
  // CRC block k covers the claim's bytes [k * span - pad, (k + 1) * span - pad) (right-aligned:
  // crc_pieces).
  const u64 pad = it.crc_blocks * kCrcSpan - it.crc_len;
  u64 chunks_taken = 0, crc_taken = 0;
  auto launch_landed = [&](u64 landed) -> Status {
    const u64 chunk_to =
        landed == payload.size ? std::max<u64>(1, it.chunks) : landed / kChunkBytes;
    u64 crc_to = 0;
    if (crc != nullptr && landed >= crc->from)
      crc_to = std::min<u64>(it.crc_blocks, (landed - crc->from + pad) / kCrcSpan);
    it.chunk_first = chunks_taken;
    it.crc_first = crc_taken;
    b.chunk_blocks = chunk_to > chunks_taken ? chunk_to - chunks_taken : 0;
    const u64 crc_count = crc_to > crc_taken ? crc_to - crc_taken : 0;
    chunks_taken += b.chunk_blocks;
    crc_taken += crc_count;
    if (b.chunk_blocks + crc_count == 0) return Status::ok();
    return launch(b, b.chunk_blocks + crc_count, s);
  };
  if (landings.empty()) return launch_landed(payload.size);
  for (const Landing& l : landings) {
    auto part = [&]() -> Status {
      TIER_RETURN_IF_ERROR(stream_wait_event(s, l.event->handle()));
      return launch_landed(l.bytes);
    };
    const Status st = part();
    if (!st) {
      // The launches already enqueued counted part of the item: zero its words behind them.
      if (chunks_taken + crc_taken > 0) {
        const rt::Error zeroed = rt::memset_async(b.counters, 0, 2 * sizeof(unsigned int),
                                                  static_cast<rt::StreamHandle>(s.handle()));
        static_cast<void>(zeroed);  // the call's error is `st`
      }
      return st;
    }
  }
  return Status::ok();
}

Status load_verify_kernels() noexcept {
  TIER_GPU_TRY(rt::load_kernel(reinterpret_cast<const void*>(&batch_hashes)));
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
  TIER_RETURN_IF_ERROR(check_counters(counters, s));
  if (items.empty()) return Status::ok();
  Batch b{};
  b.count = static_cast<unsigned int>(items.size());
  b.counters = reinterpret_cast<unsigned int*>(counters.words());
  u64 chunk_blocks = 0, crc_blocks = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    BatchItem& it = b.items[i];
    TIER_RETURN_IF_ERROR(describe_item(items[i], it));
    it.chunk_base = chunk_blocks;
    it.crc_base = crc_blocks;
    chunk_blocks += it.units - it.crc_blocks;
    crc_blocks += it.crc_blocks;
  }
  b.chunk_blocks = chunk_blocks;
  DeviceGuard guard(s.device());
  TIER_RETURN_IF_ERROR(guard.status());
  return launch(b, chunk_blocks + crc_blocks, s);
}

}  // namespace tier::gpu
