#!/usr/bin/env python3
"""N Python threads on one libtier.Store against N threads' numpy copies (make bench).

For each N of --threads: N threads each save, then load, their own OBJECTS numpy arrays of
SIZE bytes through one Store (the profile's tiers; batches of --batch arrays per call, the GIL
released during every transfer), beside N threads copying the same arrays with numpy.copyto in
the same round (numpy releases the GIL too): the baseline. One warm-up round, then ROUNDS
measured rounds; prints each N's median GB/s, the median ratio to the numpy copy with its
min-max over the rounds, and its throughput against N/2's in the same round (each round runs
every N in turn, so a drift of the host's load falls on all of them alike). The last load of
every N is compared with the saved bytes.

    PYTHONPATH=build/python TIER_PLUGIN_DIR=build/libtier/plugins python3 \\
        python/bench/bench_threads.py --profile profiles/cpu.json --threads 1,2,4,8,16
"""

import argparse
import json
import statistics
import sys
import threading
import time

import numpy as np

import libtier


class Crew:
    """Threads that run one phase at a time; run() returns the phase's wall-clock seconds."""

    def __init__(self, size):
        self.start = threading.Barrier(size + 1)
        self.done = threading.Barrier(size + 1)
        self.work = None
        self.active = 0
        self.errors = []
        self.threads = [threading.Thread(target=self._loop, args=(t,), daemon=True)
                        for t in range(size)]
        for t in self.threads:
            t.start()

    def _loop(self, t):
        while True:
            self.start.wait()
            work = self.work
            if work is None:
                return
            if t < self.active:
                try:
                    work(t)
                except Exception as e:  # reported by the main thread
                    self.errors.append(f"thread {t}: {e!r}")
            self.done.wait()

    def run(self, n, work):
        self.active, self.work = n, work
        self.start.wait()
        t0 = time.perf_counter()
        self.done.wait()
        return time.perf_counter() - t0

    def stop(self):
        self.work = None
        self.start.wait()
        for t in self.threads:
            t.join()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--object-size", type=int, default=1 << 20)
    ap.add_argument("--objects", type=int, default=64, help="per thread")
    ap.add_argument("--batch", type=int, default=8, help="arrays per save/load call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON line per N")
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.threads.split(",")]
    if not counts or min(counts) < 1 or a.objects < 1 or a.batch < 1 or a.rounds < 1:
        ap.error("--threads, --objects, --batch and --rounds must be positive")
    most, per, size = max(counts), a.objects, a.object_size
    rng = np.random.default_rng(7)
    src = [[rng.integers(0, 256, size, dtype=np.uint8) for _ in range(per)] for _ in range(most)]
    dst = [[np.zeros(size, dtype=np.uint8) for _ in range(per)] for _ in range(most)]
    keys = [[libtier.external_key(f"bench-threads-{t}-{i}") for i in range(per)]
            for t in range(most)]
    batches = [(i, min(i + a.batch, per)) for i in range(0, per, a.batch)]
    crew = Crew(most)
    bad = []

    def copy(t):
        for s, d in zip(src[t], dst[t]):
            np.copyto(d, s)

    def save(t):
        for i, j in batches:
            codes = store.save(keys[t][i:j], src[t][i:j])
            if any(c != libtier.Code.OK for c in codes):
                bad.append(f"save: {codes}")

    def load(t):
        for i, j in batches:
            codes = store.load(keys[t][i:j], dst[t][i:j])
            if any(c != libtier.Code.OK for c in codes):
                bad.append(f"load: {codes}")

    def clear(t):
        for d in dst[t]:
            d.fill(0)

    def check_and_remove(t):
        if not all(np.array_equal(s, d) for s, d in zip(src[t], dst[t])):
            bad.append(f"thread {t}: a load's bytes differ from the save's")
        store.remove(keys[t])

    def remove(t):
        store.remove(keys[t])

    if not a.json:
        print(f"one libtier.Store ({a.profile}) shared by N Python threads, {per} arrays of "
              f"{size} bytes per thread, {a.batch} per call; ratio = GB/s / GB/s of N threads' "
              f"numpy.copyto of the same arrays in the same round, median [min-max] of "
              f"{a.rounds} rounds after a warm-up round, each round running every N in turn; "
              f"vs N/2 = GB/s / GB/s of N/2 threads in the same round")
        print(f"{'threads':>7}  {'numpy GB/s':>10}  {'save GB/s':>9}  {'save/numpy':>18}  "
              f"{'load GB/s':>9}  {'load/numpy':>18}  {'save vs N/2':>18}  "
              f"{'load vs N/2':>18}")
    # Every round runs every N in turn, so a drift of the shared host falls on N and N/2 alike.
    rounds = {n: [] for n in counts}
    with libtier.Store.open(a.profile) as store:
        for r in range(a.rounds + 1):
            last = r == a.rounds
            for n in counts:
                total = n * per * size / 1e9
                g = {"numpy": total / crew.run(n, copy), "save": total / crew.run(n, save)}
                if last:
                    crew.run(n, clear)
                g["load"] = total / crew.run(n, load)
                crew.run(n, check_and_remove if last else remove)
                if r > 0:
                    rounds[n].append(g)
    for n in counts:
        mine = rounds[n]
        half = rounds.get(n // 2) if n % 2 == 0 else None
        med = {k: statistics.median(g[k] for g in mine) for k in ("numpy", "save", "load")}
        ratio = {k: [g[k] / g["numpy"] for g in mine] for k in ("save", "load")}
        vs_half = {k: [g[k] / h[k] for g, h in zip(mine, half)] if half else None
                   for k in ("save", "load")}
        row = {"threads": n, "object_bytes": size, "objects_per_thread": per,
               "numpy_gb_per_s": med["numpy"], "save_gb_per_s": med["save"],
               "load_gb_per_s": med["load"],
               **{f"{k}_ratio": statistics.median(v) for k, v in ratio.items()},
               **{f"{k}_ratio_min": min(v) for k, v in ratio.items()},
               **{f"{k}_ratio_max": max(v) for k, v in ratio.items()},
               **{f"{k}_vs_half": statistics.median(v) if v else None
                  for k, v in vs_half.items()}}
        if a.json:
            print(json.dumps(row), flush=True)
            continue

        def cell(v):
            if not v:
                return "-"
            return f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"

        print(f"{n:>7}  {med['numpy']:>10.2f}  {med['save']:>9.2f}  {cell(ratio['save']):>18}  "
              f"{med['load']:>9.2f}  {cell(ratio['load']):>18}  {cell(vs_half['save']):>18}  "
              f"{cell(vs_half['load']):>18}", flush=True)
    crew.stop()
    problems = crew.errors + bad
    if problems:
        print(f"{len(problems)} failures; first: {problems[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
