"""pytest configuration of the GPU tests (no TensorFlow needed)."""


def pytest_configure(config):
    # Registered here too so that `pytest tests/gpu` works from any rootdir
    # and under --strict-markers without the project's pyproject.toml.
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU (skipped without one)")
