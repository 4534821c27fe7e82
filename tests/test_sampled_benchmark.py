"""benchmarks/sampled.py: the command lines it builds and its equal-time
summary (no training, no timing, no matplotlib)."""

import argparse

from repo_module import load_repo_module


sb = load_repo_module("benchmarks/sampled.py", "sampled_bench")
SPEC = {"train": "tr.txt", "test": "te.txt", "num_labels": 1000,
        "num_train": 10, "dim_batch": (128, 256), "overrides": [],
        "sampled_loss": "softmax", "astra": []}
ARGS = argparse.Namespace(candidates=256, num_sampled=64, curve_test=100,
                          eval_every_seconds=5.0,
                          budget_seconds=30.0, eval_every_steps=10,
                          network="bench")


def _overrides(method, **kw):
    args = argparse.Namespace(**{**vars(ARGS), **kw})
    cmd = sb.method_command(method, SPEC, "/tmp/w", args)
    return dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)


def test_equal_candidates_are_passed_explicitly():
    assert _overrides("tf_sampled_softmax")["config.sampler.num_negatives"] \
        == "256"
    assert _overrides("uniform")["config.sampler.num_negatives"] == "256"
    assert _overrides("uniform")["config.sampler.kind"] == "uniform"
    inb = _overrides("in_batch")
    assert (inb["config.sampler.kind"], inb["config.sampler.num_negatives"]) \
        == ("in_batch", "256")  # the batch size
    for method in ("astra", "lsh"):
        o = _overrides(method)
        assert (o["config.sampler.num_hard"],
                o["config.sampler.num_uniform"]) == ("1", "128")
    assert _overrides("lsh")["config.sampler.L"] == "50"
    assert _overrides("scent")["config.scent.correction"] == "log_q"
    # --candidates 0: each config's own sizes (tf: --num-sampled).
    assert "config.sampler.num_hard" not in _overrides("astra", candidates=0)
    assert _overrides("tf_sampled_softmax", candidates=0)[
        "config.sampler.num_negatives"] == "64"


def test_config_network_keeps_each_configs_sampler_settings():
    """--network=config --candidates=0: what `xmc-tf train --config=lsh`
    runs, no sampler setting of the benchmark's own."""
    o = _overrides("lsh", network="config", candidates=0)
    assert not {"config.sampler.L", "config.sampler.K",
                "config.sampler.rehash_every_steps",
                "config.sampler.num_hard"} & set(o)
    assert _overrides("lsh", network="config")["config.sampler.num_hard"] \
        == "1"  # --candidates still sets the sizes when asked


def test_every_run_records_a_curve():
    for method in ("tf_sampled_softmax", "astra", "scent", "full_softmax"):
        o = _overrides(method)
        assert o["curve-out"] == "/tmp/w.curve.json"
        assert (o["budget-seconds"], o["eval-every-steps"]) == ("30.0", "10")


def test_equal_time_takes_the_last_point_by_the_shortest_curve():
    def curve(*pts):
        return [{"train_seconds": t, "P@1": p, "P@5": p / 2} for t, p in pts]
    rows = [{"dataset": "d", "method": "a",
             "curve": curve((10, 1.0), (20, 2.0), (30, 3.0))},
            {"dataset": "d", "method": "b", "curve": curve((12, 5.0),
                                                           (25, 6.0))},
            {"dataset": "d", "method": "omikuji", "peer": True, "P@1": 9.0},
            {"dataset": "e", "method": "a", "curve": curve((5, 7.0))}]
    eq = sb.equal_time(rows)
    assert eq["d"]["seconds"] == 25
    assert eq["d"]["methods"]["a"] == {"P@1": 2.0, "P@5": 1.0,
                                       "final_seconds": 30}
    assert eq["d"]["methods"]["b"]["P@1"] == 6.0
    assert "omikuji" not in eq["d"]["methods"]
    assert eq["e"]["methods"]["a"]["P@1"] == 7.0
    assert sb.at_time(rows[0]["curve"], 9.0) is None
