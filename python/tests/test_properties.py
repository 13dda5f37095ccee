"""Property-based tests of the embedding surface (issue 26), with Debian's python3-hypothesis.

A state machine drives random programs of Store, Dsv4Layout, Worker and Scheduler calls: saves and
loads (blocking and asynchronous, then waited for in any order), removes, lookups, engine steps,
closes and reopens in any order, bursts of 1 to 4 threads (one of which may close the store under
the others), with buffers of every accepted kind (numpy arrays of several dtypes, (ptr, nbytes),
Region, scatter/gather lists, __array_interface__ objects) and hostile ones (sizes that wrap,
forged typestr and shapes, negative sizes, read-only arrays for a load, bad keys). A model says
what each call must return. The properties:

  - no crash and no hang (a watchdog ends the process with every thread's stack after 15 min);
  - no wrong byte: every load that reports OK holds exactly the bytes first saved under its key
    (saves are put-if-absent);
  - every error is a libtier.Error, of the kind the model expects.

The number of programs comes from TIER_HYPOTHESIS_EXAMPLES (`make test`: 40 programs of up to 25
steps, derandomized so that CI runs the same ones; `make bench`, .ci/bench: 1000, random).
"""

import faulthandler
import os
import threading

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

import libtier  # noqa: E402
from test_engine import CONFIG, GEOMETRY  # noqa: E402

EXAMPLES = int(os.environ.get("TIER_HYPOTHESIS_EXAMPLES", "40"))
LONG = EXAMPLES > 100
PROFILE = {"tiers": [{"name": "cpu", "capacity": "128MiB", "backend": {"type": "cpu"}}]}
OK, NOT_FOUND, INVALID = libtier.Code.OK, libtier.Code.NOT_FOUND, libtier.Code.INVALID_ARGUMENT

KEYS = [f"{i:032x}" for i in range(1, 7)]  # blocking calls
ASYNC_KEYS = [f"{0xa0 + i:032x}" for i in range(4)]  # asynchronous batches only (FIFO order)
SIZES = st.one_of(st.integers(0, 64), st.integers(65, 70000), st.sampled_from([4096, 65536]))
KINDS = ["array", "float32", "ptr", "region", "scatter", "interface"]


class Interface:
    """An object with an __array_interface__ (valid or forged)."""

    def __init__(self, ptr, shape, typestr="|u1", read_only=False, strides=None, keep=None):
        self.__array_interface__ = {"data": (ptr, read_only), "shape": shape,
                                    "typestr": typestr, "strides": strides, "version": 3}
        self.keep = keep  # the memory it points into


def as_buffer(arr, kind, rng):
    """`arr` (uint8, C-contiguous, owned by the caller) as a buffer of `kind`."""
    n = arr.nbytes
    ptr = arr.ctypes.data
    if kind == "array":
        return arr
    if kind == "float32":
        return arr.view(np.float32) if n % 4 == 0 else arr
    if kind == "ptr":
        return (ptr, n)
    if kind == "region":
        return libtier.Region(ptr, n)
    if kind == "interface":
        return Interface(ptr, (n,), keep=arr)
    cuts = sorted(rng.integers(0, n + 1, 2)) if n else [0, 0]
    return [arr[: cuts[0]], arr[cuts[0]: cuts[1]], arr[cuts[1]:]]


def hostile(kind, arr):
    """A buffer the library must refuse, and whether it refuses it per item (a code) rather than
    by raising."""
    ptr = arr.ctypes.data
    return {
        "wrap": (lambda: libtier.Region(ptr, 2**64 - 8), False),
        "huge": (lambda: libtier.Region(ptr, 2**60), True),
        "sum": (lambda: [libtier.Region(4096, 2**63), libtier.Region(4096, 2**63)], True),
        "typestr": (lambda: Interface(ptr, (4,), "<f-8"), False),
        "shape": (lambda: Interface(ptr, (2**40, 2**40), "<f8"), False),
        "negative": (lambda: Interface(ptr, (-3,)), False),
        "strides": (lambda: Interface(ptr, (4, 4), "|u1", strides=(1, 4)), False),
        "tuple": (lambda: (ptr, -1), False),
        "tuple64": (lambda: (ptr, 2**64), False),
    }[kind]


HOSTILE = ["wrap", "huge", "sum", "typestr", "shape", "negative", "strides", "tuple", "tuple64"]


def expect_error(fn, *kinds):
    """Runs fn; it must raise a libtier.Error of one of `kinds` (anything else fails)."""
    try:
        fn()
    except libtier.Error as e:
        assert isinstance(e, kinds), f"{type(e).__name__}: {e}"
        return e
    except BaseException as e:  # noqa: BLE001
        raise AssertionError(f"not a libtier.Error: {type(e).__name__}: {e}") from e
    raise AssertionError("no error")


def call(fn):
    """Runs fn; any exception that is not a libtier.Error fails the test."""
    try:
        return fn()
    except libtier.Error:
        raise
    except BaseException as e:  # noqa: BLE001
        raise AssertionError(f"not a libtier.Error: {type(e).__name__}: {e}") from e


class Embedding(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(0)
        self.store = libtier.Store.open(PROFILE)
        self.model = {}  # key -> bytes (np.uint8 array) of the blocking key space
        self.amodel = {}  # the same for the asynchronous key space, as of the last submit
        self.pending = []  # (ticket, op, key, buffer array, expected or None)
        self.ns = libtier.namespace_id({"model": "hypothesis"})
        self.layout = self.worker = self.sched = None
        self.engine_ok = False  # the engine objects were made over the current store
        self.request = 0
        self.saved_prompts = []  # prompts whose PAGE chunks the engine saved (with their seeds)
        self.make_engine()

    def teardown(self):
        for obj in (self.sched, self.worker, self.layout, self.store):
            if obj is not None:
                obj.close()

    def data(self, size, seed):
        return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)

    # ---- the store ------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), size=SIZES, kind=st.sampled_from(KINDS), seed=st.integers(0, 9))
    def save(self, key, size, kind, seed):
        arr = self.data(size, seed)
        buf = as_buffer(arr, kind, self.rng)
        if self.store.closed:
            expect_error(lambda: self.store.save([key], [buf]), libtier.BadState)
            return
        assert call(lambda: self.store.save([key], [buf])) == [OK]
        self.model.setdefault(key, arr.copy())

    @rule(key=st.sampled_from(KEYS), size=SIZES, kind=st.sampled_from(KINDS))
    def load(self, key, size, kind):
        arr = np.full(size, 0xEE, np.uint8)
        buf = as_buffer(arr, kind, self.rng)
        if self.store.closed:
            expect_error(lambda: self.store.load([key], [buf]), libtier.BadState)
            return
        codes, tiers = call(lambda: self.store.load_with_tiers([key], [buf]))
        want = self.model.get(key)
        if want is None:
            assert codes == [NOT_FOUND] and tiers == [-1]
        elif want.nbytes != size:
            assert codes == [INVALID], (codes, want.nbytes, size)
        else:
            assert codes == [OK] and tiers == [0]
            assert np.array_equal(arr, want), "a load served wrong bytes"

    @rule(key=st.sampled_from(KEYS), which=st.sampled_from(HOSTILE), load=st.booleans())
    def hostile_buffer(self, key, which, load):
        arr = np.zeros(64, np.uint8)
        make, per_item = hostile(which, arr)
        op = self.store.load if load else self.store.save
        if self.store.closed:
            expect_error(lambda: op([key], [make()]), libtier.BadState, libtier.InvalidArgument)
        elif per_item:
            assert call(lambda: op([key], [make()])) == [INVALID]
        else:
            expect_error(lambda: op([key], [make()]), libtier.InvalidArgument)

    @rule(which=st.sampled_from(["readonly", "count", "badkey", "shortkey", "notabuffer"]))
    def hostile_call(self, which):
        arr = np.zeros(16, np.uint8)
        ro = arr.copy()
        ro.flags.writeable = False
        calls = {
            "readonly": lambda: self.store.load([KEYS[0]], [ro]),
            "count": lambda: self.store.save([KEYS[0]], [arr, arr]),
            "badkey": lambda: self.store.save(["xyz"], [arr]),
            "shortkey": lambda: self.store.save([b"short"], [arr]),
            "notabuffer": lambda: self.store.save([KEYS[0]], [3.5]),
        }
        expect_error(calls[which], libtier.InvalidArgument, libtier.BadState)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key):
        if self.store.closed:
            expect_error(lambda: self.store.remove([key]), libtier.BadState)
            return
        codes = call(lambda: self.store.remove([key]))
        assert codes[0] in (OK, NOT_FOUND)  # removing an absent key is not an error
        self.model.pop(key, None)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5))
    def lookup(self, keys):
        if self.store.closed:
            expect_error(lambda: self.store.exists(keys), libtier.BadState)
            return
        assert call(lambda: self.store.exists(keys)) == [k in self.model for k in keys]
        n = 0
        while n < len(keys) and keys[n] in self.model:
            n += 1
        assert call(lambda: self.store.lookup_prefix(keys)) == n

    @rule(key=st.sampled_from(ASYNC_KEYS), size=SIZES, kind=st.sampled_from(KINDS),
          seed=st.integers(0, 9), load=st.booleans())
    def submit(self, key, size, kind, seed, load):
        arr = np.full(size, 0xEE, np.uint8) if load else self.data(size, seed)
        buf = as_buffer(arr, kind, self.rng)
        op = self.store.load_async if load else self.store.save_async
        if self.store.closed:
            expect_error(lambda: op([key], [buf]), libtier.BadState)
            return
        ticket = call(lambda: op([key], [buf]))
        # Batches run in submit order on the store's one transfer thread, and nothing else
        # touches these keys: the model as of now is what the batch will see.
        if load:
            self.pending.append((ticket, "load", key, arr, self.amodel.get(key)))
        else:
            self.amodel.setdefault(key, arr.copy())
            self.pending.append((ticket, "save", key, arr, None))

    @precondition(lambda self: self.pending)
    @rule(pick=st.integers(0, 100), by_ticket=st.booleans())
    def wait(self, pick, by_ticket):
        ticket, op, key, arr, want = self.pending.pop(pick % len(self.pending))
        if self.store.closed:
            expect_error(lambda: self.store.wait(ticket, timeout=60), libtier.BadState)
            return
        if not by_ticket:  # any finished batch: put it back and check whichever comes
            self.pending.append((ticket, op, key, arr, want))
            c = call(lambda: self.store.wait(timeout=60))
            i = next(i for i, p in enumerate(self.pending) if p[0] == c.ticket)
            ticket, op, key, arr, want = self.pending.pop(i)
        else:
            c = call(lambda: self.store.wait(ticket, timeout=60))
        assert c.ticket == ticket and c.op == op
        if op == "save":
            assert c.codes == [OK]
        elif want is None:
            assert c.codes == [NOT_FOUND]
        elif want.nbytes != arr.nbytes:
            assert c.codes == [INVALID]
        else:
            assert c.codes == [OK]
            assert np.array_equal(arr, want), "an asynchronous load served wrong bytes"

    @rule()
    def poll(self):
        if self.store.closed:
            expect_error(self.store.poll, libtier.BadState)
            return
        for c in call(self.store.poll):
            i = next(i for i, p in enumerate(self.pending) if p[0] == c.ticket)
            _, op, key, arr, want = self.pending.pop(i)
            if op == "load" and want is not None and want.nbytes == arr.nbytes:
                assert c.codes == [OK] and np.array_equal(arr, want)

    @rule()
    def close_store(self):
        call(self.store.close)
        call(self.store.close)  # a second close does nothing
        self.pending.clear()

    @precondition(lambda self: self.store.closed)
    @rule()
    def reopen_store(self):
        self.store = libtier.Store.open(PROFILE)
        self.model.clear()
        self.amodel.clear()
        self.engine_ok = False

    # ---- threads --------------------------------------------------------------------------

    @rule(threads=st.integers(1, 4), ops=st.integers(1, 6), close_at=st.one_of(st.none(), st.integers(0, 20)),
          size=st.integers(1, 20000))
    def burst(self, threads, ops, close_at, size):
        """Threads save, load and wait on their own keys; one closer may close the store among
        them. Each call finishes or raises BadState; every load that reports OK is right."""
        store, errors = self.store, []
        barrier = threading.Barrier(threads + (close_at is not None))

        def run(tid):
            barrier.wait()
            try:
                for i in range(ops):
                    key = f"{0xbeef:08x}{tid:08x}{i:016x}"
                    data = self.data(size, tid * 100 + i)
                    assert store.save([key], [data]) == [OK]
                    out = np.zeros_like(data)
                    if i % 2:
                        assert store.wait(store.load_async([key], [out]), timeout=60).codes == [OK]
                    else:
                        assert store.load([key], [out]) == [OK]
                    assert np.array_equal(out, data), "wrong bytes under threads"
                    store.remove([key])
            except libtier.BadState:
                pass
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def closer():
            barrier.wait()
            for _ in range(close_at):
                threading.Event().wait(0.0005)
            store.close()

        ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        if close_at is not None:
            ts.append(threading.Thread(target=closer))
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=120)
            assert not t.is_alive(), "a thread hung"
        assert not errors, errors
        if store.closed:
            self.pending.clear()

    # ---- the engine -----------------------------------------------------------------------

    @precondition(lambda self: self.sched is None and self.worker is None and self.layout is None
                  and not self.store.closed)
    @rule()
    def make_engine(self):
        self.layout = libtier.Dsv4Layout.create(GEOMETRY, self.ns)
        self.worker = libtier.Worker.create(CONFIG, 0, self.store, self.layout, self.ns)
        self.sched = libtier.Scheduler.create(CONFIG, self.worker, self.ns)
        self.engine_ok = True
        self.saved_prompts = []

    @precondition(lambda self: self.layout is not None)
    @rule(which=st.sampled_from(["layout", "worker", "sched"]))
    def close_engine_object(self, which):
        obj = getattr(self, which)
        call(obj.close)
        if which == "layout":
            expect_error(lambda: obj.page_regions([0]), libtier.BadState)
        elif which == "worker":
            expect_error(obj.progress, libtier.BadState)
        else:
            expect_error(obj.build_step, libtier.BadState)

    @precondition(lambda self: self.sched is not None and self.sched_open() and self.worker_open())
    @rule(seed=st.integers(1, 2), chunks=st.integers(1, 2))
    def engine_request(self, seed, chunks):
        """A request whose chunks are computed into blocks (when the layout is open) and saved;
        then, for a prompt saved before, a lookup that must find its PAGE chunks."""
        prompt = np.arange(seed * 1000, seed * 1000 + chunks * 128, dtype=np.uint32)
        self.request += 1
        h = call(lambda: self.sched.add_request(self.request, prompt))
        m = call(lambda: self.sched.lookup(h))
        if self.engine_ok and any(p == (seed, chunks) for p in self.saved_prompts):
            assert m.page_hit == chunks * 128
        if m.tokens or not self.layout_open():
            call(lambda: self.sched.finish(h))
            self.step()
            return
        call(lambda: self.sched.after_alloc(h, local_tokens=0, blocks=list(range(chunks)), group=0))
        for c in range(chunks):
            for i, r in enumerate(self.layout.page_regions([c])):
                a = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * r.nbytes).from_address(r.ptr))
                a[:] = np.random.default_rng(seed * 10 + c * 100 + i).integers(0, 256, r.nbytes, np.uint8)
        call(lambda: self.sched.on_computed(h, chunks * 128))
        ok = all(self.step() for _ in range(3))
        call(lambda: self.sched.finish(h))
        self.step()
        if ok and self.engine_ok and self.sched.saves_pending == 0:
            self.saved_prompts.append((seed, chunks))

    def step(self):
        plan = call(self.sched.build_step)
        call(lambda: self.worker.submit(plan))
        call(self.worker.progress)
        reports = call(self.worker.take_reports)
        call(lambda: self.sched.process(reports))
        return all(r.ok for r in reports)

    def sched_open(self):
        try:
            return self.sched.loads_pending >= 0
        except libtier.BadState:
            return False

    def worker_open(self):
        try:
            return self.worker.queued_saves >= 0
        except libtier.BadState:
            return False

    def layout_open(self):
        try:
            return self.layout.block_tokens > 0
        except libtier.BadState:
            return False

    @precondition(lambda self: self.sched is not None)
    @rule()
    def drop_engine(self):
        for obj in (self.sched, self.worker, self.layout):
            call(obj.close)
        self.sched = self.worker = self.layout = None

    @invariant()
    def closed_store_refuses(self):
        if self.store.closed:
            expect_error(lambda: self.store.tier_names, libtier.BadState)


Embedding.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40 if LONG else 25,
    deadline=None,
    database=None,
    derandomize=not LONG,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(autouse=True, scope="module")
def watchdog():
    """A hang ends the process with every thread's stack (pytest would wait for ever)."""
    faulthandler.dump_traceback_later(900 if not LONG else 7200, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


TestEmbedding = Embedding.TestCase
