"""benchmarks/roofline.py at tiny sizes: the accounting, not the timings."""

import importlib.util
import json
import shutil

import numpy as np
import pytest

from repo_module import load_repo_module


roofline = load_repo_module("benchmarks/roofline.py", "roofline")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None,
                               reason="the peak loops are compiled with g++")


def test_part_models_against_hand_counts():
    b, e, d, m, s = 2, 8, 4, 10, 3
    models = roofline.part_models(b, e, d, m, s, m_nz=6, rows=5)
    assert set(models) == set(roofline.PARTS)
    # forward: one FMA (2 flops) per (row, label, connection); indices +
    # weights (4 + 4 bytes each), the scores and the input read/written once.
    assert models["forward"] == dict(flops=2 * 2 * 10 * 3,
                                     bytes=10 * 3 * 8 + 2 * 10 * 4 + 2 * 8 * 4,
                                     row_gathers=30)
    # Only the 6 labels with a non-zero backward column read connections.
    assert models["grad_features"] == dict(
        flops=2 * 2 * 6 * 3, bytes=2 * 10 * 4 + 6 * 3 * 8 + 2 * 8 * 4,
        row_gathers=18)
    # ...but the weight gradient is written for all m s connections.
    assert models["grad_weights"]["bytes"] == (2 * 10 * 4 + 6 * 3 * 4
                                               + 10 * 3 * 4 + 2 * 8 * 4)
    # Adam: gradient read, weights and two moments read + written, 4 bytes
    # each, over the kernel [m, s] and the bias [m].
    assert models["adam"]["bytes"] == 28 * (30 + 10)
    assert models["loss_grad"]["bytes"] == 12 * b * m
    assert models["intermediate"]["flops"] == 3 * 2 * b * d * e
    assert models["intermediate_adam"]["bytes"] == 28 * (d * e + e)
    assert models["set_rewire"]["bytes"] == 4 * 8 * m * s
    assert models["eval_topk"]["bytes"] == 4 * 5 * m
    # Defaults: every label has signal; the evaluation block is 256 MiB.
    full = roofline.part_models(b, e, d, m, s)
    assert full["grad_features"]["row_gathers"] == m * s
    assert roofline.score_rows(670_091) == 100
    assert roofline.score_rows(10) == 1024


def test_limit_is_the_binding_resource():
    peaks = {"fma_gflops": 100.0, "bandwidth_gbs": 10.0,
             "row_gather_rows_per_s": 1e8}
    sec, bound = roofline.limit_seconds(
        dict(flops=1e9, bytes=1e9, row_gathers=1e6), peaks)
    assert bound == "bytes" and sec == pytest.approx(0.1)
    sec, bound = roofline.limit_seconds(
        dict(flops=1e11, bytes=1e9, row_gathers=1e6), peaks)
    assert bound == "flops" and sec == pytest.approx(1.0)
    sec, bound = roofline.limit_seconds(
        dict(flops=0, bytes=0, row_gathers=1e9), peaks)
    assert bound == "gathers" and sec == pytest.approx(10.0)


def test_account_and_step_summary():
    peaks = {"fma_gflops": 1.0, "bandwidth_gbs": 1.0,
             "row_gather_rows_per_s": 1e9}
    models = roofline.part_models(2, 8, 4, 10, 3)
    measured = {p: {"median_s": 0.5 + i, "min_s": 0.4 + i}
                for i, p in enumerate(roofline.PARTS)}
    rows = roofline.account(measured, models, peaks)
    for p, r in rows.items():
        assert r["fraction"] == pytest.approx(r["median_s"] / r["limit_s"])
        assert r["limit_s"] == roofline.limit_seconds(models[p], peaks)[0]
    st = roofline.step_summary(rows, whole_head_s=3.0, target=100.0)
    head_sum = sum(measured[p]["median_s"] for p in roofline.HEAD_PARTS)
    assert st["head_parts_sum_s"] == pytest.approx(head_sum)
    assert st["step_s"] == pytest.approx(
        3.0 + measured["intermediate"]["median_s"]
        + measured["intermediate_adam"]["median_s"]
        + measured["set_rewire"]["median_s"] / roofline.SET_EVERY)
    assert st["met"] is True
    assert roofline.step_summary(rows, target=1.0)["met"] is False


@needs_gxx
def test_peaks_run(tmp_path):
    peaks = roofline.machine_peaks(
        table_rows=64, row_width=32, copy_mib=1, gather_table_mib=1,
        gathers=10_000, fma_iters=1000, repeats=1, threads=[1, 2],
        lib=roofline.peak_library(str(tmp_path)))
    assert set(peaks["per_thread_count"]) == {"1", "2"}
    one, two = (peaks["per_thread_count"][t] for t in ("1", "2"))
    for key, best in peaks["all"].items():
        assert best == max(one[key], two[key])
    for v in (one, two):
        assert all(x > 0 and np.isfinite(x) for x in v.values())
        assert v["bandwidth_gbs"] == max(v["copy_gbs"], v["read_gbs"],
                                         v["add_gbs"])
    with pytest.raises(ValueError, match="multiple of 16"):
        roofline.machine_peaks(table_rows=8, row_width=20, copy_mib=1,
                               gather_table_mib=1, gathers=10, fma_iters=1,
                               repeats=1, threads=[1],
                               lib=roofline.peak_library(str(tmp_path)))


@needs_gxx
@pytest.mark.needs_ops("xmc_uniform_sparse_matmul", "xmc_squared_hinge_loss",
                       "xmc_resource_apply_adam")
def test_main_writes_every_part(tmp_path, monkeypatch):
    monkeypatch.setitem(roofline.SCALES, "small",
                        dict(b=16, e=64, d=16, m=300, s=4, n=3))
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    # matplotlib comes with the [bench] extra, not with [cpu,test] (CI)
    plot = importlib.util.find_spec("matplotlib") is not None
    roofline.main(["--small", "--repeats", "1", "--warmup", "1",
                   "--set-repeats", "1", "--out", str(out)]
                  + ["--plot", str(png) if plot else ""])  # "": no chart
    result = json.loads(out.read_text())
    assert png.exists() == plot and (not plot or png.stat().st_size > 0)
    r = result["scales"]["small"]
    assert set(r["parts"]) == set(roofline.PARTS)
    models = roofline.part_models(16, 64, 16, 300, 4, m_nz=r["m_nz"],
                                  rows=r["eval_rows"])
    for p, row in r["parts"].items():
        assert row["fraction"] == pytest.approx(row["median_s"]
                                                / row["limit_s"])
        assert row["bytes"] == models[p]["bytes"]
        assert row["limit_s"] == pytest.approx(roofline.limit_seconds(
            models[p], result["peaks"]["all"])[0])
    assert 0 < r["nonzero_fraction"] <= 1 and 0 < r["m_nz"] <= 300
    assert r["head_step"]["median_s"] > 0
    assert r["step"]["step_s"] >= r["step"]["head_step_s"]


def test_scale_skipped_when_memory_is_short(tmp_path, monkeypatch):
    monkeypatch.setattr(roofline, "_mem_available", lambda: 2 ** 20)
    monkeypatch.setattr(roofline, "machine_peaks",
                        lambda **kw: {"per_thread_count": {}, "all": {
                            "fma_gflops": 1.0, "bandwidth_gbs": 1.0,
                            "row_gather_rows_per_s": 1.0}})
    monkeypatch.setattr(roofline, "library_rates", lambda tf, **kw: {
        "tf_matmul_gflops": 1.0, "numpy_copy_gbs": 1.0,
        "tf_elementwise_gbs": 1.0})
    out = tmp_path / "r.json"
    roofline.main(["--small", "--out", str(out), "--plot", str(tmp_path / "p.png")])
    result = json.loads(out.read_text())
    assert result["scales"]["small"]["skipped"].startswith("skipped: needs")
    assert not (tmp_path / "p.png").exists()
