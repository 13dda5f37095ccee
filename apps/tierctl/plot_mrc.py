#!/usr/bin/env python3
"""Draws a miss-ratio curve as a PNG for `tierctl size --plot FILE.png` (docs/sizing.md).

Usage: plot_mrc.py OUT.png < plot.json    the curve from tierctl (blocks, miss_ratio, knee, at)
       plot_mrc.py --check                exit 0 when matplotlib can be imported
Exit status 3: matplotlib is missing (Debian: apt-get install python3-matplotlib).
"""
import json
import sys


def main():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if sys.argv[1:] != ["--check"]:  # tierctl tries another Python after a failed check
            print("plot_mrc.py: matplotlib is missing (apt-get install python3-matplotlib)",
                  file=sys.stderr)
        return 3
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "--check":
        return 0
    d = json.load(sys.stdin)
    title = d["title"]
    if d["error"] > 0:
        title += " (sampled: +/-%.3f)" % d["error"]
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
    ax.step(d["blocks"], d["miss_ratio"], where="post", color="#1f77b4", linewidth=2)
    for key, color in (("knee", "#d62728"), ("at", "#2ca02c")):
        p = d[key]
        if p is None:
            continue
        label = ("knee: " if key == "knee" else "") + "%d blocks, miss %.3f" % (
            p["blocks"], p["miss_ratio"])
        ax.plot([p["blocks"]], [p["miss_ratio"]], "o", color=color, label=label)
    ax.set_xlim(0, d["blocks"][-1])
    ax.set_ylim(0, 1)
    ax.set_xlabel(d["x_label"])
    ax.set_ylabel("miss ratio")
    ax.set_title(title)
    ax.grid(True, color="#dddddd")
    if d["knee"] is not None or d["at"] is not None:
        ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
