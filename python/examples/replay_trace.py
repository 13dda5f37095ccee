#!/usr/bin/env python3
"""Replays a Mooncake-format conversation trace through the libtier package.

The same workload as `tierbench replay --profile P --trace T` (apps/tierbench/replay_cmd.cpp),
call for call, so its hit counts equal tierbench's on the same profile and block size:

- a request's blocks are its `hash_ids`; block i's key is the chained chunk key of the ids
  [0, i] in chunks of one token (tier::chunk_key(ns, parent, [id])), in the namespace of
  {"workload": "tierbench-replay", "block_tokens": 512, "block_bytes": B};
- per request: lookup_prefix of its keys; load of the leading hits into one numpy buffer per
  block (a block counts as served while the loads succeed in order, and is checked); save of the
  blocks from the first one not served on (put-if-absent); progress();
- at the end, flush (up to 60 s).

    python3 python/examples/replay_trace.py --profile profiles/cpu.json \
        --trace ../shared/data/mooncake_conversation_trace.jsonl [--limit N] [--block-bytes B]
        [--json]
"""

import argparse
import json
import sys
import time

import numpy as np

import libtier

BLOCK_TOKENS = 512  # tokens per hash id in the trace (apps/tierbench/workload.hpp)


def parse_size(text):
    units = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit in sorted(units, key=len, reverse=True):
        if unit and text.endswith(unit):
            return int(text[: -len(unit)]) * units[unit]
    return int(text)


def load_trace(path, limit):
    requests = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            requests.append(json.loads(line)["hash_ids"])
            if limit and len(requests) == limit:
                break
    return requests


def block_content(key, block_bytes):
    """The bytes saved for a block: its key's 16 bytes repeated, so a load can be checked."""
    pattern = np.frombuffer(bytes.fromhex(key), dtype=np.uint8)
    return np.tile(pattern, block_bytes // 16 + 1)[:block_bytes]


def replay(store, requests, block_bytes):
    ns = libtier.namespace_id(
        {"workload": "tierbench-replay", "block_tokens": BLOCK_TOKENS, "block_bytes": block_bytes}
    )
    tiers = store.tier_names
    tier_hits = [0] * len(tiers)
    blocks = hit_blocks = failed_loads = failed_saves = wrong_data = 0
    t0 = time.perf_counter()
    for hash_ids in requests:
        keys = libtier.chunk_keys(ns, hash_ids, 1)
        blocks += len(keys)
        hits = store.lookup_prefix(keys)
        served = 0
        if hits:
            buffers = [np.empty(block_bytes, dtype=np.uint8) for _ in range(hits)]
            codes, served_by = store.load_with_tiers(keys[:hits], buffers)
            while served < hits and codes[served] == libtier.Code.OK:
                tier_hits[served_by[served]] += 1
                if not np.array_equal(buffers[served], block_content(keys[served], block_bytes)):
                    wrong_data += 1
                served += 1
            failed_loads += hits - served
            hit_blocks += served
        if served < len(keys):
            to_save = keys[served:]
            buffers = [block_content(k, block_bytes) for k in to_save]
            codes = store.save(to_save, buffers)
            failed_saves += sum(1 for c in codes if c != libtier.Code.OK)
        store.progress()
    store.flush(60.0)
    return {
        "requests": len(requests),
        "blocks": blocks,
        "hit_blocks": hit_blocks,
        "hit_rate": hit_blocks / blocks if blocks else 0.0,
        "block_bytes": block_bytes,
        "seconds": time.perf_counter() - t0,
        "failed_loads": failed_loads,
        "failed_saves": failed_saves,
        "wrong_data": wrong_data,
        "tiers": {
            name: {"hit_blocks": tier_hits[i], "hit_rate": tier_hits[i] / blocks if blocks else 0.0}
            for i, name in enumerate(tiers)
        },
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--block-bytes", default="64KiB")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    block_bytes = parse_size(args.block_bytes)
    requests = load_trace(args.trace, args.limit)
    with libtier.Store.open(args.profile) as store:
        out = replay(store, requests, block_bytes)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"replay: {out['requests']} requests, {out['blocks']} blocks of {block_bytes} bytes, "
            f"{out['seconds']:.1f} s"
        )
        print(f"{'tier':<10} {'hit blocks':>12} {'hit rate':>9}")
        for name, t in out["tiers"].items():
            print(f"{name:<10} {t['hit_blocks']:>12} {100 * t['hit_rate']:>8.2f}%")
        print(f"{'total':<10} {out['hit_blocks']:>12} {100 * out['hit_rate']:>8.2f}%")
        print(
            f"failed loads {out['failed_loads']}, failed saves {out['failed_saves']}, "
            f"wrong data {out['wrong_data']}"
        )
    return 0 if out["wrong_data"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
