#!/usr/bin/env python3
"""TP ranks as processes: one scheduler process, one process per TP rank (docs/engine.md "Ranks
as processes"), the way vLLM, SGLang and ATOM deploy tensor parallelism.

- The scheduler process owns the libtier Scheduler, the request queue and the block allocator.
  Its view of the tiers (lookups, commit records, lookup leases) is a Worker of rank 0 over the
  shared tier (a one-block layout: it never moves KV).
- Each rank process owns its KV memory (a Dsv4Layout in host memory, or with --device in the
  memory of GPU `rank mod device_count`), its Worker and its Store: the shared-memory tier every
  process opens by name (and, with --disk, a disk tier of its own below it).
- Every step the scheduler sends each rank one message over a pipe: the engine's batch (new
  requests with their prompts, the tokens to compute, restores to check) and the step's plan as
  bytes (StepPlan.encode()). The rank submits the decoded plan, runs its forward pass stand-in,
  runs progress() and answers with its reports as bytes (libtier.encode_reports); the scheduler
  decodes every rank's reports and hands them to Scheduler.process.
- The forward stand-in writes bytes derived from the prompt (and the rank) into the blocks and
  the state group, so every restore is checked bit for bit on every rank against what the
  forward would have written.

Faults (python/tests/test_tp_processes.py runs them):
  --kill-rank R --kill-at-save K   rank R kills itself (SIGKILL) during the K-th step whose plan
                                   has a SLOT save, while that save runs. The scheduler sees the
                                   pipe close, fails the dead rank's outstanding operations
                                   (reason rank_lost), so the quorum never commits their
                                   boundaries, aborts and requeues the requests in flight, and
                                   starts rank R again: a rank that restarts, with fresh KV
                                   memory, serving the rest (its restores read what its
                                   predecessor saved).
  --kill-scheduler-at-step S       the scheduler process kills itself (SIGKILL) at step S, with
                                   the plan sent; its rank processes end when their pipe closes.
                                   A new scheduler process with new ranks serves the workload
                                   again and finds the commits the first one made in the tiers.

The last line is `ranks R, requests N, restores M, wrong W` (W: restores that differ on some
rank, plus boundaries offered that the quorum never saved); exit status 0 when W is 0 and the
counters of every process agree. Runs anywhere (CPU, the shm tier in /dev/shm):

    PYTHONPATH=build/python TIER_PLUGIN_DIR=build/libtier/plugins \\
        python3 python/examples/tp_processes.py --ranks 2

On a GPU machine, KV in device memory with the real DeepSeek-V4 geometry and restore and save
figures per rank (to set beside `tierbench forward`):

    python3 python/examples/tp_processes.py --ranks 2 --device --preset v4-pro-fp8 \\
        --chunk-tokens 1024 --prompt-tokens 16385 --turn-tokens 512 --conversations 4 \\
        --turns 2 --concurrency 2 --prefill-chunk 4096 --shm-capacity 2GiB --pinned

(turn 2 of each conversation restores the 16,384-token prompt-end anchor of turn 1: 64 PAGE
blocks of 1.45 MiB and a 25.5 MiB SLOT per rank, the restore `tierbench forward` measures.)
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import uuid

import numpy as np

import libtier

SMALL_MODEL = {  # two compressed layers and a sliding window, narrow heads: small and quick
    "compress_ratios": [4, 128, 0], "kv_head_dim": 64, "rope_head_dim": 16,
    "index_head_dim": 32, "block_size": 128, "sliding_window": 8,
}
TRACE_BLOCK_TOKENS = 512  # tokens per hash id of the Mooncake trace (as tierbench replay)
RANK_LOST = "rank_lost"  # the reason of a dead rank's operations (TIER_OUTCOME_RANK_LOST)
CHANNELS = ("load", "page_save", "slot_save")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="TP size: rank processes")
    p.add_argument("--device", action="store_true",
                   help="KV memory on GPU `rank mod device_count` (default: host memory)")
    p.add_argument("--preset", help="DSV4 geometry preset (default: a small test geometry)")
    p.add_argument("--trace", help="a Mooncake trace (JSON lines): its requests, in order")
    p.add_argument("--limit", type=int, default=40, help="requests of the trace (default 40)")
    p.add_argument("--conversations", type=int, default=6, help="synthetic: conversations")
    p.add_argument("--turns", type=int, default=3, help="synthetic: turns per conversation")
    p.add_argument("--prompt-tokens", type=int, default=1300, help="synthetic: first turn")
    p.add_argument("--turn-tokens", type=int, default=600, help="synthetic: tokens per turn")
    p.add_argument("--chunk-tokens", type=int, help="PAGE chunk (default 2 blocks)")
    p.add_argument("--interval", type=int, default=-1,
                   help="checkpoint_interval_tokens (default -1: the prompt-end anchor)")
    p.add_argument("--min-load-tokens", type=int, help="smallest load (default one chunk)")
    p.add_argument("--prefill-chunk", type=int, default=512, help="tokens per prefill step")
    p.add_argument("--decode", type=int, default=2, help="decode steps per request")
    p.add_argument("--concurrency", type=int, default=3, help="requests in flight")
    p.add_argument("--shm-capacity", default="256MiB", help="the shared tier's capacity")
    p.add_argument("--segment", help="shared-memory segment name (default: a fresh one, removed)")
    p.add_argument("--pinned", action="store_true",
                   help="the shared tier in page-locked memory (direct restores into GPU memory)")
    p.add_argument("--disk", help="a directory: a disk tier per rank under it (rank<r>/)")
    p.add_argument("--disk-capacity", default="1GiB")
    p.add_argument("--kill-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kill-at-save", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--kill-scheduler-at-step", type=int, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p.parse_args(argv)


# ---- workload ------------------------------------------------------------------------------

def synthetic_workload(a):
    """Conversations: turn t's prompt is turn t-1's plus --turn-tokens new tokens. A turn is
    sent once the previous turn of its conversation has finished, as a user would."""
    out = []
    for t in range(a.turns):
        for c in range(a.conversations):
            parts = [np.random.default_rng([c, i]).integers(
                0, 100000, a.prompt_tokens if i == 0 else a.turn_tokens, dtype=np.uint32)
                for i in range(t + 1)]
            after = len(out) - a.conversations if t > 0 else None
            out.append({"prompt": np.concatenate(parts), "after": after})
    return out


def trace_workload(path, limit):
    """The first `limit` requests of a Mooncake trace; each hash id stands for 512 tokens derived
    from the id (the tokens `tierbench replay` makes), so equal ids give equal prefixes."""
    out = []
    j = np.arange(TRACE_BLOCK_TOKENS, dtype=np.uint64)
    with open(path) as f:
        for line in f:
            if len(out) >= limit:
                break
            r = json.loads(line)
            ids = np.array(r["hash_ids"], dtype=np.uint64)
            t = ((ids[:, None] * 2654435761) ^ (j[None, :] * 40503 + 0x9E37)) & 0xFFFFFFFF
            t = t.astype(np.uint32).reshape(-1)
            n = r.get("input_length") or len(t)
            out.append({"prompt": t[: min(n, len(t))], "after": None})
    return out


# ---- KV content: what a forward pass writes ------------------------------------------------

def seed_of(*parts) -> int:
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"|")
    return int.from_bytes(h.digest(), "little")


def content(seed: int, nbytes: int) -> bytes:
    return np.random.Generator(np.random.PCG64(seed)).bytes(nbytes)


class KvAccess:
    """Reads and writes a rank's KV memory as the engine's forward pass does: host memory in
    place; device memory through a private heap Store of this process (a save of host bytes and
    a load into the device regions, which the C API moves with its GPU copy executor), so the
    example needs no GPU package of its own."""

    def __init__(self, device: bool):
        self.scratch = libtier.Store.open(
            {"tiers": [{"name": "scratch", "capacity": "256MiB", "backend": {"type": "cpu"}}]}
        ) if device else None
        self.n = 0

    def _key(self):
        self.n += 1
        return libtier.external_key(f"kv-access-{self.n}".encode())

    def write(self, regions, data: bytes):
        if self.scratch is None:
            off = 0
            for r in regions:
                ctypes.memmove(r.ptr, data[off: off + r.nbytes], r.nbytes)
                off += r.nbytes
            return
        k = self._key()
        ok = libtier.Code.OK
        assert self.scratch.save([k], [[np.frombuffer(data, np.uint8)]]) == [ok]
        assert self.scratch.load([k], [regions]) == [ok]
        self.scratch.remove([k])

    def read(self, regions) -> bytes:
        if self.scratch is None:
            return b"".join(ctypes.string_at(r.ptr, r.nbytes) for r in regions)
        k = self._key()
        out = np.empty(sum(r.nbytes for r in regions), np.uint8)
        ok = libtier.Code.OK
        assert self.scratch.save([k], [regions]) == [ok]
        assert self.scratch.load([k], [[out]]) == [ok]
        self.scratch.remove([k])
        return out.tobytes()

    def close(self):
        if self.scratch is not None:
            self.scratch.close()


# ---- a rank process ------------------------------------------------------------------------

class RankState:
    """One rank: its KV memory, Worker and Store, and what it knows of the engine's requests."""

    def __init__(self, spec):
        self.rank = spec["rank"]
        self.bt = spec["block_tokens"]
        ns = spec["namespace"]
        self.store = libtier.Store.open(spec["profile"], namespace=ns, rank=self.rank)
        memory = "device" if spec["device"] is not None else "host"
        self.layout = libtier.Dsv4Layout.create(spec["model"], ns, spec["tp"], self.rank,
                                                memory=memory, device=spec["device"] or 0)
        self.worker = libtier.Worker.create(spec["config"], self.rank, self.store, self.layout, ns)
        self.kv = KvAccess(spec["device"] is not None)
        self.requests = {}  # rid -> (prompt, blocks, group)
        self.page_bytes = self.layout.page_bytes_per_block
        self.slot_bytes = self.layout.slot_bytes
        self.figures = {"restores": 0, "restore_bytes": 0, "restore_s": 0.0,
                        "saves": 0, "save_bytes": 0, "save_s": 0.0}

    def block_content(self, prompt, upto, b):
        return content(seed_of("page", self.rank, b, prompt[:upto].tobytes()), self.page_bytes)

    def slot_content(self, prompt, end, decoded=0):
        return content(seed_of("slot", self.rank, decoded, prompt[:end].tobytes()),
                       self.slot_bytes)

    def forward(self, rid, start, end, decoded):
        """Tokens [start, end) of the prompt (or, decoded > 0, the decode step `decoded`)."""
        prompt, blocks, group = self.requests[rid]
        bt = self.bt
        if decoded:
            pos = len(prompt) + decoded - 1
            data = content(seed_of("decode", self.rank, decoded, prompt.tobytes()),
                           self.page_bytes)
            self.kv.write(self.layout.page_regions([blocks[pos // bt]]), data)
            self.kv.write(self.layout.slot_regions(group),
                          self.slot_content(prompt, len(prompt), decoded))
            return
        for b in range(start // bt, -(-end // bt)):
            upto = min((b + 1) * bt, end)
            self.kv.write(self.layout.page_regions([blocks[b]]),
                          self.block_content(prompt, upto, b))
        self.kv.write(self.layout.slot_regions(group), self.slot_content(prompt, end))

    def verify(self, rid, tokens):
        """Whether the blocks [0, tokens) and the state group hold what the forward wrote."""
        prompt, blocks, group = self.requests[rid]
        for b in range(tokens // self.bt):
            got = self.kv.read(self.layout.page_regions([blocks[b]]))
            if got != self.block_content(prompt, (b + 1) * self.bt, b):
                return False
        return self.kv.read(self.layout.slot_regions(group)) == self.slot_content(prompt, tokens)

    def zero_group(self, group):
        self.kv.write(self.layout.slot_regions(group), bytes(self.slot_bytes))

    def tally(self, plan, reports, restore_s, save_s):
        """Restore and save figures: bytes of the operations that succeeded here, and the time
        of the progress() calls that ran them."""
        loads = {op.generation: op for op in plan.loads}
        saves = {op.generation: op for op in plan.saves}
        f = self.figures
        for r in reports:
            if not r.ok:
                continue
            if r.channel == "load":
                op = loads[r.generation]
                f["restores"] += 1
                f["restore_bytes"] += ((op.page_end - op.page_start) // self.bt * self.page_bytes
                                       + (self.slot_bytes if op.slot else 0))
            elif r.channel == "page_save":
                op = saves[r.generation]
                f["saves"] += 1
                f["save_bytes"] += (op.page_end - op.page_start) // self.bt * self.page_bytes
            else:
                f["save_bytes"] += self.slot_bytes
        if plan.loads:
            f["restore_s"] += restore_s
        if plan.saves:
            f["save_s"] += save_s

    def close(self):
        self.kv.close()
        self.worker.close()
        self.layout.close()
        self.store.close()


def rank_main(conn, spec):
    """A rank process: answers the scheduler's messages until it says `finish` or goes away."""
    st = RankState(spec)
    conn.send(("ready", st.rank, os.getpid()))
    slot_steps = 0
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the scheduler is gone: a TP group ends with it
            break
        if msg[0] == "finish":
            conn.send(("metrics", st.worker.metrics(), st.figures))
            break
        _, batch, plan_bytes = msg
        for rid, prompt, blocks, group in batch["new"]:
            st.requests[rid] = (np.frombuffer(prompt, np.uint32), blocks, group)
            st.zero_group(group)
        for rid in batch["ended"]:
            st.requests.pop(rid, None)
        verified = [(rid, st.verify(rid, tokens)) for rid, tokens in batch["verify"]]
        plan = libtier.StepPlan.decode(plan_bytes)
        st.worker.submit(plan)  # SLOT snapshots are taken here, before this step's forward
        for rid, start, end, decoded in batch["forward"]:
            st.forward(rid, start, end, decoded)
        if any(op.slot for op in plan.saves):
            slot_steps += 1
            if spec["kill_at_save"] == slot_steps:
                # kill -9 while this step's saves run.
                threading.Thread(target=st.worker.progress, daemon=True).start()
                time.sleep(0.002)
                os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        st.worker.progress(max_saves=0)  # the loads
        t1 = time.perf_counter()
        st.worker.progress()  # the saves
        t2 = time.perf_counter()
        reports = st.worker.take_reports()
        st.tally(plan, reports, t1 - t0, t2 - t1)
        try:
            conn.send(("done", libtier.encode_reports(reports), verified))
        except (BrokenPipeError, OSError):
            break
    st.close()


# ---- the scheduler process -----------------------------------------------------------------

class RankProc:
    """The scheduler's handle of one rank process (restarted with the same rank when it dies)."""

    def __init__(self, ctx, spec):
        self.spec = spec
        self.rank = spec["rank"]
        self.ctx = ctx
        self.incarnation = 0
        self.start(kill_at_save=spec["kill_at_save"])

    def start(self, kill_at_save=None):
        self.conn, child = self.ctx.Pipe()
        spec = dict(self.spec, kill_at_save=kill_at_save)
        self.proc = self.ctx.Process(target=rank_main, args=(child, spec), daemon=True,
                                     name=f"rank{self.rank}")
        self.proc.start()
        child.close()
        tag, rank, self.pid = self.conn.recv()
        assert tag == "ready" and rank == self.rank
        self.incarnation += 1
        self.tally = collections.Counter()  # this incarnation's reports, as the scheduler got them

    def restart(self):
        self.proc.join(10)
        self.conn.close()
        self.start()


class Request:
    def __init__(self, index, prompt, after):
        self.index = index  # in the workload
        self.prompt = prompt
        self.after = after
        self.rid = None
        self.h = None
        self.blocks = []
        self.group = -1
        self.state = "queued"
        self.computed = 0
        self.decoded = 0
        self.lease = 0
        self.below = None  # a boundary the quorum never saved: the lookup must stay below it
        self.requeued = False


class Engine:
    def __init__(self, a, ctx, report_conn):
        self.a = a
        self.ns = libtier.namespace_id({"model": "tp-processes-example",
                                        "geometry": a.preset or SMALL_MODEL})
        self.report_conn = report_conn
        shm = {"type": "cpu", "mode": "shm", "segment": a.segment}
        if a.pinned:
            shm["pinned"] = True
        shared = {"name": "shm", "capacity": a.shm_capacity, "backend": shm}
        view_store = libtier.Store.open({"tiers": [dict(shared, backend=dict(shm, pinned=False))]},
                                        namespace=self.ns)
        self.view_layout = libtier.Dsv4Layout.create(self.model(1, 1), self.ns, a.ranks, 0)
        bt = self.view_layout.block_tokens
        self.bt = bt
        chunk = a.chunk_tokens or 2 * bt
        self.workload = (trace_workload(a.trace, a.limit) if a.trace else synthetic_workload(a))
        longest = max(len(w["prompt"]) for w in self.workload) + a.decode
        self.blocks_per_request = -(-longest // bt)
        self.num_blocks = a.concurrency * self.blocks_per_request
        self.config = {"block_tokens": bt, "chunk_tokens": chunk,
                       "checkpoint_interval_tokens": a.interval,
                       "min_load_tokens": a.min_load_tokens or chunk, "stateful": True,
                       "tp_size": a.ranks, "max_pending_saves": 2 * a.concurrency + 2}
        self.view_store = view_store
        self.view = libtier.Worker.create(self.config, 0, view_store, self.view_layout, self.ns)
        self.sched = libtier.Scheduler.create(self.config, self.view, self.ns)
        devices = gpu_count() if a.device else 0
        self.ranks = []
        for r in range(a.ranks):
            tiers = [shared]
            if a.disk:
                tiers.append({"name": "disk", "capacity": a.disk_capacity, "optional": True,
                              "backend": {"type": "disk",
                                          "path": os.path.join(a.disk, f"rank{r}")}})
            spec = {"rank": r, "tp": a.ranks, "block_tokens": bt, "namespace": self.ns,
                    "config": self.config, "model": self.model(self.num_blocks, a.concurrency),
                    "profile": {"tiers": tiers}, "device": (r % devices) if a.device else None,
                    "kill_at_save": a.kill_at_save if a.kill_rank == r else None}
            self.ranks.append(RankProc(ctx, spec))
        self.tell_pids()
        self.free_blocks = list(range(self.num_blocks))
        self.free_groups = list(range(a.concurrency))
        self.next_rid = 1
        self.queue = [Request(i, w["prompt"], w["after"]) for i, w in enumerate(self.workload)]
        self.done_index = set()
        self.active = {}  # rid -> Request
        self.by_handle = {}
        self.steps = 0
        self.pending_new, self.pending_ended, self.pending_verify = [], [], []
        self.restores = self.wrong = self.offered_unsaved = self.requeued = 0
        self.rank_deaths = 0
        self.resumed_after_death = []  # requeued requests: their lookup, the boundary lost
        self.plan_bytes, self.report_bytes = [], []
        self.retired = collections.Counter()  # counters of schedulers replaced after a rank loss
        self.rank_tiers = {}  # "rank<r>/<tier>": the tier metrics of each rank process

    def model(self, num_blocks, num_slots):
        if self.a.preset:
            return {"preset": self.a.preset, "num_blocks": num_blocks, "num_slots": num_slots}
        return dict(SMALL_MODEL, num_blocks=num_blocks, num_slots=num_slots)

    def tell_pids(self):
        self.report_conn.send(("pids", [r.pid for r in self.ranks]))

    # -- requests --
    def eligible(self, req):
        return req.after is None or req.after in self.done_index

    def admit(self, req):
        req.rid = self.next_rid
        self.next_rid += 1
        req.h = self.sched.add_request(req.rid, req.prompt)
        match = self.sched.lookup(req.h)
        if req.below is not None and match.tokens >= req.below:
            self.offered_unsaved += 1  # a boundary the quorum never saved was offered
        if req.requeued:
            self.resumed_after_death.append({"lookup": match.tokens, "lost": req.below})
        n = -(-(len(req.prompt) + self.a.decode) // self.bt)
        req.blocks, self.free_blocks = self.free_blocks[:n], self.free_blocks[n:]
        req.group = self.free_groups.pop(0)
        d = self.sched.after_alloc(req.h, 0, req.blocks, req.group)
        req.computed = req.decoded = 0
        req.state = "loading" if d.action == "load" else "prefill"
        req.load_end = d.load_end
        self.pending_new.append((req.rid, req.prompt.tobytes(), req.blocks, req.group))
        self.active[req.rid] = req
        self.by_handle[req.h] = req

    def release(self, req):
        self.free_blocks += req.blocks
        self.free_groups.append(req.group)
        self.pending_ended.append(req.rid)
        self.by_handle.pop(req.h, None)

    def finish(self, req):
        self.active.pop(req.rid)
        req.state = "finished"
        if self.sched.finish(req.h):
            self.release(req)

    # -- one step --
    def batch(self):
        fwd = []
        for req in self.active.values():
            if req.state == "prefill":
                n = self.sched.cut_prefill_chunk(
                    req.h, req.computed, min(self.a.prefill_chunk, len(req.prompt) - req.computed))
                fwd.append((req.rid, req.computed, req.computed + n, 0))
            elif req.state == "decode":
                fwd.append((req.rid, 0, 0, req.decoded + 1))
        return fwd

    def step(self):
        while True:
            ready = [q for q in self.queue if self.eligible(q)]
            if not ready or len(self.active) >= self.a.concurrency:
                break
            if len(self.free_blocks) < self.blocks_per_request or not self.free_groups:
                break
            self.queue.remove(ready[0])
            self.admit(ready[0])
        fwd = self.batch()
        plan = self.sched.build_step()
        for op in plan.loads:
            self.active[op.request].lease = op.lease
        data = plan.encode()
        self.plan_bytes.append(len(data))
        batch = {"new": self.pending_new, "ended": self.pending_ended,
                 "verify": self.pending_verify, "forward": fwd}
        self.pending_new, self.pending_ended, self.pending_verify = [], [], []
        ops = [("load", op.request, op.generation) for op in plan.loads]
        for op in plan.saves:
            ops.append(("page_save", op.request, op.generation))
            if op.slot:
                ops.append(("slot_save", op.request, op.generation))
        self.steps += 1
        for r in self.ranks:
            try:
                r.conn.send(("step", batch, data))
            except (BrokenPipeError, OSError):
                pass  # seen dead below
        if self.a.kill_scheduler_at_step == self.steps:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 with the plan sent
        reports, verified, dead = [], [], []
        for r in self.ranks:
            try:
                tag, rbytes, checks = r.conn.recv()
            except (EOFError, OSError):
                dead.append(r)
                continue
            self.report_bytes.append(len(rbytes))
            got = libtier.decode_reports(rbytes)
            for rep in got:
                r.tally[(rep.channel, rep.ok)] += 1
            reports += got
            verified += checks
        for r in dead:  # its operations of this step never report: the quorum fails them
            reports += [libtier.OpReport(ch, req, gen, r.rank, False, RANK_LOST)
                        for ch, req, gen in ops]
        ev = self.sched.process(reports)
        self.absorb(ev, verified, fwd)
        if dead:
            self.rank_died(dead, plan)

    def absorb(self, ev, verified, fwd):
        for rid, ok in verified:
            if not ok:
                self.wrong += 1
        for rid, start, end, decoded in fwd:
            req = self.active.get(rid)
            if req is None:
                continue
            if decoded:
                req.decoded = decoded
                self.sched.on_computed(req.h, len(req.prompt) + decoded)
                if decoded == self.a.decode:
                    self.finish(req)
                    self.done_index.add(req.index)
            else:
                req.computed = end
                self.sched.on_computed(req.h, end)
                if end == len(req.prompt):
                    if self.a.decode:
                        req.state = "decode"
                    else:
                        self.finish(req)
                        self.done_index.add(req.index)
        for h in ev.loaded:
            req = self.by_handle[h]
            self.view.release_lease(req.lease)
            self.restores += 1
            req.computed = req.load_end
            req.state = "prefill"
            self.pending_verify.append((req.rid, req.load_end))
        for h in ev.load_failed:
            req = self.by_handle[h]
            self.view.release_lease(req.lease)
            req.state = "prefill"  # recompute from the floor (0)
        for h in ev.freeable:
            req = self.by_handle.get(h)
            if req is not None:
                self.release(req)

    def rank_died(self, dead, plan):
        """A rank process is gone, and with it its share of every request in flight. Its
        operations of this step were failed (rank_lost), so nothing it owed commits. The requests
        in flight are aborted and requeued: their later lookups resume from what the quorum
        committed, or recompute. The Scheduler is replaced by a new one (commits are rediscovered
        from the tiers): Scheduler.finish() would still run an ended request's last saves, which
        the restarted rank would take from KV memory it never computed. Then the rank starts
        again, with fresh KV memory."""
        self.rank_deaths += len(dead)
        lost = {op.request: op.slot.tokens for op in plan.saves if op.slot}
        again = []
        for req in self.active.values():
            if req.state == "loading":
                self.view.release_lease(req.lease)
            retry = Request(req.index, req.prompt, req.after)
            retry.below = lost.get(req.rid)
            retry.requeued = True
            again.append(retry)
        self.requeued += len(again)
        self.queue[0:0] = again
        self.pending_ended += list(self.active) + [q.rid for q in self.by_handle.values()
                                                    if q.rid not in self.active]
        self.active.clear()
        self.by_handle.clear()
        self.pending_verify = []
        self.free_blocks = list(range(self.num_blocks))
        self.free_groups = list(range(self.a.concurrency))
        self.retire_scheduler()
        self.sched = libtier.Scheduler.create(self.config, self.view, self.ns)
        for r in dead:
            r.restart()
        self.tell_pids()

    def retire_scheduler(self):
        """Keeps the counters of a scheduler that is replaced, and closes it."""
        for k, v in self.sched.metrics([])["engine"].items():
            if isinstance(v, int) and not k.endswith("_pending"):
                self.retired[k] += v
        self.sched.close()

    def run(self):
        while self.queue or self.active:
            self.step()
        for _ in range(100):  # idle steps until every save is terminal and every block is free
            if self.sched.saves_pending == 0 and len(self.free_blocks) == self.num_blocks:
                break
            self.step()

    def close(self):
        for r in self.ranks:
            r.conn.send(("finish",))
        out = []
        for r in self.ranks:
            tag, metrics, figures = r.conn.recv()
            r.proc.join(30)
            out.append((r, metrics["workers"][0], figures))
            self.rank_tiers.update(metrics["tiers"])
        self.sched_metrics = self.sched.metrics([self.view])
        for k, v in self.retired.items():
            self.sched_metrics["engine"][k] += v
        self.sched.close()
        self.view.close()
        self.view_layout.close()
        self.view_store.close()
        return out


def gpu_count() -> int:
    """GPUs visible to this process, without a GPU package: the CUDA driver's count."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        if cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0:
            return n.value
    except OSError:
        pass
    return 1  # the layout reports a clear error when there is no GPU at all


def agreement(engine, finals):
    """Every rank's own counters against the reports the scheduler received from it (this
    incarnation), and, without faults, every rank's loads against the engine's."""
    problems = []
    engine_counts = engine.sched_metrics["engine"]
    for r, w, _ in finals:
        t = r.tally
        pairs = {"loads_ok": t[("load", True)], "loads_failed": t[("load", False)],
                 "slot_publishes": t[("slot_save", True)],
                 "saves_ok + saves_failed": t[("page_save", True)] + t[("page_save", False)]}
        have = {"loads_ok": w["loads_ok"], "loads_failed": w["loads_failed"],
                "slot_publishes": w["slot_publishes"],
                "saves_ok + saves_failed": w["saves_ok"] + w["saves_failed"]}
        for k, v in pairs.items():
            if have[k] != v:
                problems.append(f"rank {r.rank}: {k} {have[k]}, the scheduler got {v}")
        if engine.rank_deaths == 0 and w["loads_ok"] != engine_counts["load_requests"]:
            problems.append(f"rank {r.rank}: loads_ok {w['loads_ok']}, the engine's "
                            f"load_requests {engine_counts['load_requests']}")
    if engine_counts["load_requests"] != engine.restores:
        problems.append(f"load_requests {engine_counts['load_requests']}, restores checked "
                        f"{engine.restores}")
    return problems


def figures_line(r, f, w):
    def rate(nbytes, s):
        return f"{nbytes / s / 1e9:.2f} GB/s" if s > 0 else "-"

    def per(s, n):
        return f"{s / n * 1e3:.3f} ms each" if n else "-"

    return (f"rank {r.rank} (pid {r.pid}, {'GPU ' + str(r.spec['device']) if r.spec['device'] is not None else 'host'}): "
            f"restores {f['restores']}, {f['restore_bytes'] / 2**20:.1f} MiB in "
            f"{f['restore_s'] * 1e3:.1f} ms ({rate(f['restore_bytes'], f['restore_s'])}, "
            f"{per(f['restore_s'], f['restores'])}); saves {f['saves']}, "
            f"{f['save_bytes'] / 2**20:.1f} MiB in {f['save_s'] * 1e3:.1f} ms "
            f"({rate(f['save_bytes'], f['save_s'])}); restored from "
            + ", ".join(f"{t} {b / 2**20:.1f} MiB" for t, b in w["loaded_bytes_by_tier"].items()))


def scheduler_main(args, report_conn):
    """The scheduler process: serves the workload, then reports a summary to the launcher."""
    a = argparse.Namespace(**args)
    ctx = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    engine = Engine(a, ctx, report_conn)
    engine.run()
    wall = time.perf_counter() - t0
    finals = engine.close()
    problems = agreement(engine, finals)
    e = engine.sched_metrics["engine"]
    steps_with_work = [b for b in engine.plan_bytes if b > 40]
    summary = {
        "ranks": a.ranks, "requests": len(engine.done_index), "restores": engine.restores,
        "wrong": engine.wrong + engine.offered_unsaved, "wrong_restores": engine.wrong,
        "offered_unsaved": engine.offered_unsaved, "steps": engine.steps,
        "rank_deaths": engine.rank_deaths, "requeued": engine.requeued,
        "resumed_after_death": engine.resumed_after_death,
        "restarted_ranks": [r.rank for r, _, _ in finals if r.incarnation > 1],
        "engine": e, "workers": [w for _, w, _ in finals], "tiers": engine.rank_tiers,
        "view_tiers": engine.sched_metrics["tiers"],
        "figures": [dict(f, rank=r.rank, device=r.spec["device"]) for r, _, f in finals],
        "agree": not problems, "disagreements": problems, "wall_s": wall,
        "wire": {"plan_bytes_mean": sum(steps_with_work) / max(1, len(steps_with_work)),
                 "plan_bytes_max": max(engine.plan_bytes),
                 "plan_bytes_idle": min(engine.plan_bytes),
                 "report_bytes_mean": sum(engine.report_bytes) / max(1, len(engine.report_bytes)),
                 "report_bytes_max": max(engine.report_bytes)},
        "figure_lines": [figures_line(r, f, w) for r, w, f in finals],
    }
    report_conn.send(("summary", summary))


# ---- the launcher --------------------------------------------------------------------------

def running(pid) -> bool:
    """Whether a process that is not this one's child runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, timeout=20.0):
    """Waits for a dead scheduler's rank processes to end; returns those still running."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if running(p)]


def run_scheduler(ctx, args):
    """Runs one scheduler process; returns (its summary or None, its exit code, rank pids)."""
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=scheduler_main, args=(args, child), name="scheduler")
    proc.start()
    child.close()
    summary, pids = None, []
    while True:
        try:
            tag, value = parent.recv()
        except EOFError:
            break
        if tag == "pids":
            pids = value
        else:
            summary = value
    proc.join()
    return summary, proc.exitcode, pids


def main(argv=None) -> dict:
    a = parse_args(argv)
    own_segment = a.segment is None
    if own_segment:
        a.segment = f"libtier-tp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    result = {}
    try:
        if a.kill_scheduler_at_step:
            _, code, pids = run_scheduler(ctx, vars(a))
            result["orphans"] = wait_gone(pids)
            result["killed_scheduler_exit"] = code
            print(f"scheduler process killed at step {a.kill_scheduler_at_step} (exit {code}); "
                  f"{len(pids) - len(result['orphans'])} of its {len(pids)} rank processes ended "
                  f"with it; a new scheduler process and new ranks serve the workload again")
            a.kill_scheduler_at_step = None
        summary, code, _ = run_scheduler(ctx, vars(a))
        if summary is None:
            raise SystemExit(f"the scheduler process failed (exit {code})")
        result.update(summary)
    finally:
        if own_segment:
            try:
                os.unlink(os.path.join("/dev/shm", a.segment))
            except FileNotFoundError:
                pass
    s = result
    e = s["engine"]
    kv = (f"KV in GPU memory (rank r on GPU r mod {gpu_count()})" if a.device
          else "KV in host memory")
    print(f"{s['ranks']} rank processes and a scheduler process; {kv}; shared tier "
          f"shm:{a.segment} ({a.shm_capacity}){'; a disk tier per rank' if a.disk else ''}")
    print(f"steps {s['steps']}, load_requests {e['load_requests']}, load_failures "
          f"{e['load_failures']}, loaded_tokens {e['loaded_tokens']}, save_requests "
          f"{e['save_requests']}, slot_commits {e['slot_commits']}, commits_rediscovered "
          f"{e['commits_rediscovered']}")
    w = s["wire"]
    print(f"wire: plan {w['plan_bytes_mean']:.0f} B per step with work (max "
          f"{w['plan_bytes_max']}, idle {w['plan_bytes_idle']}), reports "
          f"{w['report_bytes_mean']:.0f} B per rank per step (max {w['report_bytes_max']})")
    for line in s["figure_lines"]:
        print(line)
    if s["rank_deaths"]:
        print(f"rank processes lost {s['rank_deaths']}, restarted {s['restarted_ranks']}; "
              f"requests requeued {s['requeued']}; their lookups (tokens offered, boundary "
              f"lost): {[(x['lookup'], x['lost']) for x in s['resumed_after_death']]}; "
              f"boundaries offered that the quorum never saved: {s['offered_unsaved']}")
    print("counters agree across processes" if s["agree"]
          else "counters DISAGREE: " + "; ".join(s["disagreements"]))
    if a.json:
        print(json.dumps({k: v for k, v in s.items() if k != "figure_lines"}))
    print(f"ranks {s['ranks']}, requests {s['requests']}, restores {s['restores']}, "
          f"wrong {s['wrong']}")
    return result


if __name__ == "__main__":
    r = main()
    sys.exit(0 if r["wrong"] == 0 and r["agree"] else 1)
