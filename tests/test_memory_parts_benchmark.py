"""benchmarks/memory_parts.py: the per-part accounting of one tiny run of
the job's uniform-sparse model (the exact bytes against the layer shapes,
and the phases' measurements present and consistent), not the sizes of a
real scale."""

import json

from repo_module import load_repo_module

memory_parts = load_repo_module("benchmarks/memory_parts.py", "memory_parts")


def test_tiny_run_accounts_for_the_head_and_its_optimizer_state(tmp_path):
    out = tmp_path / "parts.json"
    assert memory_parts.main([
        "--scales", "tiny", "--heads", "uniform_sparse", "--encoder", "16",
        "--intermediate", "64", "--steps", "tiny=2",
        "--data-dir", str(tmp_path / "data"),
        "--workdir", str(tmp_path / "runs"), "--out", str(out)]) == 0
    row = json.loads(out.read_text())["runs"][0]
    spec = memory_parts.scale.SCALES["tiny"]
    m, s = spec["num_labels"], spec["fan_in"]
    model, state = row["model_variable_bytes"], row["optimizer_state_bytes"]
    assert model["head kernel"] == m * s * 4       # float32 [m, s]
    assert model["head indices"] == m * s * 4      # int32 [m, s]
    assert model["head bias"] == m * 4
    assert model["intermediate"] == (16 * 64 + 64) * 4
    assert state["head kernel"] == 2 * m * s * 4   # Adam's two moments
    assert "head indices" not in state             # not trainable
    rss, peak = row["rss_bytes"], row["phase_peak_bytes"]
    assert list(rss) == list(memory_parts.PHASES)
    for phase in memory_parts.PHASES[1:]:
        assert peak[phase] >= rss[phase] > 0
    table = dict((p, (e, v)) for p, e, v in memory_parts.parts_table(row))
    assert table["whole process peak (fit)"][1] == peak["fit"]
    assert table["model: all variables / phase growth"][0] == sum(
        model.values())
