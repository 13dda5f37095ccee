#!/usr/bin/env python3
"""Every argument of tierctl and tierbench, given hostile values (issue 26): no value may end a
tool with a signal (SIGSEGV, SIGABRT from an uncaught std::stoull or std::length_error) or hang
it. The flags come from the tools' own usage lines, so a new flag is covered as soon as it is
documented; each command runs from a small valid command line with one flag replaced.

  hostile_args_test.py TIERCTL TIERBENCH SOURCE_ROOT

Values: a negative number, numbers past 2^64 - 1, 2^64 - 1 itself, 0, junk with a byte that is
not UTF-8; positional paths: a FIFO, /dev/zero, a directory, a missing file, a non-UTF-8 name,
5,000 bytes. A tool may refuse (exit 1 or 2) or accept (exit 0, or 77 without a GPU); a signal, a
C++ "terminate called" or a run longer than 60 s fails. About 30 s on an idle 2-core machine.
"""

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

tierctl, tierbench, source = (os.path.abspath(a) for a in sys.argv[1:4])
profile = os.path.join(source, "profiles", "cpu.json")
work = tempfile.mkdtemp(prefix="libtier-hostile-")
fifo = os.path.join(work, "fifo")
os.mkfifo(fifo)
trace = os.path.join(work, "trace.jsonl")
with open(trace, "w") as f:
    f.write('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n')

VALUES = [b"-1", b"99999999999999999999999", b"18446744073709551615", b"0", b"x\xff,1"]
PATHS = [fifo.encode(), b"/dev/zero", work.encode(), os.path.join(work, "missing").encode(),
         work.encode() + b"/bad\xff",
         b"a" * 5000]

# A small valid command line per command: [positional...] and {flag: value}; None: a flag alone.
BASE = {
    (tierbench, "codec"): ([], {"blocks": "1", "rounds": "1"}),
    (tierbench, "disk_recovery"): ([], {"dir": os.path.join(work, "dr"), "objects": "8",
                                         "object-size": "4KiB"}),
    (tierbench, "forward"): ([], {"steps": "1", "iters": "1"}),
    (tierbench, "gpu"): ([], {"blocks": "1", "iters": "1"}),
    (tierbench, "micro"): ([], {"profile": profile, "tier": "cpu", "objects": "2",
                                "object-size": "4KiB", "rounds": "1"}),
    (tierbench, "replay"): ([], {"profile": profile, "trace": trace, "limit": "2"}),
    (tierbench, "verify"): ([], {"object-sizes": "64KiB", "threads": "1", "total": "256KiB",
                                 "rounds": "1"}),
    (tierctl, "check"): ([profile], {}),
    (tierctl, "disk"): (["inspect", work], {}),
    (tierctl, "explain"): ([profile], {}),
    (tierctl, "geometry"): ([], {"preset": "v4-pro-fp8"}),
    (tierctl, "key"): ([], {"namespace": '{"model": "m"}', "tokens": "1,2,3"}),
    (tierctl, "options"): (["cpu"], {}),
    (tierctl, "plugins"): ([], {}),
    (tierctl, "schema"): ([], {}),
    (tierctl, "shm"): (["inspect", "libtier-hostile-none"], {}),
    (tierctl, "sidecar_key"): ([], {"hash": "00", "fingerprint": "00" * 16}),
    (tierctl, "size"): ([], {"trace": trace}),
}
# Flags whose accepted values start long work on this machine: given hostile values only where
# the value must be refused.
SLOW_WHEN_VALID = {"seconds"}


def usage_flags(exe):
    """{command: [flag, ...]} from `exe help`."""
    out = subprocess.run([exe, "help"], capture_output=True, text=True, check=True).stdout
    flags = {}
    name = os.path.basename(exe)
    for line in out.splitlines():  # "  tierctl COMMAND ARGS", then its description
        m = re.match(r"\s+" + re.escape(name) + r" (\w+)(.*)", line)
        if m:
            flags[m.group(1)] = sorted(set(re.findall(r"--([a-z][a-z0-9-]*)", m.group(2))))
    return flags


def run(argv):
    env = dict(os.environ, TIER_SHM_SEGMENT="libtier-hostile-none")
    try:
        p = subprocess.run(argv, capture_output=True, timeout=60, env=env, cwd=work)
    except subprocess.TimeoutExpired:
        return argv, "hung (60 s)"
    text = p.stdout + p.stderr
    if p.returncode < 0:
        return argv, f"signal {-p.returncode}"
    if b"terminate called" in text or b"Assertion" in text:
        return argv, text.decode(errors="replace")[-300:]
    if p.returncode not in (0, 1, 2, 77):
        return argv, f"exit {p.returncode}: " + text.decode(errors="replace")[-300:]
    return argv, None


def lines():
    for exe in (tierctl, tierbench):
        for cmd, flags in usage_flags(exe).items():
            if (exe, cmd) not in BASE:
                raise SystemExit(f"FAIL: no base command line for {os.path.basename(exe)} {cmd}")
            pos, base = BASE[(exe, cmd)]

            def argv(over):
                a = [exe.encode(), cmd.encode()] + [p.encode() for p in pos]
                for k, v in {**base, **over}.items():
                    a += [b"--" + k.encode()] + ([] if v is None else
                                                 [v if isinstance(v, bytes) else v.encode()])
                return a

            for flag in flags:
                for v in VALUES:
                    if flag in SLOW_WHEN_VALID and v in (b"0", b"18446744073709551615"):
                        continue
                    yield argv({flag: v})
            for p in PATHS:  # hostile positional arguments (paths, names)
                if pos:
                    yield [exe.encode(), cmd.encode()] + [x.encode() for x in pos[:-1]] + [p]


failures = []
count = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for argv, why in pool.map(run, lines()):
        count += 1
        if why:
            failures.append(b" ".join(argv).decode(errors="replace")[:200] + ": " + why)
shutil.rmtree(work, ignore_errors=True)
for f in failures:
    print("FAIL:", f)
print(f"{count} command lines, {len(failures)} failures")
sys.exit(1 if failures else 0)
