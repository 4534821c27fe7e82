"""Property-based fuzz of the dense-embedding readers (.npy / .npz).

Random 2-D arrays are saved with NumPy and read back exactly; random byte
edits and truncations of those files either read to a finite float32 2-D
array (an edit inside the data that keeps it valid) or raise ``ValueError``
whose message starts with ``"<file>:"``, never another exception, and a
header edited to declare a huge shape is rejected before any allocation
proportional to it.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xmc_tf import data

SETTINGS = settings(
    max_examples=int(os.environ.get("XMC_TF_FUZZ_EXAMPLES", "100")),
    derandomize=not os.environ.get("XMC_TF_FUZZ_RANDOM"),
    database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])

_TMP = tempfile.mkdtemp(prefix="xmc_tf_fuzz_emb_")
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


@st.composite
def arrays(draw):
    n, d = draw(st.integers(0, 20)), draw(st.integers(0, 9))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.float16,
                                  np.int32, np.int8, np.bool_]))
    seed = draw(st.integers(0, 2**32 - 1))
    arr = np.random.default_rng(seed).normal(0, 50, (n, d))
    return arr.astype(dtype)


def _save(arr, fmt):
    buf = io.BytesIO()
    if fmt == "npy":
        np.save(buf, arr)
    elif fmt == "npz":
        np.savez(buf, embeddings=arr)
    else:
        np.savez_compressed(buf, arr)
    return buf.getvalue()


def _write(payload, fmt):
    path = os.path.join(_TMP, "e.npy" if fmt == "npy" else "e.npz")
    with open(path, "wb") as f:
        f.write(payload)
    return path


@SETTINGS
@given(arr=arrays(), fmt=st.sampled_from(["npy", "npz", "npz_compressed"]))
def test_round_trip(arr, fmt):
    path = _write(_save(arr, fmt), fmt)
    got = data.load_embedding_array(path)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, arr.astype(np.float32))


@SETTINGS
@given(arr=arrays(), fmt=st.sampled_from(["npy", "npz", "npz_compressed"]),
       edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                      min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_corruptions_raise_value_error_naming_the_file(arr, fmt, edits, cut):
    raw = bytearray(_save(arr, fmt))
    for pos, value in edits:
        raw[pos % len(raw)] = value
    if cut is not None:
        del raw[cut % len(raw):]
    path = _write(bytes(raw), fmt)
    try:
        got = data.load_embedding_array(path)
    except ValueError as e:
        assert str(e).startswith(f"{path}:"), str(e)
        return
    assert got.ndim == 2 and got.dtype == np.float32
    assert np.isfinite(got).all()


@SETTINGS
@given(arr=arrays(), fmt=st.sampled_from(["npy", "npz"]),
       shape=st.sampled_from(["(10000000000, 8000)",
                              "(4611686018427387904, 2)",
                              "(99999999999999999999, 1)"]))
def test_forged_header_shape(arr, fmt, shape):
    """A header declaring far more data than the file holds is rejected
    (before numpy would allocate it)."""
    raw = _save(arr, fmt)
    old = b"'shape': " + repr(arr.shape).encode()
    assert old in raw
    forged = raw.replace(old, b"'shape': " + shape.encode(), 1)
    path = _write(forged, fmt)
    try:
        data.load_embedding_array(path)
    except ValueError as e:
        assert str(e).startswith(f"{path}:"), str(e)
    else:
        raise AssertionError("forged shape accepted")
