#!/usr/bin/env python3
"""Python save/load throughput against `tierbench micro` on the same tier (make bench).

Saves then loads N objects of SIZE bytes from numpy arrays through libtier.Store (one batch
each, the keys removed between rounds), the C API's c_api_bench doing the same from C, and
`tierbench micro --seal --json` (the tier's backend alone) with the same profile, tier, size and
count. The work is the same on both sides: a put stores a freshly sealed image (micro's --seal
times the payload checksum and header inside its put phase, as a save computes them), and a get
is a verified read into distinct destination buffers. The three run in turn, REPEAT times, and
each reports its best round (the build machine is shared, so single rounds vary a lot). Prints
each side's GB/s and the ratios Python / tierbench micro (the acceptance figure, target >= 0.8)
and Python / C API (the binding's own overhead: both go through the profile's TierStack, which
tierbench micro does not).

    python3 python/bench/bench_store.py --tierbench build/apps/tierbench/tierbench \
        --capi-bench build/tests/c/c_api_bench --profile profiles/cpu.json --tier cpu \
        --object-size 65536 --objects 256 --rounds 5 --repeat 3
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

import libtier


def python_side(profile, n, size, rounds):
    """Best round's GB/s of Store.save / Store.load of `n` numpy arrays of `size` bytes."""
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
    return out


def json_lines(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["op"]: r["gb_per_s"] for r in (json.loads(line) for line in out.splitlines() if line)}


def best(a, b):
    return {op: max(a.get(op, 0.0), b.get(op, 0.0)) for op in ("put", "get")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tierbench", required=True)
    ap.add_argument("--capi-bench", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--tier", default="cpu")
    ap.add_argument("--object-size", type=int, default=64 << 10)
    ap.add_argument("--objects", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    py, capi, micro = {}, {}, {}
    size, n, r = str(a.object_size), str(a.objects), str(a.rounds)
    for _ in range(a.repeat):
        py = best(py, python_side(a.profile, a.objects, a.object_size, a.rounds))
        capi = best(capi, json_lines([a.capi_bench, a.profile, n, size, r]))
        micro = best(micro, json_lines(
            [a.tierbench, "micro", "--profile", a.profile, "--tier", a.tier, "--object-size", size,
             "--objects", n, "--rounds", r, "--seal", "--json"]))
    print(f"{a.objects} objects of {a.object_size} bytes, tier {a.tier} of {a.profile}, "
          f"best of {a.repeat} x {a.rounds} rounds")
    print(f"{'op':<4} {'python GB/s':>12} {'C API GB/s':>11} {'micro GB/s':>11} "
          f"{'python/micro':>13} {'python/C API':>13}")
    for op in ("put", "get"):
        print(f"{op:<4} {py[op]:>12.2f} {capi[op]:>11.2f} {micro[op]:>11.2f} "
              f"{py[op] / micro[op]:>13.2f} {py[op] / capi[op]:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
