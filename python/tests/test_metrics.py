"""What an operator scrapes (docs/metrics.md), after a replay of the trace through a Store whose
profile starts the HTTP endpoint: the three families (usage gauges, the stack's counters, the
op_duration histogram) read with curl and through a prometheus_client registry, and checked
against what the replay did: bytes used equal the sum of the stored images' sizes (Store.stat),
the histogram counts equal the operations done."""

import importlib.util
import json
import os
import shutil
import subprocess

import pytest

import libtier

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import libtier.prometheus  # noqa: E402

BLOCK_BYTES = 4096
LIMIT = 400  # requests of the trace: a few seconds


def replay_module(source_root):
    path = os.path.join(source_root, "python", "examples", "replay_trace.py")
    spec = importlib.util.spec_from_file_location("replay_trace", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def trace(source_root, tmp_path):
    """The real trace's first LIMIT requests, or a synthetic one of shared prefixes."""
    real = os.path.join(os.environ.get("TIER_TEST_DATA", os.path.join(source_root, "..",
                                                                     "shared", "data")),
                        "mooncake_conversation_trace.jsonl")
    out = tmp_path / "trace.jsonl"
    lines = []
    if os.path.exists(real):
        with open(real, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    lines.append(line.strip())
                if len(lines) == LIMIT:
                    break
    else:
        for i in range(LIMIT):
            ids = list(range(i % 7 * 100, i % 7 * 100 + 3 + i % 5)) + [10_000 + i]
            lines.append(json.dumps({"timestamp": i, "input_length": 512 * len(ids),
                                     "output_length": 1, "hash_ids": ids}))
    out.write_text("\n".join(lines) + "\n")
    return str(out)


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, family, sample_name, **labels):
    for s in fams[family].samples:
        if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{sample_name} {labels}")


def curl(*args, **kwargs):
    """curl with `args`, without the sanitizer runtime the ASan build preloads into this
    interpreter (tests/meson.build): curl is not instrumented, and under that preload it hangs at
    start in setlocale."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run(["curl", *args], env=env, timeout=60, **kwargs)


def test_replay_scraped_over_http_and_through_prometheus_client(source_root, trace):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (make deps installs it)")
    replay = replay_module(source_root)
    requests = replay.load_trace(trace, LIMIT)
    profile = {
        "tiers": [{"name": "cpu", "capacity": "8MiB", "backend": {"type": "cpu"}}],
        "metrics": {"listen": "127.0.0.1:0"},
    }
    with libtier.Store.open(profile) as store:
        endpoint = store.metrics_endpoint
        assert endpoint and endpoint.startswith("127.0.0.1:") and not endpoint.endswith(":0")
        out = replay.replay(store, requests, BLOCK_BYTES)
        assert out["wrong_data"] == 0 and out["hit_blocks"] > 0

        url = f"http://{endpoint}/metrics"
        text = curl("-sf", "--max-time", "30", url, check=True, capture_output=True,
                    text=True).stdout
        fams = families(text)
        for name in ("libtier_tier_used_bytes", "libtier_tier_capacity_bytes",
                     "libtier_tier_objects", "libtier_op_duration_seconds",
                     "libtier_stack_saves", "libtier_stack_load_misses"):
            assert name in fams, name
        assert fams["libtier_op_duration_seconds"].type == "histogram"

        # Bytes used: the sum of the images stored, as Store.stat reports each one.
        ns = libtier.namespace_id({"workload": "tierbench-replay", "block_tokens": 512,
                                   "block_bytes": BLOCK_BYTES})
        keys = sorted({k for ids in requests for k in libtier.chunk_keys(ns, ids, 1)})
        stats = [s for s in store.stat(keys) if s is not None]
        used = value(fams, "libtier_tier_used_bytes", "libtier_tier_used_bytes", tier="cpu")
        assert used == sum(s.stored_bytes for s in stats) > 0
        assert all(s.stored_bytes == BLOCK_BYTES + 96 for s in stats)
        assert value(fams, "libtier_tier_objects", "libtier_tier_objects", tier="cpu") == len(stats)
        assert value(fams, "libtier_tier_capacity_bytes", "libtier_tier_capacity_bytes",
                     tier="cpu") == 8 << 20

        # The histogram counts: one save per block saved, one load per block loaded, a put and a
        # get per request to the tier.
        saved = out["blocks"] - out["hit_blocks"]
        loaded = out["hit_blocks"] + out["failed_loads"]
        count = "libtier_op_duration_seconds_count"
        hist = "libtier_op_duration_seconds"
        assert value(fams, hist, count, op="save", tier="cpu") == saved
        assert value(fams, hist, count, op="load", tier="cpu") == out["hit_blocks"]
        assert value(fams, hist, count, op="load", tier="none") == out["failed_loads"]
        assert value(fams, "libtier_stack_saves", "libtier_stack_saves_total") == saved
        assert value(fams, "libtier_stack_loads", "libtier_stack_loads_total") == loaded
        puts = sum(value(fams, "libtier_ops", "libtier_ops_total", tier="cpu", op="put", result=r)
                   for r in ("ok", "miss", "error"))
        gets = sum(value(fams, "libtier_ops", "libtier_ops_total", tier="cpu", op="get", result=r)
                   for r in ("ok", "miss", "error"))
        assert value(fams, hist, count, op="put", tier="cpu") == puts == saved
        assert value(fams, hist, count, op="get", tier="cpu") == gets == loaded
        assert value(fams, hist, "libtier_op_duration_seconds_bucket", op="save", tier="cpu",
                     le="+Inf") == saved

        # The same families through a prometheus_client registry, as an engine's /metrics shows.
        registry = prometheus_client.CollectorRegistry()
        libtier.prometheus.register(store, registry=registry, labels={"rank": "0"})
        assert registry.get_sample_value("libtier_tier_used_bytes",
                                         {"tier": "cpu", "rank": "0"}) == used
        assert registry.get_sample_value(count, {"op": "save", "tier": "cpu", "rank": "0"}) == saved
        exposed = families(prometheus_client.generate_latest(registry).decode())
        assert value(exposed, "libtier_tier_objects", "libtier_tier_objects", tier="cpu",
                     rank="0") == len(stats)

        # Only GET /metrics is served.
        code = curl("-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{endpoint}/other",
                    capture_output=True, text=True).stdout
        assert code == "404"
        code = curl("-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", url,
                    capture_output=True, text=True).stdout
        assert code == "405"
    # Closed: the endpoint is gone, and the collector drops the store.
    assert curl("-sf", "--max-time", "5", url).returncode != 0
    assert registry.get_sample_value("libtier_tier_used_bytes", {"tier": "cpu", "rank": "0"}) is None


def test_prometheus_register_several_stores(store):
    registry = prometheus_client.CollectorRegistry()
    with libtier.Store.open({"tiers": [{"name": "cpu", "capacity": "2MiB",
                                        "backend": {"type": "cpu"}}]}) as other:
        c1 = libtier.prometheus.register(store, registry=registry, labels={"rank": "0"})
        c2 = libtier.prometheus.register(other, registry=registry, labels={"rank": "1"})
        assert c1 is c2
        with pytest.raises(ValueError):
            libtier.prometheus.register(other, registry=registry, labels={"rank": "1"})
        assert registry.get_sample_value("libtier_tier_capacity_bytes",
                                         {"tier": "cpu", "rank": "1"}) == 2 << 20
        assert registry.get_sample_value("libtier_tier_capacity_bytes",
                                         {"tier": "cpu", "rank": "0"}) == 64 << 20
        c1.remove(other)
        assert registry.get_sample_value("libtier_tier_capacity_bytes",
                                         {"tier": "cpu", "rank": "1"}) is None


def test_metrics_endpoint_absent_without_a_metrics_section(store):
    assert store.metrics_endpoint is None
    m = store.metrics()
    assert m["tiers"]["cpu"]["usage"]["capacity_bytes"] == 64 << 20
    assert m["op_duration"]["load"]["none"]["count"] == 0


def test_metrics_endpoint_address_refused_when_not_loopback():
    with pytest.raises(libtier.InvalidArgument) as e:
        libtier.Store.open({"tiers": [{"name": "cpu", "capacity": "1MiB", "backend": "cpu"}],
                            "metrics": {"listen": "192.0.2.1:9464"}})
    assert "not a loopback address" in e.value.message and "allow_remote" in e.value.message
