#!/usr/bin/env python3
"""Python save/load throughput against `tierbench micro` on the same tier (make bench).

Saves then loads N objects of SIZE bytes from numpy arrays (each starting on a 64-byte line, as
torch's CPU tensors, c_api_bench's buffers and micro's payloads do) through libtier.Store (one batch
each, the keys removed between rounds), the C API's c_api_bench doing the same from C, and
`tierbench micro --seal --json` (the tier's backend alone) with the same profile, tier, size and
count. The work is the same on both sides: a put stores a freshly sealed image (micro's --seal times
the payload checksum and header inside its put phase, as a save computes them: on a tier that
seals puts, such as the cpu tier, by the tier as it copies the payload), and a get is a
verified read into distinct destination buffers. The images are the same too: micro's objects are
whole images, so its --object-size is SIZE plus the 96-byte header, and its rate is counted in
payload bytes (x SIZE / (SIZE + 96)) like the others. It also runs micro with SIZE-byte images (96
payload bytes fewer: the baseline before 2026-12-02's fifth stop) and prints both. (Until
2026-12-02's sixth stop micro padded every image to 64 bytes, so its "same bytes" images of 64 KiB
payloads held 64 KiB + 32 B, two checksum chunks, whose tail went to the verification threads: a
third slower than one chunk. Micro now pads to the tier's alignment only, and payloads up to 1.5
chunks stay on the caller.) The sides run in turn, REPEAT times, each in a process of its own (a
process's memory placement alone moves a side's rate by up to 2x on the device machine, so no side
keeps one placement for every repeat), and each side's figure of a repeat is its fastest of ROUNDS
rounds (micro's --best): a round of 16 MiB takes a few milliseconds, and one preemption on a shared
2-core machine costs as much as the gap being measured, so every side gets the same chance to run
one round undisturbed. Each repeat gives the ratios Python / tierbench micro (both baselines; issue
24 asks for a median >= 0.95) and Python / C API (the binding's own overhead: both go through the
profile's TierStack, which tierbench micro does not). A third micro process per repeat runs with
--stack: the profile's TierStack (C++, identity codec) saving and loading the same objects on the
same tier and storage, rounds alternating with the tier alone, so that its ratio is the stack's own
cost without the placement of two processes' memory. Prints every repeat's ratios, then their
median and min-max; and the Store's staging_copy_bytes after the Python rounds (0: every byte moved
once, by the tier).

    python3 python/bench/bench_store.py --tierbench build/apps/tierbench/tierbench \
        --capi-bench build/tests/c/c_api_bench --profile profiles/cpu.json --tier cpu \
        --object-size 65536 --objects 256 --rounds 20 --repeat 5
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import libtier

HEADER_BYTES = 96  # the object header before every payload in a tier (docs/object-format.md)


def line_aligned(size, line=64):
    """An uninitialised uint8 array of `size` bytes starting on a 64-byte line, as torch's CPU
    allocator and tierbench micro give (numpy's own start anywhere on a 16-byte boundary)."""
    raw = np.empty(size + line, dtype=np.uint8)
    off = -raw.ctypes.data % line
    return raw[off:off + size]


def python_side(profile, n, size, rounds):
    """Best round's GB/s of Store.save / Store.load of `n` numpy arrays of `size` bytes, and
    the Store's staging_copy_bytes afterwards."""
    keys = [libtier.external_key(f"bench-{i}") for i in range(n)]
    src = [line_aligned(size) for _ in range(n)]
    for i, a in enumerate(src):
        a[:] = np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8)
    dst = [line_aligned(size) for _ in range(n)]
    out = {}
    with libtier.Store.open(profile) as store:
        for _ in range(rounds):
            store.remove(keys)
            t0 = time.perf_counter()
            codes = store.save(keys, src)
            t1 = time.perf_counter()
            loaded = store.load(keys, dst)
            t2 = time.perf_counter()
            if any(c != libtier.Code.OK for c in codes + loaded):
                raise SystemExit(f"errors: save {codes[:3]}..., load {loaded[:3]}...")
            out = best(out, {"put": n * size / (t1 - t0) / 1e9, "get": n * size / (t2 - t1) / 1e9})
        if not all(np.array_equal(a, b) for a, b in zip(src, dst)):
            raise SystemExit("wrong data")
        staging = store.metrics()["stack"]["staging_copy_bytes"]
    return out, staging


def python_process(profile, n, size, rounds):
    """python_side() in a fresh process (this script with --python-side)."""
    out = subprocess.run(
        [sys.executable, __file__, "--python-side", "--profile", profile, "--objects", str(n),
         "--object-size", str(size), "--rounds", str(rounds)],
        check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return r["rates"], r["staging_copy_bytes"]


def json_lines(cmd, field="gb_per_s"):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["op"]: r[field] for r in (json.loads(line) for line in out.splitlines() if line)
            if field in r}


def best(a, b):
    return {op: max(a.get(op, 0.0), b.get(op, 0.0)) for op in ("put", "get")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tierbench")
    ap.add_argument("--capi-bench")
    ap.add_argument("--python-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--tier", default="cpu")
    ap.add_argument("--object-size", type=int, default=64 << 10)
    ap.add_argument("--objects", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args(argv)
    if a.python_side:  # one repeat's Python side, in its own process (python_process)
        rates, staged = python_side(a.profile, a.objects, a.object_size, a.rounds)
        print(json.dumps({"rates": rates, "staging_copy_bytes": staged}))
        return 0
    if not a.tierbench or not a.capi_bench:
        ap.error("--tierbench and --capi-bench are required")
    size, n, r = str(a.object_size), str(a.objects), str(a.rounds)
    runs = []  # per repeat: {"py", "capi", "micro", "micro_size"} -> {op: GB/s}
    staging = 0
    for _ in range(a.repeat):
        py, staged = python_process(a.profile, a.objects, a.object_size, a.rounds)
        staging = max(staging, staged)
        capi = json_lines([a.capi_bench, a.profile, n, size, r])
        # micro twice: images of the same bytes as the others' (SIZE + header, its rate counted
        # in payload bytes), and SIZE-byte images (the figure before 2026-12-02's fifth stop).
        micro = {}
        for name, image in (("micro", a.object_size + HEADER_BYTES), ("micro_size", a.object_size)):
            rates = json_lines(
                [a.tierbench, "micro", "--profile", a.profile, "--tier", a.tier, "--object-size",
                 str(image), "--objects", n, "--rounds", r, "--seal", "--best", "--json"])
            micro[name] = {op: v * a.object_size / image for op, v in rates.items()}
        stack = json_lines(
            [a.tierbench, "micro", "--profile", a.profile, "--tier", a.tier, "--object-size",
             str(a.object_size + HEADER_BYTES), "--objects", n, "--rounds", r, "--seal", "--best",
             "--stack", "--json"], "ratio_to_tier")
        runs.append({"py": py, "capi": capi, **micro,
                     "stack": {"put": stack["stack_put"], "get": stack["stack_get"]}})
    print(f"{a.objects} objects of {a.object_size} bytes, tier {a.tier} of {a.profile}, "
          f"{a.repeat} repeats, each side's fastest of {a.rounds} rounds per repeat (GB/s of "
          f"payload; micro: images of the same bytes, micro@{a.object_size}: images of "
          f"{a.object_size} bytes)")
    print(f"{'repeat':<6} {'op':<4} {'python':>7} {'C API':>7} {'micro':>7} "
          f"{'micro@' + size:>12} {'py/micro':>9} {'py/micro@':>10} {'py/C API':>9} "
          f"{'stack/tier':>10}")
    for i, run in enumerate(runs, 1):
        for op in ("put", "get"):
            py, capi, micro, micro_size = (run[k][op]
                                           for k in ("py", "capi", "micro", "micro_size"))
            print(f"{i:<6} {op:<4} {py:>7.2f} {capi:>7.2f} {micro:>7.2f} {micro_size:>12.2f} "
                  f"{py / micro:>9.2f} {py / micro_size:>10.2f} {py / capi:>9.2f} "
                  f"{run['stack'][op]:>10.2f}")
    def spread(xs):
        return f"median {statistics.median(xs):.3f} [{min(xs):.2f}-{max(xs):.2f}]"
    for op in ("put", "get"):
        ratio = {k: [run["py"][op] / run[k][op] for run in runs]
                 for k in ("micro", "micro_size", "capi")}
        stack = [run["stack"][op] for run in runs]
        print(f"{op}: python/micro {spread(ratio['micro'])} (target >= 0.95), python/micro@{size} "
              f"{spread(ratio['micro_size'])}, python/C API {spread(ratio['capi'])}, stack/tier "
              f"(one process, same storage) {spread(stack)}")
    print(f"staging_copy_bytes after the Python rounds: {staging} (0: one copy, by the tier)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
