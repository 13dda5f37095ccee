"""One Store shared by several Python threads (issue 29): put-if-absent across threads, loads
beside saves of the same key, and close() while other threads are inside transfers."""

import threading

import numpy as np

import libtier
from conftest import CPU_PROFILE


def run_threads(n, target):
    errors = []

    def wrap(t):
        try:
            target(t)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=wrap, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_saves_of_one_key_from_several_threads_store_one_whole():
    with libtier.Store.open(CPU_PROFILE) as store:
        n, elems = 6, 1 << 16
        for round_ in range(5):
            key = [libtier.external_key(f"same-{round_}")]
            srcs = [np.full(elems, 1000 * round_ + t, dtype=np.int32) for t in range(n)]
            codes = [None] * n
            barrier = threading.Barrier(n)

            def save(t):
                barrier.wait()
                codes[t] = store.save(key, [srcs[t]])

            assert run_threads(n, save) == []
            assert codes == [[libtier.Code.OK]] * n
            out = np.zeros(elems, dtype=np.int32)
            assert store.load(key, [out]) == [libtier.Code.OK]
            # One writer's bytes, whole: every element is that writer's value.
            assert out[0] in [1000 * round_ + t for t in range(n)]
            assert np.all(out == out[0])


def test_a_load_beside_a_save_of_its_key_finds_it_whole_or_missing():
    with libtier.Store.open(CPU_PROFILE) as store:
        rounds, elems = 40, 1 << 15
        src = [np.full(elems, r + 1, dtype=np.int64) for r in range(rounds)]
        seen = {"ok": 0, "miss": 0, "torn": 0}

        def work(t):
            out = np.zeros(elems, dtype=np.int64)
            for r in range(rounds):
                key = [libtier.external_key(f"race-{r}")]
                if t == 0:
                    assert store.save(key, [src[r]]) == [libtier.Code.OK]
                    continue
                code = store.load(key, [out])[0]
                if code == libtier.Code.OK:
                    seen["ok" if np.all(out == r + 1) else "torn"] += 1
                else:
                    assert code == libtier.Code.NOT_FOUND
                    seen["miss"] += 1

        assert run_threads(3, work) == []
        assert seen["torn"] == 0
        assert seen["ok"] + seen["miss"] == 2 * rounds


def test_close_waits_for_the_calls_of_other_threads():
    store = libtier.Store.open(CPU_PROFILE)
    elems = 1 << 18
    started = threading.Barrier(5)
    results = {"ok": 0, "closed": 0}
    lock = threading.Lock()

    def work(t):
        a = np.full(elems, t, dtype=np.int32)
        b = np.zeros_like(a)
        started.wait()
        r = 0
        while True:  # until the store is closed under it
            r += 1
            key = [libtier.external_key(f"close-{t}-{r}")]
            try:
                assert store.save(key, [a]) == [libtier.Code.OK]
                assert store.load(key, [b]) == [libtier.Code.OK]
                assert np.array_equal(a, b)
                with lock:
                    results["ok"] += 1
            except libtier.BadState:
                with lock:
                    results["closed"] += 1
                return

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    started.wait()
    store.close()  # while the others are inside (or between) saves and loads
    for t in threads:
        t.join()
    assert store.closed
    # Every thread stopped at BadState, after whole round trips only: none crashed or hung.
    assert results["closed"] == 4
