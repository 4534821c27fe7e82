"""benchmarks/step_parts.py: the work model against hand counts, and one
tiny measurement of the default model's parts on the bundled Bibtex (the
accounting, not the timings)."""

import argparse

import pytest

from repo_module import load_repo_module

step_parts = load_repo_module("benchmarks/step_parts.py", "step_parts")


def test_work_models_against_hand_counts():
    b, z, u, D, d, e, m, s, w, m_nz = 4, 10, 7, 50, 6, 8, 20, 3, 5, 12
    models = step_parts.work_models(b, z, u, D, d, e, m, s, w, m_nz,
                                    set_every=100)
    # encoder: each stored entry adds a d-row forward and backward (2 FMAs)
    assert models["encoder"]["flops"] == 4 * 10 * 6
    assert models["encoder"]["row_gathers"] == 20
    assert models["intermediate"]["flops"] == 6 * 4 * 6 * 8
    # head: forward over all m s connections, both gradients over the
    # m_nz labels with a signal
    assert models["head"]["flops"] == 2 * 4 * 20 * 3 + 4 * 4 * 12 * 3
    assert models["head"]["row_gathers"] == 20 * 3 + 2 * 12 * 3
    # wide: an entry meets w m / D connections on average, forward + grad
    assert models["wide"]["flops"] == pytest.approx(4 * 10 * 5 * 20 / 50)
    assert models["wide"]["row_gathers"] == pytest.approx(2 * 10 * 5 * 20 / 50)
    # ... or the batch's counted (entry, connection) pairs
    counted = step_parts.work_models(b, z, u, D, d, e, m, s, w, m_nz, 100,
                                     wide_products=321)["wide"]
    assert counted["flops"] == 4 * 321 and counted["row_gathers"] == 2 * 321
    # Adam: 28 bytes per updated weight over every group's variables
    updated = 7 * 6 + 6 + 6 * 8 + 8 + 20 * 3 + 20 + 20 * 5 + 20
    assert models["optimizer"]["bytes"] == 28 * updated
    assert models["set"]["bytes"] == 32 * 20 * 3 / 100
    assert "wide" not in step_parts.work_models(b, z, u, D, d, e, m, s, 0,
                                                m_nz, 100)


def test_measure_times_every_part_of_a_small_default_model():
    """The job's default model (a small one) on bundled Bibtex: every part
    timed, a limit and a fraction for each modelled part, the shapes those
    came from."""
    import json
    import os
    with open(os.path.join(os.path.dirname(step_parts.__file__), "results",
                           "roofline.json")) as f:
        peaks = json.load(f)["peaks"]["all"]
    args = argparse.Namespace(
        batches=2, repeats=1, set_repeats=1, warm_steps=2,
        set=["model.intermediate_dim=32", "model.connections_per_label=8",
             "model.wide_connections=8", "train.batch_size=16"])
    result = step_parts.measure("bibtex", "bibtex:train", "bibtex:test",
                                args, peaks)
    shapes, parts = result["shapes"], result["parts"]
    assert (shapes["b"], shapes["e"], shapes["s"], shapes["w"]) == (16, 32,
                                                                    8, 8)
    assert shapes["m"] == 159 and 0 < shapes["m_nz"] <= 159
    assert shapes["z"] > 0 and 0 < shapes["u"] <= shapes["z"]
    # the batch's (entry, wide connection) pairs: some, at most z m
    assert 0 < shapes["wide_products"] <= shapes["z"] * shapes["m"]
    for part in step_parts.STEP_PARTS + ("input", "set"):
        row = parts[part]
        assert row["median_s"] > 0 and row["limit_s"] > 0, part
        assert row["fraction"] == pytest.approx(row["median_s"]
                                                / row["limit_s"])
    for part in ("train_step", "keras_fit"):
        assert parts[part]["median_s"] > 0
    assert result["summary"]["step_limit_s"] == pytest.approx(sum(
        parts[p]["limit_s"] for p in step_parts.STEP_PARTS + ("set",
                                                               "input")))
    assert "| intermediate |" in step_parts.table("bibtex", result)
