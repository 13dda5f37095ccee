"""python/examples/tp_processes.py: TP ranks as processes (a scheduler process and 2 or 4 rank
processes sharing one shm tier, plans and reports crossing as bytes), every restore bit exact on
every rank, the counters of every process in agreement; and the faults across processes: a rank
killed (SIGKILL) during a save and restarted, and the scheduler process killed and replaced.

Each test spawns its processes afresh (about 5 to 20 s each on the 2-core build machine)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import tp_processes  # noqa: E402

# Four conversations of three turns: prompts of 1300, 1900 and 2500 tokens (small geometry,
# 128-token blocks, 256-token chunks), three requests in flight.
SMALL = ["--conversations", "4", "--turns", "3", "--concurrency", "3"]


def last_line(capsys):
    return capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.parametrize("ranks", [2, 4])
def test_rank_processes_restore_bit_exact_with_counters_in_agreement(ranks, capsys, tmp_path):
    # With 2 ranks, each also has a disk tier of its own below the shared tier.
    disk = ["--disk", str(tmp_path)] if ranks == 2 else []
    r = tp_processes.main(["--ranks", str(ranks)] + SMALL + disk)
    assert last_line(capsys) == f"ranks {ranks}, requests 12, restores {r['restores']}, wrong 0"
    assert r["agree"], r["disagreements"]
    e = r["engine"]
    # Turns 2 and 3 of every conversation resume from the previous turn's prompt-end anchor.
    assert r["restores"] == 8
    assert e["load_requests"] == 8 and e["load_failures"] == 0
    assert e["slot_commits"] >= 12
    assert len(r["workers"]) == ranks
    for w in r["workers"]:
        assert w["loads_ok"] == 8 and w["slot_restores"] == 8 and w["loads_failed"] == 0
        assert w["saves_failed"] == 0 and w["slot_publishes"] == e["slot_commits"]
    for f in r["figures"]:
        assert f["restores"] == 8 and f["restore_bytes"] > 0 and f["saves"] > 0
    assert 40 < r["wire"]["plan_bytes_mean"] < r["wire"]["plan_bytes_max"]
    assert r["wire"]["plan_bytes_idle"] == 40  # header and step section
    # The scheduler's view leased every hit in the shared tier and released each lease when the
    # load (in another process) was terminal.
    view = r["view_tiers"]["rank0/shm"]
    assert view["leases"] == 8 and view["lease_releases"] == 8 and view["lease_expiries"] == 0
    if disk and "rank0/disk" in r["tiers"]:  # left out where the kernel refuses io_uring
        for rank in range(ranks):
            assert r["tiers"][f"rank{rank}/disk"]["put"]["ok"] > 0  # written through


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_rank_killed_during_a_save_never_commits_it_and_restarts(ranks, capsys):
    # Boundaries every 512 tokens: each request saves the SLOT at 512 and 1024 (and at 1536 and
    # 2048 in later turns). The last rank kills itself while the saves at 1024 of the first
    # three requests run (its second step with a SLOT save).
    dead = ranks - 1
    r = tp_processes.main(["--ranks", str(ranks), "--interval", "512",
                           "--kill-rank", str(dead), "--kill-at-save", "2"] + SMALL)
    out = last_line(capsys)
    assert out == f"ranks {ranks}, requests 12, restores {r['restores']}, wrong 0"
    assert r["rank_deaths"] == 1 and r["restarted_ranks"] == [dead]
    assert r["agree"], r["disagreements"]
    # The requests in flight were requeued; none was offered the boundary whose save the dead
    # rank never finished, and each resumed from the boundary committed before it (512).
    lost = [x for x in r["resumed_after_death"] if x["lost"] is not None]
    assert len(lost) == 3
    for x in lost:
        assert x["lost"] == 1024 and x["lookup"] == 512
    assert r["offered_unsaved"] == 0 and r["wrong_restores"] == 0
    # The restarted rank restored what its predecessor had saved, bit exact like the others.
    restarted = next(f for f in r["figures"] if f["rank"] == dead)
    assert restarted["restores"] > 0


def test_a_new_scheduler_process_rediscovers_the_commits_of_a_killed_one(capsys):
    # Killed at step 12 (the first turns' prompt-end anchors are committed by then); the new
    # scheduler process serves the whole workload again.
    r = tp_processes.main(["--ranks", "2", "--kill-scheduler-at-step", "12"] + SMALL)
    assert last_line(capsys) == f"ranks 2, requests 12, restores {r['restores']}, wrong 0"
    assert r["killed_scheduler_exit"] == -9
    assert r["orphans"] == []
    assert r["agree"], r["disagreements"]
    e = r["engine"]
    assert e["commits_rediscovered"] > 0
    # Every request resumes: the first turns from what the killed scheduler committed.
    assert r["restores"] > 8
