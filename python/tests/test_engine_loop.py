"""python/examples/engine_loop.py: the per-step loop resumes turn 2 bit exact from turn 1."""

import importlib.util
import pathlib

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "engine_loop.py"


def load_example():
    spec = importlib.util.spec_from_file_location("engine_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_turn_two_resumes_turn_ones_prompt_end_anchor_bit_exact():
    r = load_example().main()
    assert r["turn1_resumed"] == 0
    # Turn 1's prompt (1100 tokens) ends after the anchor floor(1099 / 256) * 256 = 1024.
    assert r["turn2_resumed"] == 1024
    assert r["bit_exact"]
