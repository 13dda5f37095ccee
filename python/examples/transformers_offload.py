#!/usr/bin/env python3
"""A real model's KV cache through libtier: greedy tokens identical with and without offload.

A small Llama (transformers' LlamaConfig, randomly initialised with a fixed seed: nothing is
downloaded) runs on the GPU three times on the same random prompt:

- plain: prefill, then greedy decode of --new-tokens tokens; the reference;
- mode (a), layer by layer: after prefill, each layer's K and V are saved to libtier (a CPU
  tier), the GPU tensors of that layer are freed, and then every layer is restored from libtier
  into fresh GPU tensors before decoding;
- mode (b), across processes: after prefill, the KV is saved to a disk tier, every GPU KV tensor
  is dropped, and a fresh Python process (this script with --resume) rebuilds the model from the
  seed, restores the KV from the disk tier straight into GPU tensors and decodes.

Both modes must produce exactly the plain run's tokens, and bit for bit the same logits at every
decode step (compared through a SHA-256 of them; exit status 1 otherwise). The KV moves
zero-copy: libtier reads and writes the CUDA tensors' memory, each object being one layer's K
and V of one chunk of --chunk tokens (a region per batch row and head, keys from
libtier.chunk_keys over the prompt). The script reports the restore time against a bulk
host-to-device copy of the same bytes (a pinned tensor's .to("cuda"), timed with CUDA events).

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


def layer_keys(args, prompt, layer):
    """The chunk keys of `layer`'s KV: a chained key per --chunk tokens of the prompt."""
    import libtier

    ns = dict(identity(args), layer=layer)
    return libtier.chunk_keys(ns, prompt[0].tolist(), args.chunk)


def layer_regions(k, v, chunk, n_chunks):
    """Per chunk, one region per (batch row, head) of K then of V: each a contiguous run of
    chunk * head_dim elements inside the GPU tensor."""
    rows = [(b, h) for b in range(k.shape[0]) for h in range(k.shape[1])]
    return [
        [t[b, h, c * chunk : (c + 1) * chunk] for t in (k, v) for b, h in rows]
        for c in range(n_chunks)
    ]


def save_layer(store, args, prompt, i, k, v):
    keys = layer_keys(args, prompt, i)
    codes = store.save(keys, layer_regions(k, v, args.chunk, len(keys)))
    bad = [c for c in codes if c != 0]
    if bad:
        raise RuntimeError(f"layer {i}: save failed: {bad[0]!r}")


def load_layer(store, args, prompt, i, k, v):
    keys = layer_keys(args, prompt, i)
    codes = store.load(keys, layer_regions(k, v, args.chunk, len(keys)))
    bad = [c for c in codes if c != 0]
    if bad:
        raise RuntimeError(f"layer {i}: restore failed: {bad[0]!r}")


def cpu_profile():
    return {"tiers": [{"name": "cpu", "capacity": "2GiB", "backend": {"type": "cpu"}}]}


def disk_profile(path):
    return {"tiers": [{"name": "disk", "capacity": "4GiB",
                       "backend": {"type": "disk", "path": path}}]}


def open_store(profile, args, need):
    import libtier

    store = libtier.Store.open(profile, namespace=identity(args))
    if need not in store.tier_names:
        raise RuntimeError(f"the {need} tier is not available here (tiers: {store.tier_names})")
    return store


def bulk_h2d_ms(nbytes):
    """Milliseconds of one pinned host -> device copy of `nbytes` (CUDA events, after a warm-up)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    src.to("cuda")  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst = src.to("cuda", non_blocking=True)
    end.record()
    end.synchronize()
    del dst
    return start.elapsed_time(end)


def timed(fn):
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


# --- the two modes -----------------------------------------------------------------------------


def mode_layer_by_layer(args, model, prompt):
    """Mode (a): offload each layer after prefill, free it, restore every layer, decode."""
    import torch

    if args.prompt % args.chunk:
        raise SystemExit("--prompt must be a multiple of --chunk (only full chunks are keyed)")
    cache, first = prefill(model, prompt)
    shapes = [(k.shape, k.dtype) for k, _ in kv_of(cache)]
    with open_store(cpu_profile(), args, "cpu") as store:
        save_ms = 0.0
        for i, (k, v) in enumerate(kv_of(cache)):
            save_ms += timed(lambda: save_layer(store, args, prompt, i, k, v))
            empty = k.new_empty(0)
            set_kv(cache, i, empty, empty)  # layer i's GPU tensors are gone
            del k, v
        torch.cuda.empty_cache()
        restored = []
        for shape, dtype in shapes:
            restored.append((torch.empty(shape, dtype=dtype, device="cuda"),
                             torch.empty(shape, dtype=dtype, device="cuda")))
        restore_ms = timed(lambda: [load_layer(store, args, prompt, i, k, v)
                                    for i, (k, v) in enumerate(restored)])
        for i, (k, v) in enumerate(restored):
            set_kv(cache, i, k, v)
    out = decode(model, cache, first, args.new_tokens)
    nbytes = sum(2 * k.numel() * k.element_size() for k, _ in restored)
    return dict(out, save_ms=save_ms, restore_ms=restore_ms, bytes=nbytes)


def mode_fresh_process(args, model, prompt, workdir):
    """Mode (b): save after prefill to a disk tier, drop the KV, resume in a new process."""
    import torch

    cache, first = prefill(model, prompt)
    kv = kv_of(cache)
    manifest = {"args": vars(args), "first": int(first), "prompt": prompt[0].tolist(),
                "shape": list(kv[0][0].shape), "profile": disk_profile(workdir)}
    with open_store(manifest["profile"], args, "disk") as store:
        for i, (k, v) in enumerate(kv):
            save_layer(store, args, prompt, i, k, v)
    del cache, kv, k, v
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
    """Mode (b)'s fresh process: rebuild the model, restore the KV from disk, decode."""
    import torch

    with open(manifest_path) as f:
        manifest = json.load(f)
    args = argparse.Namespace(**manifest["args"])
    model = build_model(args)
    prompt = torch.tensor([manifest["prompt"]])
    kv = [(torch.empty(manifest["shape"], dtype=torch.float32, device="cuda"),
           torch.empty(manifest["shape"], dtype=torch.float32, device="cuda"))
          for _ in range(args.layers)]
    with open_store(manifest["profile"], args, "disk") as store:
        restore_ms = timed(lambda: [load_layer(store, args, prompt, i, k, v)
                                    for i, (k, v) in enumerate(kv)])
    first = torch.tensor([manifest["first"]], device="cuda")
    out = decode(model, new_cache_from(kv), first, args.new_tokens)
    nbytes = sum(2 * k.numel() * k.element_size() for k, _ in kv)
    json.dump(dict(out, restore_ms=restore_ms, bytes=nbytes), sys.stdout)


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
    a = mode_layer_by_layer(args, model, prompt)
    with tempfile.TemporaryDirectory(prefix=".libtier-example-", dir=os.getcwd()) as tmp:
        workdir = args.workdir or tmp
        os.makedirs(workdir, exist_ok=True)
        b = mode_fresh_process(args, model, prompt, workdir)
    h2d_ms = bulk_h2d_ms(a["bytes"])
    report = {
        "plain": plain,
        "layer_by_layer": a,
        "fresh_process": b,
        "identical": {"layer_by_layer": same(a, plain), "fresh_process": same(b, plain)},
        "bulk_h2d_ms": h2d_ms,
    }
    if args.json:
        json.dump(report, sys.stdout)
        print()
    else:
        gb = a["bytes"] / 1e9
        print(f"model: {args.layers} layers, KV {a['bytes'] / 2**20:.1f} MiB "
              f"({args.prompt} prompt tokens), {args.new_tokens} greedy tokens")
        for name, r in (("layer by layer (cpu tier)", a), ("fresh process (disk tier)", b)):
            verdict = "identical" if same(r, plain) else "DIFFERENT"
            print(f"{name:27s} tokens and logits {verdict}; restore {r['restore_ms']:.2f} ms "
                  f"({gb / (r['restore_ms'] / 1e3):.2f} GB/s) = {r['restore_ms'] / h2d_ms:.1f}x "
                  f"the bulk H2D copy")
        print(f"bulk pinned H2D copy of the same bytes: {h2d_ms:.2f} ms "
              f"({gb / (h2d_ms / 1e3):.2f} GB/s, CUDA events)")
    return 0 if all(report["identical"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
