#!/usr/bin/env python3
"""Python save/load throughput against `tierbench micro` on the same tier (make bench).

Saves then loads N objects of SIZE bytes from numpy arrays through libtier.Store (one batch
each, the keys removed between rounds), the C API's c_api_bench doing the same from C, and
`tierbench micro --seal --json` (the tier's backend alone) with the same profile, tier, size and
count. The work is the same on both sides: a put stores a freshly sealed image (micro's --seal
times the payload checksum and header inside its put phase, as a save computes them), and a get
is a verified read into distinct destination buffers. The three run in turn, REPEAT times, and
each side's figure of a repeat is its fastest of ROUNDS rounds (micro's --best): a round of 16 MiB
takes a few milliseconds, and one preemption on a shared 2-core machine costs as much as the gap
being measured, so every side gets the same chance to run one round undisturbed. Each repeat
gives the ratios Python / tierbench micro (the acceptance figure of issue 24: median >= 0.95) and
Python / C API (the binding's own overhead: both go through the profile's TierStack, which
tierbench micro does not). Prints every repeat's ratios, then their median and min-max; and the Store's
staging_copy_bytes after the Python rounds (0: every byte moved once, by the tier).

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


def python_side(profile, n, size, rounds):
    """Best round's GB/s of Store.save / Store.load of `n` numpy arrays of `size` bytes, and
    the Store's staging_copy_bytes afterwards."""
    keys = [libtier.external_key(f"bench-{i}") for i in range(n)]
    src = [np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8) for i in range(n)]
    dst = [np.empty(size, dtype=np.uint8) for _ in range(n)]
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


def json_lines(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["op"]: r["gb_per_s"] for r in (json.loads(line) for line in out.splitlines() if line)}


def best(a, b):
    return {op: max(a.get(op, 0.0), b.get(op, 0.0)) for op in ("put", "get")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tierbench", required=True)
    ap.add_argument("--capi-bench", required=True)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--tier", default="cpu")
    ap.add_argument("--object-size", type=int, default=64 << 10)
    ap.add_argument("--objects", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args(argv)
    size, n, r = str(a.object_size), str(a.objects), str(a.rounds)
    runs = []  # per repeat: {"py", "capi", "micro"} -> {op: GB/s}
    staging = 0
    for _ in range(a.repeat):
        py, staged = python_side(a.profile, a.objects, a.object_size, a.rounds)
        staging = max(staging, staged)
        capi = json_lines([a.capi_bench, a.profile, n, size, r])
        micro = json_lines(
            [a.tierbench, "micro", "--profile", a.profile, "--tier", a.tier, "--object-size", size,
             "--objects", n, "--rounds", r, "--seal", "--best", "--json"])
        runs.append({"py": py, "capi": capi, "micro": micro})
    print(f"{a.objects} objects of {a.object_size} bytes, tier {a.tier} of {a.profile}, "
          f"{a.repeat} repeats, each side's fastest of {a.rounds} rounds per repeat")
    print(f"{'repeat':<6} {'op':<4} {'python GB/s':>12} {'C API GB/s':>11} {'micro GB/s':>11} "
          f"{'python/micro':>13} {'python/C API':>13}")
    for i, run in enumerate(runs, 1):
        for op in ("put", "get"):
            py, capi, micro = run["py"][op], run["capi"][op], run["micro"][op]
            print(f"{i:<6} {op:<4} {py:>12.2f} {capi:>11.2f} {micro:>11.2f} "
                  f"{py / micro:>13.2f} {py / capi:>13.2f}")
    for op in ("put", "get"):
        vs_micro = [run["py"][op] / run["micro"][op] for run in runs]
        vs_capi = [run["py"][op] / run["capi"][op] for run in runs]
        print(f"{op}: python/micro median {statistics.median(vs_micro):.2f} "
              f"[{min(vs_micro):.2f}-{max(vs_micro):.2f}] (target >= 0.95), python/C API median "
              f"{statistics.median(vs_capi):.2f} [{min(vs_capi):.2f}-{max(vs_capi):.2f}]")
    print(f"staging_copy_bytes after the Python rounds: {staging} (0: one copy, by the tier)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
