#!/usr/bin/env python3
"""Summary of a .ci/gpu-trace/run CSV: the host-to-device DMAs of 1 MiB or more, grouped into
transfers (DMAs less than GAP us apart; GAP is the second argument, default 50), each with its DMA
count, bytes, span, the DMAs' own rate, the gaps between them, and the GPU work in the 100 us after
its last DMA (the transfer's tail); then the DMAs' median rate by size (the cost of splitting a
transfer into DMAs).

    python3 .ci/gpu-trace/summary.py OUT.csv [GAP]
"""
import bisect
import collections
import statistics
import sys


def load(path):
    dmas, kernels = [], []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split(",")
            if p[0] == "M" and p[5] == "1" and int(p[4]) >= 1 << 20:
                dmas.append((int(p[1]), int(p[2]), int(p[3]), int(p[4])))
            elif p[0] == "K":
                kernels.append((int(p[1]), int(p[2]), int(p[3]), ",".join(p[5:])))
    return sorted(dmas), sorted(kernels)


def main(path, gap_us=50.0):
    dmas, kernels = load(path)
    groups = []
    for d in dmas:
        if groups and d[0] - groups[-1][-1][1] < gap_us * 1e3:
            groups[-1].append(d)
        else:
            groups.append([d])
    by_size = collections.defaultdict(list)
    for g in groups:
        nbytes = sum(d[3] for d in g)
        busy = sum(d[1] - d[0] for d in g)
        gaps = [b[0] - a[1] for a, b in zip(g, g[1:])]
        end = g[-1][1]
        print(f"{len(g):3d} DMAs {nbytes / 2**20:8.1f} MiB span {(end - g[0][0]) / 1e3:9.1f} us"
              f"  DMAs at {nbytes / busy:5.2f} GB/s"
              + (f"  gaps {sum(gaps) / 1e3:6.1f} us (median {statistics.median(gaps) / 1e3:.1f})"
                 if gaps else ""))
        # The kernels are sorted by start: those starting in the 100 us after the last DMA.
        tail = kernels[bisect.bisect_left(kernels, (end,)):
                       bisect.bisect_left(kernels, (end + 100_000,))]
        for s, e, stream, name in tail:
            print(f"      +{(s - end) / 1e3:6.1f} .. +{(e - end) / 1e3:6.1f} us  stream {stream} "
                  f"{name[:70]}")
        for d in g:
            by_size[round(d[3] / 2**20, 2)].append(d[3] / (d[1] - d[0]))
    print("DMA rate by size (MiB: median GB/s, count):",
          ", ".join(f"{k}: {statistics.median(v):.2f} ({len(v)})" for k, v in sorted(by_size.items())))


if __name__ == "__main__":
    main(sys.argv[1], *(float(a) for a in sys.argv[2:3]))
