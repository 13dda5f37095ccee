#!/usr/bin/env python3
"""A real model's KV cache through libtier: greedy tokens identical with and without offload.

A small Llama (transformers' LlamaConfig, randomly initialised with a fixed seed: nothing is
downloaded) runs on the GPU three times on the same random prompt:

- plain: prefill, then greedy decode of --new-tokens tokens; the reference;
- mode (a), the fast path from a pinned tier: after prefill, the whole prompt's KV is saved to a
  CPU tier in page-locked memory ("pinned": true) in one call, the GPU tensors are freed, and the
  whole prefix is restored into fresh GPU tensors in ONE batched Store.load call before decoding.
  The tier moves each object with its DMA into the GPU's staging ring, verifies it on the GPU and
  writes the tensors with one gated copy kernel per batch of objects (docs/integration.md, "The
  fast path"); no byte goes through pageable memory or Python;
- mode (b), across processes from a disk tier: after prefill, the KV is saved to a disk tier, every
  GPU KV tensor is dropped, and a fresh Python process (this script with --resume) rebuilds the
  model from the seed, allocates the KV tensors and registers them with the store (as an engine
  does when it allocates its KV: the GPU's copy resources are prepared then), restores the whole
  prefix from the disk tier into them in one call and decodes. It reports the restore's rate
  against the disk's own read rate for the same bytes: the tier's data file read right after the
  restore with O_DIRECT, 4 MiB blocks, one reader (what `dd iflag=direct bs=4M` reads), four times
  over: the bytes of the four passes over their time (each pass's rate is reported too; a virtual
  disk may alternate between a fast and a slow pass). For reference it also reports the rate of
  reading a file just written (on a virtual disk that rate need not be the tier's data's).

Both modes must produce exactly the plain run's tokens, and bit for bit the same logits at every
decode step (compared through a SHA-256 of them; exit status 1 otherwise). Each object is one
layer's K and V of one chunk of --chunk tokens: a region per batch row and head, named by
pointer arithmetic over the tensors (libtier.Region), built once when the tensors are allocated,
with keys from libtier.chunk_keys over the prompt. The script reports the restore time (median
of --repeat loads) against a bulk host-to-device copy of the same bytes from pinned memory (a
pinned tensor's copy into a CUDA tensor), both timed the same way (wall clock around the call and
a CUDA synchronize).

Run on the device machine from the repository root (torch, transformers and a CUDA GPU; the
libtier package importable, README "Python package"):

    python3 python/examples/transformers_offload.py

--json prints one JSON object instead of the text report (python/tests/test_transformers_offload.py
uses it). Exit status 77 when torch, transformers or a CUDA GPU is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SKIP = 77


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    p.add_argument("--chunk", type=int, default=256, help="tokens per libtier object")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=5, help="restores timed (the median is reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", help="directory of the disk tier (default: a fresh directory "
                   "under the current one, which must support O_DIRECT: not a tmpfs)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--resume", metavar="MANIFEST", help=argparse.SUPPRESS)  # mode (b) child
    return p.parse_args(argv)


def require_runtime():
    """torch and transformers with a CUDA device, or exit 77."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e}", file=sys.stderr)
        sys.exit(SKIP)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device", file=sys.stderr)
        sys.exit(SKIP)


def build_model(args):
    """The same randomly initialised model in every process (fixed seed, CPU init, fp32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt + args.new_tokens + 8,
        attn_implementation="eager",  # the same kernels whatever else is installed
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).eval()
    return model.to(device="cuda", dtype=torch.float32)


def make_prompt(args):
    import torch

    g = torch.Generator().manual_seed(args.seed + 1)
    return torch.randint(0, args.vocab, (1, args.prompt), generator=g)


def identity(args):
    """What names the KV bytes: the model, its shapes and dtype (the Store's namespace)."""
    return {"model": "libtier-example-tiny-llama", "seed": args.seed, "layers": args.layers,
            "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
            "vocab": args.vocab, "dtype": "float32"}


# --- transformers' DynamicCache, old and new ------------------------------------------------------


def kv_of(cache):
    """[(K, V)] per layer: cache.layers[i].keys/values (current transformers) or the
    key_cache/value_cache lists (older releases). Each is [batch, kv_heads, seq, head_dim]."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def set_kv(cache, i, k, v):
    if hasattr(cache, "layers"):
        cache.layers[i].keys, cache.layers[i].values = k, v
    else:
        cache.key_cache[i], cache.value_cache[i] = k, v


def new_cache_from(kv):
    """A DynamicCache holding `kv` (a list of (K, V)), built through the public update()."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k[:, :, :0], v[:, :, :0], i)  # creates layer i with K/V's dtype and device
        set_kv(cache, i, k, v)  # then hands it our tensors (no copy)
    return cache


# --- the model's steps -------------------------------------------------------------------------


def prefill(model, ids):
    """Returns (cache, first generated token)."""
    import torch
    from transformers import DynamicCache

    with torch.no_grad():
        out = model(input_ids=ids.cuda(), past_key_values=DynamicCache(), use_cache=True)
    return out.past_key_values, out.logits[:, -1].argmax(-1)


def decode(model, cache, token, n):
    """Greedy: {"tokens": `token` and the n - 1 tokens after it, "logits": the SHA-256 of every
    decode step's logits (a random tiny model soon repeats one token; its logits still differ
    at the last bit when the KV does)}."""
    import hashlib

    import torch

    tokens, digest = [int(token)], hashlib.sha256()
    with torch.no_grad():
        for _ in range(n - 1):
            out = model(input_ids=token.view(1, 1), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1]
            digest.update(logits.float().cpu().numpy().tobytes())
            token = logits.argmax(-1)
            tokens.append(int(token))
    return {"tokens": tokens, "logits": digest.hexdigest()}


# --- libtier -----------------------------------------------------------------------------------


def prefix_keys(args, prompt):
    """Every object's key, layer-major: a chained key per --chunk tokens of the prompt, in a
    namespace of its own per layer."""
    import libtier

    keys = []
    for layer in range(args.layers):
        ns = dict(identity(args), layer=layer)
        keys += libtier.chunk_keys(ns, prompt[0].tolist(), args.chunk)
    return keys


def prefix_regions(kv, chunk, n_chunks):
    """The regions of every object, in prefix_keys() order: per (layer, chunk), one region per
    (batch row, head) of K then of V, each a contiguous run of chunk * head_dim elements inside
    the GPU tensor, named by pointer arithmetic (no tensor slicing: a list of libtier.Region built
    once, when the tensors are allocated, and reused by every load into them)."""
    import libtier

    out = []
    for k, v in kv:
        b_n, h_n, s_n, d_n = k.shape
        size = k.element_size()
        run = chunk * d_n * size
        for c in range(n_chunks):
            regions = []
            for t in (k, v):
                assert t.is_contiguous() and t.device.type == "cuda"
                base, device = t.data_ptr(), t.device.index
                for b in range(b_n):
                    for h in range(h_n):
                        at = base + ((b * h_n + h) * s_n + c * chunk) * d_n * size
                        regions.append(libtier.Region(at, run, libtier.MemoryKind.DEVICE, device))
            out.append(regions)
    return out


def register_all(store, kv):
    """Registers every KV tensor with the store once, when it is allocated (docs/integration.md,
    "The fast path"): the GPU's copy resources are prepared then, not by the first restore. The
    registrations end with release() or the store's close."""
    return [store.register(t) for pair in kv for t in pair]


def check(codes, what):
    bad = [c for c in codes if c != 0]
    if bad:
        raise RuntimeError(f"{what} failed for {len(bad)} of {len(codes)} objects: {bad[0]!r}")


def pinned_profile():
    return {"tiers": [{"name": "cpu", "capacity": "2GiB",
                       "backend": {"type": "cpu", "pinned": True}}]}


def disk_profile(path):
    return {"tiers": [{"name": "disk", "capacity": "4GiB",
                       "backend": {"type": "disk", "path": path}}]}


def open_store(profile, args, need):
    import libtier

    store = libtier.Store.open(profile, namespace=identity(args))
    if need not in store.tier_names:
        raise RuntimeError(f"the {need} tier is not available here (tiers: {store.tier_names})")
    return store


def timed(fn):
    """Milliseconds of fn(), wall clock, between two CUDA synchronizes."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def bulk_h2d_ms(nbytes, repeat):
    """Milliseconds of one pinned host -> device copy of `nbytes` (median of `repeat`, after a
    warm-up), timed as the restores are."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)  # warm-up
    return median([timed(lambda: dst.copy_(src, non_blocking=True)) for _ in range(repeat)])


def read_rate_gbps(path, nbytes, block=4 << 20, passes=4):
    """(GB/s, [GB/s of each pass]) of reading the first `nbytes` of `path` (rounded down to whole
    blocks, at least one) with O_DIRECT, one reader, `block` bytes per read (dd iflag=direct
    bs=4M), `passes` times: all the passes' bytes over all their time. On the device machine's
    virtual disk, passes right after each other differ by up to 1.5x (in some runs they alternate
    between about 1.3 and 2.0 GB/s), so no single pass (and no median of an odd count) is the
    disk's rate."""
    import mmap

    nbytes = max(block, nbytes // block * block)
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    seconds = []
    for _ in range(passes):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            t0 = time.perf_counter()
            for off in range(0, nbytes, block):
                os.preadv(fd, [buf], off)
            seconds.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
    return passes * nbytes / sum(seconds) / 1e9, [nbytes / t / 1e9 for t in seconds]


def new_file_read_gbps(directory, nbytes, block=4 << 20):
    """read_rate_gbps() of a file of `nbytes` (rounded up to whole blocks) just written in
    `directory` with O_DIRECT, then removed."""
    import mmap

    nbytes = max(block, (nbytes + block - 1) // block * block)
    buf = mmap.mmap(-1, block)
    buf.write(os.urandom(block))
    path = os.path.join(directory, "disk-read-rate.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    try:
        for off in range(0, nbytes, block):
            os.pwrite(fd, buf, off)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        return read_rate_gbps(path, nbytes, block)[0]
    finally:
        os.unlink(path)


# --- the two modes -----------------------------------------------------------------------------


def empty_kv(shapes):
    import torch

    return [(torch.empty(shape, dtype=dtype, device="cuda"),
             torch.empty(shape, dtype=dtype, device="cuda")) for shape, dtype in shapes]


def mode_pinned(args, model, prompt):
    """Mode (a): save the prefill's KV to a pinned CPU tier, free it, restore the whole prefix in
    one load call (--repeat times, timed), decode."""
    import torch

    if args.prompt % args.chunk:
        raise SystemExit("--prompt must be a multiple of --chunk (only full chunks are keyed)")
    n_chunks = args.prompt // args.chunk
    cache, first = prefill(model, prompt)
    kv = kv_of(cache)
    shapes = [(k.shape, k.dtype) for k, _ in kv]
    keys = prefix_keys(args, prompt)
    with open_store(pinned_profile(), args, "cpu") as store:
        save_ms = timed(lambda: check(store.save(keys, prefix_regions(kv, args.chunk, n_chunks)),
                                      "save"))
        for i in range(len(kv)):
            empty = kv[i][0].new_empty(0)
            set_kv(cache, i, empty, empty)  # the GPU tensors are gone
        del kv
        torch.cuda.empty_cache()
        restored = empty_kv(shapes)
        registered = register_all(store, restored)
        regions = prefix_regions(restored, args.chunk, n_chunks)  # once, with the tensors
        runs = [timed(lambda: check(store.load(keys, regions), "restore"))
                for _ in range(args.repeat)]
        for i, (k, v) in enumerate(restored):
            set_kv(cache, i, k, v)
        for r in registered:
            r.release()
    out = decode(model, cache, first, args.new_tokens)
    nbytes = sum(2 * k.numel() * k.element_size() for k, _ in restored)
    return dict(out, save_ms=save_ms, restore_ms=median(runs), restore_runs_ms=runs,
                objects=len(keys), regions=sum(len(r) for r in regions), bytes=nbytes)


def mode_fresh_process(args, model, prompt, workdir):
    """Mode (b): save after prefill to a disk tier, drop the KV, resume in a new process."""
    import torch

    cache, first = prefill(model, prompt)
    kv = kv_of(cache)
    n_chunks = args.prompt // args.chunk
    manifest = {"args": vars(args), "first": int(first), "prompt": prompt[0].tolist(),
                "shape": list(kv[0][0].shape), "profile": disk_profile(workdir),
                "workdir": workdir}
    with open_store(manifest["profile"], args, "disk") as store:
        check(store.save(prefix_keys(args, prompt), prefix_regions(kv, args.chunk, n_chunks)),
              "save")
    del cache, kv
    torch.cuda.empty_cache()
    path = os.path.join(workdir, "manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f)
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--resume", path],
                           capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"resume process failed ({child.returncode}):\n{child.stderr}")
    return json.loads(child.stdout)


def resume(manifest_path):
    """Mode (b)'s fresh process: rebuild the model, restore the whole prefix from disk in one
    load call (the disk's own rate for those bytes right after it), again, decode; then the rate of
    a file just written."""
    import torch

    with open(manifest_path) as f:
        manifest = json.load(f)
    args = argparse.Namespace(**manifest["args"])
    model = build_model(args)
    prompt = torch.tensor([manifest["prompt"]])
    kv = empty_kv([(manifest["shape"], torch.float32)] * args.layers)
    regions = prefix_regions(kv, args.chunk, args.prompt // args.chunk)
    keys = prefix_keys(args, prompt)
    with open_store(manifest["profile"], args, "disk") as store:
        registered = register_all(store, kv)  # as an engine does when it allocates its KV
        restore_ms = timed(lambda: check(store.load(keys, regions), "restore"))
        nbytes = sum(2 * k.numel() * k.element_size() for k, _ in kv)
        # The disk's own rate for the bytes the restore read: as many bytes of the tier's data
        # file from its start (the objects, in the order they were saved, and the unused ends of
        # their 16 MiB regions, a few percent), right after the restore.
        disk, passes = read_rate_gbps(os.path.join(manifest["workdir"], "data"), nbytes)
        # Again in this process: the disk is read again (O_DIRECT), without the first call's
        # one-time costs (the stack's buffers faulted in; the GPU's were prepared by register).
        warm_ms = timed(lambda: check(store.load(keys, regions), "restore"))
        for r in registered:
            r.release()
    first = torch.tensor([manifest["first"]], device="cuda")
    out = decode(model, new_cache_from(kv), first, args.new_tokens)
    json.dump(dict(out, restore_ms=restore_ms, bytes=nbytes, disk_read_gbps=disk,
                   disk_read_passes_gbps=passes,
                   new_file_read_gbps=new_file_read_gbps(manifest["workdir"], nbytes),
                   restore_gbps=nbytes / restore_ms / 1e6, restore_warm_ms=warm_ms,
                   restore_warm_gbps=nbytes / warm_ms / 1e6), sys.stdout)


def same(run, plain):
    return run["tokens"] == plain["tokens"] and run["logits"] == plain["logits"]


def main(argv=None):
    args = parse_args(argv)
    require_runtime()
    if args.resume:
        resume(args.resume)
        return 0
    model = build_model(args)
    prompt = make_prompt(args)
    cache, first = prefill(model, prompt)
    plain = decode(model, cache, first, args.new_tokens)
    del cache
    a = mode_pinned(args, model, prompt)
    with tempfile.TemporaryDirectory(prefix=".libtier-example-", dir=os.getcwd()) as tmp:
        workdir = args.workdir or tmp
        os.makedirs(workdir, exist_ok=True)
        b = mode_fresh_process(args, model, prompt, workdir)
    h2d_ms = bulk_h2d_ms(a["bytes"], args.repeat)
    report = {
        "plain": plain,
        "pinned": a,
        "fresh_process": b,
        "identical": {"pinned": same(a, plain), "fresh_process": same(b, plain)},
        "bulk_h2d_ms": h2d_ms,
        "ratios": {"pinned_restore_vs_bulk_h2d": a["restore_ms"] / h2d_ms,
                   "disk_restore_vs_disk_read": b["restore_gbps"] / b["disk_read_gbps"]},
    }
    if args.json:
        json.dump(report, sys.stdout)
        print()
    else:
        gb = a["bytes"] / 1e9
        print(f"model: {args.layers} layers, KV {a['bytes'] / 2**20:.1f} MiB "
              f"({args.prompt} prompt tokens; {a['objects']} objects, {a['regions']} regions), "
              f"{args.new_tokens} greedy tokens")
        verdict = "identical" if same(a, plain) else "DIFFERENT"
        print(f"pinned cpu tier, one load call:  tokens and logits {verdict}; restore "
              f"{a['restore_ms']:.3f} ms (median of {args.repeat}; {gb / (a['restore_ms'] / 1e3):.2f}"
              f" GB/s) = {report['ratios']['pinned_restore_vs_bulk_h2d']:.2f}x the bulk H2D copy")
        print(f"bulk pinned H2D copy of the same bytes: {h2d_ms:.3f} ms "
              f"({gb / (h2d_ms / 1e3):.2f} GB/s)")
        verdict = "identical" if same(b, plain) else "DIFFERENT"
        print(f"disk tier, fresh process, one load call: tokens and logits {verdict}; restore "
              f"{b['restore_ms']:.2f} ms ({b['restore_gbps']:.2f} GB/s) = "
              f"{report['ratios']['disk_restore_vs_disk_read']:.2f}x the disk's own read rate "
              f"({b['disk_read_gbps']:.2f} GB/s: the same bytes of the tier's data file, O_DIRECT, "
              f"4 MiB reads, 4 passes at "
              f"{', '.join(f'{x:.2f}' for x in b['disk_read_passes_gbps'])} GB/s); "
              f"again in that process {b['restore_warm_ms']:.2f} ms = "
              f"{b['restore_warm_gbps'] / b['disk_read_gbps']:.2f}x; a file just written reads "
              f"at {b['new_file_read_gbps']:.2f} GB/s")
    return 0 if all(report["identical"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
