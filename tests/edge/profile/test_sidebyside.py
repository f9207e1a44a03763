"""Side-by-side latency: interleaving, rotation, the A/A control and the verdicts (no timing is asserted)."""

import numpy as np
import pytest

from edge.errors import InternalError
from edge.profile.sidebyside import (
    AA_SUFFIX,
    SideBySideConfig,
    _counts,
    aa_deviation,
    finish,
    interleave,
    pooled,
    side_by_side,
    speedup_interval,
    summarize,
    verdict,
)


class FakeBackend:
    """A fake backend that logs its creation and its calls into a shared journal (it computes nothing)."""

    def __init__(self, name, journal):
        self.name, self.journal = name, journal
        journal.append(("create", name))

    def describe(self):
        return {"backend": "fake", "device": "none", "precision": "none", "batch": 1, "threads": 1}

    def weight_bytes(self):
        return 7

    def infer(self):
        self.journal.append(("infer", self.name))

    def close(self):
        self.journal.append(("close", self.name))


def _factories(names, journal):
    return {name: (lambda name=name: FakeBackend(name, journal)) for name in names}


def test_interleave_rotates_creation_and_turn_order():
    journal = []
    config = SideBySideConfig(warmup=2, rounds=6, sessions=3, iterations=4)
    timed = interleave(_factories(["a", "b", "c"], journal), config)
    assert timed["creation_orders"] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert [name for event, name in journal if event == "create"] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    calls = [name for event, name in journal if event == "infer"]
    assert all(calls.count(n) == 3 * 2 + 6 * 4 for n in "abc")  # warm-up per set + rounds x iterations
    assert all(len(timed["latencies"][n]) == 24 and len(timed["round_medians"][n]) == 6 for n in "abc")
    assert timed["round_sets"] == [0, 0, 1, 1, 2, 2]
    # the timed turns of the first set (after its 3 x 2 warm-up calls) follow the recorded orders
    turns = calls[6:6 + 24][::4]
    assert turns == timed["turn_orders"][0] + timed["turn_orders"][1]
    assert all(sorted(order) == ["a", "b", "c"] for order in timed["turn_orders"])
    assert journal.count(("close", "a")) == 3


def test_turn_orders_are_seeded_and_do_not_keep_neighbours():
    config = SideBySideConfig(warmup=0, rounds=40, sessions=1, iterations=1)
    first = interleave(_factories(["a", "b", "c", "d"], []), config)["turn_orders"]
    assert first == interleave(_factories(["a", "b", "c", "d"], []), config)["turn_orders"]
    # a rotation would always put the same backend before "a"; random orders vary its predecessor
    before_a = {order[order.index("a") - 1] for order in first if order.index("a") > 0}
    assert before_a == {"b", "c", "d"}


def test_iterations_default_to_the_turn_time():
    journal = []
    timed = interleave(_factories(["a"], journal), SideBySideConfig(warmup=1, rounds=2, sessions=1, turn_ms=1e9))
    assert timed["iterations"] == {"a": 200}  # capped: a call of the fake takes microseconds


def test_each_backend_times_about_turn_ms_and_an_aa_twin_as_often_as_its_backend():
    """A graph ten times slower makes fewer calls per round (at least 3), not ten times the time."""
    config = SideBySideConfig(turn_ms=100.0)
    warm = {"ref": [10.0, 10.0], "ref (A/A)": [10.0, 12.0], "fast": [2.0] * 3, "slow": [80.0] * 3}
    counts = _counts(config, warm, {"ref (A/A)": "ref"})
    assert counts == {"ref": 10, "ref (A/A)": 10, "fast": 50, "slow": 3}
    assert _counts(SideBySideConfig(iterations=7), warm, {}) == dict.fromkeys(warm, 7)   # given: the same for all


def test_counts_given_are_each_backends_calls_per_round():
    journal = []
    config = SideBySideConfig(warmup=1, rounds=2, sessions=1)
    timed = interleave(_factories(["a", "b"], journal), config, counts={"a": 2, "b": 5})
    calls = [name for event, name in journal if event == "infer"]
    assert calls.count("a") == 1 + 2 * 2 and calls.count("b") == 1 + 2 * 5
    assert timed["iterations"] == {"a": 2, "b": 5} and len(timed["latencies"]["b"]) == 10


def test_speedup_interval_on_known_rounds():
    reference = [10.0] * 8
    half = [5.0] * 8
    exact = speedup_interval(reference, half, [0, 0, 0, 0, 1, 1, 1, 1])
    assert (exact["speedup"], exact["low"], exact["high"]) == (2.0, 2.0, 2.0)
    rng = np.random.default_rng(0)
    noisy = list(5.0 * (1 + 0.05 * rng.standard_normal(20)))
    a = speedup_interval([10.0] * 20, noisy, [i // 4 for i in range(20)], seed=3)
    b = speedup_interval([10.0] * 20, noisy, [i // 4 for i in range(20)], seed=3)
    assert a == b  # seeded
    assert a["low"] < a["speedup"] < a["high"] and a["speedup"] == pytest.approx(np.median(10.0 / np.array(noisy)))
    assert 1.8 < a["low"] and a["high"] < 2.2


@pytest.mark.parametrize("low, high, resolution, noisy, expected", [
    (1.02, 1.10, 0.01, False, "faster"),
    (1.005, 1.10, 0.01, False, "no clear difference"),  # within the A/A control's deviation
    (0.80, 0.95, 0.01, False, "slower"),
    (0.80, 1.001, 0.0, False, "no clear difference"),   # a variant is slower only when its whole interval is below 1
    (0.90, 0.96, 0.05, True, "too noisy to tell"),
    (0.80, 0.90, 0.05, True, "slower"),                 # slower even by more than the noise
])
def test_verdict(low, high, resolution, noisy, expected):
    assert verdict({"speedup": (low + high) / 2, "low": low, "high": high}, resolution, noisy) == expected


def _timed(aa_factor: float) -> dict:
    """Synthetic per-round medians: v is 20 % faster than ref, w 1 % faster, the A/A copy off by aa_factor."""
    rng = np.random.default_rng(1)
    base = 10.0 * (1 + 0.002 * rng.standard_normal(10))
    rounds = {"ref": list(base), "ref" + AA_SUFFIX: list(base * aa_factor), "v": list(base / 1.25),
              "w": list(base / 1.01)}
    backend = {"batch": 1}
    return {"latencies": {n: r * 3 for n, r in rounds.items()}, "round_medians": rounds,
            "round_sets": [i // 2 for i in range(10)], "describe": dict.fromkeys(rounds, backend),
            "weight_bytes": dict.fromkeys(rounds, 0), "iterations": 3, "creation_orders": []}


def test_a_quiet_run_ranks_and_a_noisy_one_says_so():
    config = SideBySideConfig()
    quiet = summarize(_timed(1.0), "ref", config)
    assert not quiet["noisy"] and quiet["aa_control"]["deviation"] < 0.005
    assert quiet["variants"]["v"]["speedup"]["verdict"] == "faster"
    assert quiet["variants"]["v"]["speedup"]["speedup"] == pytest.approx(1.25)
    assert quiet["variants"]["w"]["speedup"]["verdict"] == "faster"
    noisy = summarize(_timed(1.05), "ref", config)  # the A/A control is 5 % off
    assert noisy["noisy"] and aa_deviation(noisy["aa_control"]) == pytest.approx(noisy["aa_control"]["deviation"])
    assert noisy["variants"]["v"]["speedup"]["verdict"] == "faster"  # 25 % is beyond the noise
    assert noisy["variants"]["w"]["speedup"]["verdict"] == "too noisy to tell"


def test_side_by_side_adds_the_aa_control():
    journal = []
    result = side_by_side(_factories(["ref", "v"], journal), "ref",
                          SideBySideConfig(warmup=1, rounds=4, sessions=2, iterations=2, resamples=100))
    assert set(result["variants"]) == {"ref", "v", "ref" + AA_SUFFIX}
    assert result["variants"]["ref"]["speedup"]["speedup"] == 1.0
    assert result["settings"]["rounds"] == 4 and result["iterations_per_round"] == {"ref": 2, "v": 2, "ref (A/A)": 2}
    assert set(result["contention"]) >= {"other_cpu_share", "busy"} and "cpu" in result["hardware"]
    assert [n for e, n in journal if e == "create"].count("ref") == 4  # the reference and its A/A copy, twice


def test_a_slice_of_session_sets_is_those_sets_of_the_whole_run_and_the_parts_pool_into_it():
    """Session sets run apart (edge.profile.fresh, one process each) get the creation and turn orders the same sets
    get in one run, and pooled they are that run's timings."""
    config = SideBySideConfig(warmup=1, rounds=6, sessions=3, iterations=2, seed=4)
    names = ["a", "b", "a" + AA_SUFFIX]
    whole = interleave(_factories(names, []), config)
    parts = [{"timed": interleave(_factories(names, []), config, range(s, s + n)),
              "contention": {"other_cpu_share": share, "own_cpu_share": 0.9, "seconds": seconds, "busy": False,
                             "stolen_cpu_share": share / 3},
              "seconds": seconds} for (s, n), share, seconds in (((0, 1), 0.0, 1.0), ((1, 2), 0.09, 3.0))]
    assert parts[1]["timed"]["creation_orders"] == whole["creation_orders"][1:]
    assert parts[1]["timed"]["round_sets"] == [1, 1, 2, 2]
    together = pooled(parts)
    assert together["turn_orders"] == whole["turn_orders"] and together["creation_orders"] == whole["creation_orders"]
    assert together["round_sets"] == whole["round_sets"]
    assert {n: len(v) for n, v in together["round_medians"].items()} == dict.fromkeys(names, 6)
    summary = finish(parts, "a", config)
    assert summary["seconds"] == 4.0 and summary["variants"]["b"]["latency"]["iterations"] == 12
    contention = summary["contention"]
    assert contention["other_cpu_share"] == pytest.approx(0.0675) and contention["busy"]   # (0 + 3 * 0.09) / 4
    assert contention["stolen_cpu_share"] == pytest.approx(0.0225)                        # (0 + 3 * 0.03) / 4
    assert contention["processes"] == 2


def test_side_by_side_refuses_a_reference_it_does_not_time():
    with pytest.raises(InternalError, match="the reference 'z' is not among"):
        side_by_side(_factories(["a"], []), "z", SideBySideConfig(warmup=0, rounds=2, sessions=1, iterations=1))


def _part(medians: dict[str, list[float]], first_set: int) -> dict:
    """A timing process's part: its rounds' medians per backend (two rounds per session set)."""
    rounds = len(next(iter(medians.values())))
    timed = {"latencies": {n: list(v) for n, v in medians.items()}, "round_medians": medians,
             "round_sets": [first_set + r // 2 for r in range(rounds)],
             "describe": {n: {"backend": "fake", "batch": 1} for n in medians},
             "weight_bytes": dict.fromkeys(medians, 7), "iterations": 1, "creation_orders": [], "turn_orders": []}
    return {"timed": timed,
            "contention": {"other_cpu_share": 0.0, "own_cpu_share": 1.0, "seconds": 1.0, "busy": False},
            "seconds": 1.0}


def test_a_ratio_whose_timing_processes_disagree_by_more_than_5_percent_is_flagged_noisy():
    """Each process's own speedup (median of its rounds' paired ratios); their spread, (max - min) / median, above
    5 % flags the ratio; with one process, its session sets play the processes' part."""
    from edge.profile.sidebyside import NOISY_SPREAD, group_speedups

    aa = "ref" + AA_SUFFIX
    parts = [_part({"ref": [10.0, 10.0], "steady": [5.0, 5.0], "moving": [5.0, 5.0], aa: [10.0, 10.0]}, 0),
             _part({"ref": [10.0, 10.0], "steady": [5.05, 5.05], "moving": [5.5, 5.5], aa: [10.0, 10.0]}, 1),
             _part({"ref": [10.0, 10.0], "steady": [5.0, 5.0], "moving": [5.0, 5.0], aa: [10.0, 10.0]}, 2)]
    kind, speedups = group_speedups(parts, "ref")
    assert kind == "processes" and speedups["moving"] == pytest.approx([2.0, 10 / 5.5, 2.0])
    summary = finish(parts, "ref", SideBySideConfig(resamples=200))
    steady, moving = summary["variants"]["steady"]["speedup"], summary["variants"]["moving"]["speedup"]
    assert steady["process_spread"] == pytest.approx((2.0 - 10 / 5.05) / 2.0, abs=1e-4) and not steady["noisy"]
    assert moving["process_spread"] == pytest.approx((2.0 - 10 / 5.5) / 2.0, abs=1e-4)
    assert moving["process_spread"] > NOISY_SPREAD
    assert moving["noisy"] and summary["spread"] == {"groups": "processes", "count": 3, "tolerance": NOISY_SPREAD}
    assert summary["variants"]["ref"]["speedup"]["process_spread"] == 0.0
    one = _part({n: [x for p in parts for x in p["timed"]["round_medians"][n]] for n in ("ref", "moving", aa)}, 0)
    kind, speedups = group_speedups([one], "ref")
    assert kind == "session sets" and speedups["moving"] == pytest.approx([2.0, 10 / 5.5, 2.0])
