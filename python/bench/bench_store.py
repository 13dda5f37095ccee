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
payload bytes (x SIZE / (SIZE + 96)) like the others. It also runs micro with --depth 64, as many
requests per submit as a save or load hands the tier (micro's default, the target's baseline, hands
it one at a time): the cpu tier moves the puts or gets of one submit at once on the verification
threads (backends/cpu/cpu_backend.hpp), so this column is the tier alone with the parallelism a
save gets, and Python's ratio to it the binding's and the stack's own cost. (Until
2026-12-02's sixth stop micro padded every image to 64 bytes, so its "same bytes" images of 64 KiB
payloads held 64 KiB + 32 B, two checksum chunks, whose tail went to the verification threads: a
third slower than one chunk. Micro now pads to the tier's alignment only, and payloads up to 1.5
chunks stay on the caller.) Each repeat starts every side in a process of its own (a process's
memory placement alone moves a side's rate by up to 2x on the device machine, so no side keeps one
placement for every repeat), and the sides take their rounds in turn: this script passes a turn
through pipes (micro's and c_api_bench's --turns), side after side, each round starting with the
next side, so that every side meets the same slow and fast moments of the shared machine (whose
memcpy rate moved between 10 and 19 GB/s from one process to the next here) instead of a second
of its own. The placement stays: with turns, the repeats of one run still spread 0.86-1.05x for
Python against micro's puts. Each side's figure of a repeat is its fastest of ROUNDS rounds
(micro's --best): a round of 16 MiB takes a few milliseconds, and one preemption on a shared 2-core
machine costs as much as the gap being measured, so every side gets the same chance to run one
round undisturbed. Each repeat gives the ratios Python / tierbench micro (both depths; issue 24 asks
for a median >= 0.95 of the first) and Python / C API (the binding's own overhead: both go through
the profile's TierStack, which tierbench micro does not). One more micro process per repeat runs
with --stack: the profile's TierStack (C++, identity codec) saving and loading the same objects on
the same tier and storage, rounds alternating with the tier alone, so that its ratio is the stack's
own cost without the placement of two processes' memory. Prints every repeat's ratios, then their
median and min-max; and the Store's staging_copy_bytes after the Python rounds (0: every byte moved
once, by the tier).

    python3 python/bench/bench_store.py --tierbench build/apps/tierbench/tierbench \
        --capi-bench build/tests/c/c_api_bench --profile profiles/cpu.json --tier cpu \
        --object-size 65536 --objects 256 --rounds 20 --repeat 5
"""

import argparse
import json
import os
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


def python_side(profile, n, size, rounds, turns=None):
    """Best round's GB/s of Store.save / Store.load of `n` numpy arrays of `size` bytes, and
    the Store's staging_copy_bytes afterwards. With `turns` (descriptors in, out) each round
    waits for a byte on `in` and writes one to `out` after it, as micro's --turns."""
    keys = [libtier.external_key(f"bench-{i}") for i in range(n)]
    src = [line_aligned(size) for _ in range(n)]
    for i, a in enumerate(src):
        a[:] = np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8)
    dst = [line_aligned(size) for _ in range(n)]
    out = {}
    with libtier.Store.open(profile) as store:
        for _ in range(rounds):
            if turns and os.read(turns[0], 1) != b".":
                raise SystemExit("the driver ended the run")
            store.remove(keys)
            t0 = time.perf_counter()
            codes = store.save(keys, src)
            t1 = time.perf_counter()
            loaded = store.load(keys, dst)
            t2 = time.perf_counter()
            if any(c != libtier.Code.OK for c in codes + loaded):
                raise SystemExit(f"errors: save {codes[:3]}..., load {loaded[:3]}...")
            out = best(out, {"put": n * size / (t1 - t0) / 1e9, "get": n * size / (t2 - t1) / 1e9})
            if turns:
                os.write(turns[1], b".")
        if not all(np.array_equal(a, b) for a, b in zip(src, dst)):
            raise SystemExit("wrong data")
        staging = store.metrics()["stack"]["staging_copy_bytes"]
    return out, staging


def in_turns(sides, rounds):
    """Runs every side's command at once, each in a process of its own, and passes them the turn
    ROUNDS times: a round of each side, one after the other, the k-th pass starting with side
    k mod len(sides). `sides` maps a name to a function of the turn descriptors (in, out) giving
    the command. Returns each side's standard output."""
    procs = {}
    try:
        for name, command in sides.items():
            turn_r, turn_w = os.pipe()  # this script -> the side: "your turn"
            done_r, done_w = os.pipe()  # the side -> this script: "round done"
            procs[name] = (subprocess.Popen(command(turn_r, done_w), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True,
                                            pass_fds=(turn_r, done_w)), turn_w, done_r)
            os.close(turn_r)
            os.close(done_w)
        order = list(procs)
        for r in range(rounds):
            k = r % len(order)
            for name in order[k:] + order[:k]:
                proc, turn_w, done_r = procs[name]
                os.write(turn_w, b".")
                if os.read(done_r, 1) != b".":
                    raise SystemExit(f"{name} side stopped in round {r + 1}: "
                                     f"{proc.communicate()[1].strip()}")
        outputs = {}
        for name, (proc, turn_w, done_r) in procs.items():
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{name} side failed ({proc.returncode}): {err.strip()}")
            outputs[name] = out
        return outputs
    finally:
        for proc, turn_w, done_r in procs.values():
            os.close(turn_w)
            os.close(done_r)
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def json_lines(out, field="gb_per_s"):
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
    ap.add_argument("--turns", help=argparse.SUPPRESS)  # IN,OUT of the Python side (in_turns)
    a = ap.parse_args(argv)
    if a.python_side:  # one repeat's Python side, in its own process (in_turns)
        turns = tuple(int(fd) for fd in a.turns.split(",")) if a.turns else None
        rates, staged = python_side(a.profile, a.objects, a.object_size, a.rounds, turns)
        print(json.dumps({"rates": rates, "staging_copy_bytes": staged}))
        return 0
    if not a.tierbench or not a.capi_bench:
        ap.error("--tierbench and --capi-bench are required")
    size, n, r = str(a.object_size), str(a.objects), str(a.rounds)
    runs = []  # per repeat: {"py", "capi", "micro", "micro_deep"} -> {op: GB/s}
    staging = 0
    same_bytes = a.object_size + HEADER_BYTES  # micro's image of a SIZE-byte payload

    def micro(*extra):
        return lambda i, o: [a.tierbench, "micro", "--profile", a.profile, "--tier", a.tier,
                             "--object-size", str(same_bytes), "--objects", n, "--rounds", r,
                             "--seal", "--best", "--json", "--turns", f"{i},{o}", *extra]

    sides = {
        "py": lambda i, o: [sys.executable, __file__, "--python-side", "--profile", a.profile,
                            "--objects", n, "--object-size", size, "--rounds", r,
                            "--turns", f"{i},{o}"],
        "capi": lambda i, o: [a.capi_bench, a.profile, n, size, r, str(i), str(o)],
        # micro on images of the same bytes as the others' (SIZE + header, its rate counted in
        # payload bytes): one request per submit, and 64 (a save's or load's submits).
        "micro": micro(),
        "micro_deep": micro("--depth", "64"),
        "stack": micro("--stack"),
    }
    for _ in range(a.repeat):
        out = in_turns(sides, a.rounds)
        py = json.loads(out["py"])
        staging = max(staging, py["staging_copy_bytes"])
        stack = json_lines(out["stack"], "ratio_to_tier")
        runs.append({"py": py["rates"], "capi": json_lines(out["capi"]),
                     **{name: {op: v * a.object_size / same_bytes
                               for op, v in json_lines(out[name]).items()}
                        for name in ("micro", "micro_deep")},
                     "stack": {"put": stack["stack_put"], "get": stack["stack_get"]}})
    print(f"{a.objects} objects of {a.object_size} bytes, tier {a.tier} of {a.profile}, "
          f"{a.repeat} repeats, each side's fastest of {a.rounds} rounds taken in turn (GB/s of "
          f"payload; micro: the tier alone on images of the same bytes, one request per submit; "
          f"micro d64: 64 per submit)")
    print(f"{'repeat':<6} {'op':<4} {'python':>7} {'C API':>7} {'micro':>7} {'micro d64':>10} "
          f"{'py/micro':>9} {'py/d64':>7} {'py/C API':>9} {'stack/tier':>10}")
    for i, run in enumerate(runs, 1):
        for op in ("put", "get"):
            py, capi, micro, deep = (run[k][op] for k in ("py", "capi", "micro", "micro_deep"))
            print(f"{i:<6} {op:<4} {py:>7.2f} {capi:>7.2f} {micro:>7.2f} {deep:>10.2f} "
                  f"{py / micro:>9.2f} {py / deep:>7.2f} {py / capi:>9.2f} "
                  f"{run['stack'][op]:>10.2f}")
    def spread(xs):
        return f"median {statistics.median(xs):.3f} [{min(xs):.2f}-{max(xs):.2f}]"
    for op in ("put", "get"):
        ratio = {k: [run["py"][op] / run[k][op] for run in runs]
                 for k in ("micro", "micro_deep", "capi")}
        stack = [run["stack"][op] for run in runs]
        print(f"{op}: python/micro {spread(ratio['micro'])} (target >= 0.95), python/micro d64 "
              f"{spread(ratio['micro_deep'])}, python/C API {spread(ratio['capi'])}, stack/tier "
              f"(one process, same storage) {spread(stack)}")
    print(f"staging_copy_bytes after the Python rounds: {staging} (0: one copy, by the tier)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
