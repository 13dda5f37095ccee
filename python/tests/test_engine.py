"""The offload engine's per-step calls from Python over a small DSV4 layout: a request's PAGE
chunks and SLOT are saved, then a second request with the same prefix resumes from them and the
restored KV bytes equal the first request's."""

import ctypes

import numpy as np
import pytest

import libtier
from conftest import CPU_PROFILE

BLOCK = 128
CHUNKS = 4
GEOMETRY = {"compress_ratios": [4, 128, 0], "kv_head_dim": 64, "rope_head_dim": 16,
            "index_head_dim": 32, "block_size": BLOCK, "sliding_window": 8, "num_blocks": 16,
            "num_slots": 2}
CONFIG = {"block_tokens": BLOCK, "chunk_tokens": BLOCK, "checkpoint_interval_tokens": 2 * BLOCK,
          "min_load_tokens": BLOCK}


def view(region):
    """A numpy view of a host region (zero-copy)."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * region.nbytes).from_address(region.ptr))


def fill(regions, seed):
    for i, r in enumerate(regions):
        view(r)[:] = np.random.default_rng(seed * 100 + i).integers(0, 256, r.nbytes, np.uint8)


def same(regions, seed):
    return all(
        np.array_equal(view(r), np.random.default_rng(seed * 100 + i).integers(0, 256, r.nbytes, np.uint8))
        for i, r in enumerate(regions))


def step(sched, worker):
    plan = sched.build_step()
    worker.submit(plan)
    worker.progress()
    reports = worker.take_reports()
    assert all(r.ok for r in reports), [(r.channel, r.reason) for r in reports]
    return plan, sched.process(reports)


def open_engine(model):
    """(ns, store, layout, worker, sched) of rank 0 over the cpu profile, namespace of `model`."""
    ns = libtier.namespace_id({"model": model})
    store = libtier.Store.open(CPU_PROFILE)
    layout = libtier.Dsv4Layout.create(GEOMETRY, ns)
    worker = libtier.Worker.create(CONFIG, 0, store, layout, ns)
    sched = libtier.Scheduler.create(CONFIG, worker, ns)
    return ns, store, layout, worker, sched


@pytest.fixture
def engine():
    _, store, layout, worker, sched = open_engine("python-engine-test")
    yield sched, worker, layout
    sched.close()
    worker.close()
    layout.close()
    store.close()


def test_save_then_resume_restores_page_and_slot(engine):
    sched, worker, layout = engine
    assert layout.block_tokens == BLOCK and layout.page_bytes_per_block > 0
    prompt = np.arange(1000, 1000 + CHUNKS * BLOCK + 5, dtype=np.uint32)

    h1 = sched.add_request(1, prompt[: CHUNKS * BLOCK])
    assert sched.lookup(h1).tokens == 0
    d = sched.after_alloc(h1, local_tokens=0, blocks=[0, 1, 2, 3], group=0)
    assert (d.action, d.reason) == ("none", "no_hit")
    for c in range(CHUNKS):
        fill(layout.page_regions([c]), c + 1)
    fill(layout.slot_regions(0), 99)
    sched.on_computed(h1, CHUNKS * BLOCK)
    saves = 0
    for _ in range(4):
        plan, _ = step(sched, worker)
        saves += len(plan.saves)
    assert saves > 0 and sched.saves_pending == 0
    assert sched.finish(h1)

    # Equal tokens under another LoRA adapter (an extra key) share no KV with request 1.
    hx = sched.add_request(9, prompt, extra_key="lora:b")
    assert sched.lookup(hx).tokens == 0 and sched.lookup(hx).page_hit == 0
    assert sched.finish(hx)
    assert sched.epoch != 0

    h2 = sched.add_request(2, prompt)
    m = sched.lookup(h2)
    assert m.tokens == CHUNKS * BLOCK and m.slot is not None and m.slot.tokens == CHUNKS * BLOCK
    blocks = [8, 9, 10, 11, 12]
    with pytest.warns(DeprecationWarning, match="local_tokens"):  # the old keyword, one release
        d = sched.after_alloc(h2, hbm_tokens=0, blocks=blocks, group=1)
    assert d.action == "load" and (d.load_start, d.load_end) == (0, CHUNKS * BLOCK)
    plan, ev = step(sched, worker)
    assert len(plan.loads) == 1
    op = plan.loads[0]
    assert op.request == 2 and op.block_ids == blocks[:CHUNKS] and len(op.chunk_keys) == CHUNKS
    assert (op.page_start, op.page_end) == (0, CHUNKS * BLOCK)
    with pytest.warns(DeprecationWarning, match="page_start"):
        assert op.hbm_tokens == op.page_start
    with pytest.warns(DeprecationWarning, match="page_end"):
        assert op.lmc_tokens == op.page_end
    assert op.slot is not None and op.slot_group == 1
    assert ev.loaded == [h2] and ev.load_failed == []
    for c in range(CHUNKS):
        assert same(layout.page_regions([blocks[c]]), c + 1)
    assert same(layout.slot_regions(1), 99)
    m = sched.metrics([worker])
    assert m["engine"]["load_requests"] == 1
    assert "libtier_engine_load_requests_total 1" in sched.metrics_prometheus([worker])


def test_engine_errors(engine):
    sched, worker, layout = engine
    with pytest.raises(libtier.NotFound):
        sched.lookup(12345)
    with pytest.raises(libtier.InvalidArgument):
        layout.page_regions([10**6])
    with pytest.raises(libtier.NotFound):
        libtier.Dsv4Layout.create("no-such-preset", libtier.namespace_id({}))
    with pytest.raises(libtier.InvalidArgument):
        libtier.Scheduler.create({"block_tokens": "x"}, worker, libtier.namespace_id({}))
    with pytest.raises(libtier.InvalidArgument, match="channel"):
        sched.process([libtier.OpReport("nope", 1, 1, 0, True)])


def test_plans_and_reports_cross_processes_as_bytes(engine):
    """The wire format (docs/engine.md "Wire format"): a plan and reports as bytes and back, the
    header as documented, and every damaged message refused (never a partial plan)."""
    import struct

    sched, worker, layout = engine
    prompt = np.arange(5000, 5000 + CHUNKS * BLOCK, dtype=np.uint32)
    h = sched.add_request(1, prompt)
    sched.lookup(h)
    sched.after_alloc(h, local_tokens=0, blocks=[0, 1, 2, 3], group=0)
    sched.on_computed(h, CHUNKS * BLOCK)
    plan = sched.build_step()
    assert plan.saves and plan.saves[0].slot is not None
    data = plan.encode()
    magic, version, kind, flags, body, reserved = struct.unpack_from("<4sHBBII", data)
    assert (magic, version, kind, flags, reserved) == (b"LTWM", 1, 1, 0, 0)
    assert body == len(data) - 24
    back = libtier.StepPlan.decode(data)
    assert back.step == plan.step
    for a, b in zip(plan.saves, back.saves):
        assert (a.request, a.generation, a.page_start, a.page_end) == \
            (b.request, b.generation, b.page_start, b.page_end)
        assert a.chunk_keys == b.chunk_keys and a.block_ids == b.block_ids
        assert a.prefix_keys == b.prefix_keys and len(a.prefix_keys) == a.slot.tokens // BLOCK
        assert (a.slot.tokens, a.slot.key, a.slot_group) == (b.slot.tokens, b.slot.key, b.slot_group)
    assert libtier.StepPlan.decode(bytearray(data)).step == plan.step
    assert libtier.StepPlan.decode(memoryview(data)).step == plan.step
    with pytest.raises(libtier.InvalidArgument, match="truncated"):
        libtier.StepPlan.decode(data[:-1])
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(libtier.ChecksumMismatch):
        libtier.StepPlan.decode(bytes(flipped))
    with pytest.raises(libtier.NotSupported):
        libtier.StepPlan.decode(data[:4] + b"\x02\x00" + data[6:])
    with pytest.raises(libtier.InvalidArgument):
        libtier.decode_reports(data)  # a plan is not reports

    for c in range(CHUNKS):
        fill(layout.page_regions([c]), c + 1)
    worker.submit(back)  # the decoded plan, as a rank process submits it
    worker.progress()
    reports = worker.take_reports()
    wire = libtier.encode_reports(reports)
    got = libtier.decode_reports(wire)
    assert [(r.channel, r.request, r.generation, r.rank, r.ok, r.reason, r.outcome) for r in got] == \
        [(r.channel, r.request, r.generation, r.rank, r.ok, r.reason, r.outcome) for r in reports]
    sched.process(got)
    assert sched.saves_pending == 0
    failed = libtier.OpReport("slot_save", 1, 99, 0, False, "sidecar_corrupt")
    assert libtier.decode_reports(libtier.encode_reports([failed]))[0].reason == "sidecar_corrupt"
    with pytest.raises(libtier.InvalidArgument, match="unknown report reason"):
        libtier.OpReport("load", 1, 1, 0, False, "made up")
    m = worker.metrics()
    assert m["workers"][0]["rank"] == 0 and m["workers"][0]["slot_publishes"] == 1
    assert "rank0/cpu" in m["tiers"] and "engine" not in m


def test_a_gpu_order_for_a_host_layout_fails_the_plan(engine):
    """Worker.submit(plan, stream=...) hands the caller's GPU stream to the layout; a layout in
    host memory has nothing to order and every operation of the plan is reported failed."""
    sched, worker, layout = engine
    prompt = np.arange(2000, 2000 + CHUNKS * BLOCK, dtype=np.uint32)
    h = sched.add_request(7, prompt)
    sched.after_alloc(h, local_tokens=0, blocks=[4, 5, 6, 7], group=0)
    sched.on_computed(h, CHUNKS * BLOCK)
    plan = sched.build_step()
    assert len(plan.saves) > 0
    worker.submit(plan, stream=1)
    reports = worker.take_reports()
    assert reports and all(not r.ok and r.reason == "device_order" for r in reports)
    assert worker.queued_saves == 0
