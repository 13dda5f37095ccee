#!/usr/bin/env python3
"""The offload engine's per-step loop from Python (docs/engine.md, docs/integration.md).

A toy engine with one TP rank serves two turns of a conversation through libtier's Scheduler
and Worker over a small DeepSeek-V4 layout in host memory, with the tiers of profiles/cpu.json:

- turn 1 prefills its prompt in chunks; the engine saves the PAGE chunks and, at the prompt-end
  anchor, the SLOT state (checkpoint_interval_tokens = -1);
- turn 2 extends the prompt: the lookup finds turn 1's committed boundary, the load decision is
  "load", the worker restores the PAGE chunks into turn 2's (different) blocks and the SLOT into
  its (different) state group, and the engine prefills only the rest.

The "forward" writes, for every block, bytes derived from the prompt up to the block's end, and
into the state group bytes derived from the whole computed prefix, so turn 2 can check that
what libtier restored is exactly what turn 1 computed. Runs anywhere (CPU only):

    PYTHONPATH=<the libtier package> python3 python/examples/engine_loop.py

Exit status 0 when the restored KV and state are bit exact, 1 otherwise.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys

import libtier

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = 128
CONFIG = {
    "block_tokens": BLOCK,  # = the geometry's block_size x dcp_size
    "chunk_tokens": 256,  # one PAGE object per 256 tokens
    "checkpoint_interval_tokens": -1,  # one SLOT per prompt: the prompt-end anchor
    "min_load_tokens": 256,
    "stateful": True,
    "tp_size": 1,
    "max_pending_saves": 4,
}
GEOMETRY = {  # two compressed layers and a sliding window, narrow heads: small and quick
    "compress_ratios": [4, 128, 0], "kv_head_dim": 64, "rope_head_dim": 16,
    "index_head_dim": 32, "block_size": BLOCK, "sliding_window": 8,
    "num_blocks": 64, "num_slots": 4,
}


def content(tag: str, tokens: list, nbytes: int) -> bytes:
    """Deterministic bytes standing for KV computed from `tokens` (what a forward would write)."""
    seed = hashlib.blake2b(f"{tag}:{tokens}".encode(), digest_size=32).digest()
    out = bytearray()
    counter = 0
    while len(out) < nbytes:
        out += hashlib.blake2b(seed + counter.to_bytes(8, "little"), digest_size=64).digest()
        counter += 1
    return bytes(out[:nbytes])


def write(regions, tag, tokens):
    for i, r in enumerate(regions):
        ctypes.memmove(r.ptr, content(f"{tag}/{i}", tokens, r.nbytes), r.nbytes)


def matches(regions, tag, tokens) -> bool:
    return all(ctypes.string_at(r.ptr, r.nbytes) == content(f"{tag}/{i}", tokens, r.nbytes)
               for i, r in enumerate(regions))


class Engine:
    """The engine side: blocks, state groups, a fake forward, and the per-step calls."""

    def __init__(self, store: libtier.Store):
        self.ns = libtier.namespace_id({"model": "engine-loop-example", "block": BLOCK})
        self.layout = libtier.Dsv4Layout.create(GEOMETRY, self.ns, memory="host")
        self.workers = [libtier.Worker.create(CONFIG, 0, store, self.layout, self.ns)]
        self.sched = libtier.Scheduler.create(CONFIG, self.workers[0], self.ns)
        self.free_blocks = list(range(GEOMETRY["num_blocks"]))
        self.free_groups = list(range(GEOMETRY["num_slots"]))
        self.steps = 0

    # -- the engine's own memory --
    def allocate(self, tokens: int):
        n = -(-tokens // BLOCK)
        blocks, self.free_blocks = self.free_blocks[:n], self.free_blocks[n:]
        return blocks, self.free_groups.pop(0)

    def forward(self, prompt, blocks, group, start, end):
        """Computes tokens [start, end): the blocks they touch and the state group."""
        for b in range(start // BLOCK, -(-end // BLOCK)):
            upto = min((b + 1) * BLOCK, end)
            write(self.layout.page_regions([blocks[b]]), "page", prompt[:upto])
        write(self.layout.slot_regions(group), "slot", prompt[:end])

    # -- one engine step: also run with no batch (idle progress) --
    def step(self):
        plan = self.sched.build_step()
        reports = []
        for w in self.workers:  # one per TP rank (each on its own thread in a real engine)
            w.submit(plan)
            w.progress()
            reports += w.take_reports()
        self.steps += 1
        return self.sched.process(reports)

    def prefill(self, h, prompt, blocks, group, start):
        """Chunked prefill from `start`, each chunk cut on the next SLOT boundary to save."""
        computed = start
        while computed < len(prompt):
            n = self.sched.cut_prefill_chunk(h, computed, min(512, len(prompt) - computed))
            self.forward(prompt, blocks, group, computed, computed + n)
            computed += n
            self.sched.on_computed(h, computed)
            self.step()

    def finish(self, h, blocks, group):
        """Frees the request's blocks once no save of it is in flight (idle steps until then)."""
        if not self.sched.finish(h):
            for _ in range(100):
                if h in self.step().freeable:
                    break
            else:
                raise RuntimeError("the request's saves never completed")
        self.free_blocks += blocks
        self.free_groups.append(group)

    def serve(self, request_id, prompt):
        """One request: lookup, allocation, load decision, (load), prefill, finish.

        Returns what the turn resumed: (tokens loaded, whether they were bit exact)."""
        h = self.sched.add_request(request_id, prompt)
        match = self.sched.lookup(h)
        blocks, group = self.allocate(len(prompt))
        decision = self.sched.after_alloc(h, 0, blocks, group)  # nothing of it in HBM yet
        print(f"request {request_id}: {len(prompt)} tokens, lookup {match.tokens}, "
              f"decision {decision.action} ({decision.reason})")
        start, exact = 0, True
        if decision.action == "load":
            for _ in range(100):  # the request is parked until the load is terminal
                ev = self.step()
                if h in ev.loaded or h in ev.load_failed:
                    break
            if h in ev.loaded:
                start = decision.load_end
                exact = all(matches(self.layout.page_regions([blocks[b]]), "page",
                                    prompt[: (b + 1) * BLOCK]) for b in range(start // BLOCK))
                exact = exact and matches(self.layout.slot_regions(group), "slot", prompt[:start])
        self.prefill(h, prompt, blocks, group, start)
        self.finish(h, blocks, group)
        return start, exact

    def close(self):
        self.sched.close()
        for w in self.workers:
            w.close()
        self.layout.close()


def main() -> dict:
    turn1 = [(i * 7919) % 50000 for i in range(1100)]
    turn2 = turn1 + [(i * 104729) % 50000 for i in range(300)]
    with libtier.Store.open(os.path.join(ROOT, "profiles", "cpu.json")) as store:
        engine = Engine(store)
        first, _ = engine.serve(1, turn1)
        resumed, exact = engine.serve(2, turn2)
        result = {"turn1_resumed": first, "turn2_resumed": resumed, "bit_exact": exact,
                  "steps": engine.steps, "counters": engine.sched.metrics(engine.workers)}
        engine.close()
    print(f"turn 2 resumed {resumed} of {len(turn2)} tokens from libtier "
          f"({'bit exact' if exact else 'MISMATCH'}) in {result['steps']} engine steps")
    return result


if __name__ == "__main__":
    r = main()
    sys.exit(0 if r["bit_exact"] and r["turn2_resumed"] > 0 else 1)
