"""What a practitioner would use instead of xmc_tf, run on the same files.

Shared by the benchmarks: napkinXC's PLT, Omikuji (Parabel-like trees),
fastText (``train_supervised``: softmax for multi-class data, one-vs-all
for multi-label), each on an :class:`xmc_tf.data.XCDataset` loaded from the
same XC-repo files as the xmc_tf rows, with ``threads`` CPU threads.
Every runner returns ``{"method", "P@1", "P@3", "P@5", "train_s",
"decode_qps"}`` (P@k in percent, train time in wall seconds), plus
``"topk_ids"`` (int64 ``[n_test, 5]``, -1 padded) with ``return_ids=True``.
Benchmark-only dependencies: ``pip install xmc_tf[bench]``.

Also here: the small timing / P@k / config helpers every benchmark uses.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile
import threading
import time

import numpy as np
import scipy.sparse as sp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["timer", "elapsed", "proc_status_bytes", "format_table", "csr_rows",
           "precision", "load_config",
           "run_napkinxc", "run_omikuji", "run_fasttext", "PEERS"]


def timer():
    """``(wall, cpu)`` start marks (seconds)."""
    return time.perf_counter(), time.process_time()


def elapsed(start):
    """``(wall, cpu)`` seconds since :func:`timer`'s ``start``."""
    return time.perf_counter() - start[0], time.process_time() - start[1]


def proc_status_bytes(pid: int, key: str = "VmHWM"):
    """A memory entry of ``/proc/PID/status`` in bytes (``"VmHWM"``: peak
    RSS, ``"VmRSS"``: current RSS), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run_watched(cmd, log_path: str, root: str, limit_bytes: int,
                poll_s: float = 0.25):
    """Runs ``cmd`` (a child benchmark process, cwd and first
    ``PYTHONPATH`` entry ``root``, output to ``log_path``) and kills it once
    its resident set passes ``limit_bytes`` (polled every ``poll_s``
    seconds), before the machine would.

    Returns:
      ``(returncode, killed_at_rss_bytes or None)``.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    killed = []

    def watch(proc):
        while proc.poll() is None:
            rss = proc_status_bytes(proc.pid, "VmRSS")
            if rss is not None and rss > limit_bytes:
                killed.append(rss)
                proc.kill()
                return
            time.sleep(poll_s)

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=root)
        watcher = threading.Thread(target=watch, args=(proc,), daemon=True)
        watcher.start()
        rc = proc.wait()
        watcher.join()
    return rc, (killed[0] if killed else None)


def format_table(rows, cols) -> str:
    """A plain-text table: one column per key of ``cols``, one line per dict
    of ``rows`` (missing -> ``-``, floats with 2 decimals, or 3 significant
    digits from 1e5 up)."""
    widths = [max(len(c), *(len(_fmt_cell(r.get(c))) for r in rows))
              for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    for r in rows:
        lines.append("  ".join(_fmt_cell(r.get(c)).ljust(w)
                               for c, w in zip(cols, widths)))
    return "\n".join(lines)


def _fmt_cell(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 1e5 else f"{v:.3g}"
    return str(v)


def csr_rows(matrix):
    """CSR matrix -> list of its rows' column-index arrays."""
    return [matrix.indices[matrix.indptr[i]:matrix.indptr[i + 1]]
            for i in range(matrix.shape[0])]


def precision(topk_ids, labels, ks=(1, 3, 5)):
    """P@k in percent of ``[n, k]`` ids (-1 = none) via XMCEvaluator."""
    from xmc_tf.metrics import XMCEvaluator
    ev = XMCEvaluator(ks=ks)
    ev.update(np.asarray(topk_ids), labels)
    res = ev.result()
    return {f"P@{k}": float(res[f"P@{k}"]) for k in ks}


def load_config(name):
    """The packaged config ``name`` (:func:`xmc_tf.config.get_config`; the
    same as ``configs/<name>.py``).

    Raises:
      ValueError: an unknown name (the message lists the names).
    """
    from xmc_tf import config as xconfig
    return xconfig.get_config(name)


def _plain_copy(path, tmpdir):
    out = os.path.join(tmpdir, os.path.basename(path).replace(".gz", ""))
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def run_napkinxc(train, test, threads=2, return_ids=False, **_):
    """napkinXC 0.7 PLT with its defaults."""
    from napkinxc.models import PLT
    with tempfile.TemporaryDirectory() as tmp:
        model = PLT(os.path.join(tmp, "plt"), threads=threads)
        y = [list(map(int, r)) for r in csr_rows(train.labels)]
        start = timer()
        model.fit(train.features, y)
        wall, _ = elapsed(start)
        start = timer()
        pred = model.predict(test.features, top_k=5)
        pwall, _ = elapsed(start)
    ids = np.full((test.num_instances, 5), -1, np.int64)
    for i, p in enumerate(pred):
        ids[i, :len(p)] = p[:5]
    return {"method": "napkinXC PLT", **precision(ids, test.labels),
            "train_s": wall, "decode_qps": test.num_instances / pwall,
            **({"topk_ids": ids} if return_ids else {})}


def run_omikuji(train, test, threads=2, train_path=None, return_ids=False,
                **_):
    """Omikuji 0.5 (Parabel-like) with its defaults, trained on the file."""
    import omikuji
    with tempfile.TemporaryDirectory() as tmp:
        plain = _plain_copy(train_path, tmp)
        start = timer()
        model = omikuji.Model.train_on_data(plain, n_threads=threads)
        wall, _ = elapsed(start)
    feats = test.features
    ids = np.full((test.num_instances, 5), -1, np.int64)
    start = timer()
    for i in range(test.num_instances):
        lo, hi = feats.indptr[i], feats.indptr[i + 1]
        pairs = list(zip(feats.indices[lo:hi].tolist(),
                         feats.data[lo:hi].tolist()))
        pred = model.predict(pairs, top_k=5)
        ids[i, :len(pred)] = [p[0] for p in pred]
    pwall, _ = elapsed(start)
    return {"method": "Omikuji", **precision(ids, test.labels),
            "train_s": wall, "decode_qps": test.num_instances / pwall,
            **({"topk_ids": ids} if return_ids else {})}


def _fasttext_lines(data, with_labels):
    feats = csr_rows(data.features)
    labels = csr_rows(data.labels)
    for f, y in zip(feats, labels):
        words = " ".join(f"f{j}" for j in f)
        if with_labels:
            yield " ".join(f"__label__{j}" for j in y) + " " + words
        else:
            yield words


def run_fasttext(train, test, threads=2, epoch=None, dim=100, lr=0.5,
                 return_ids=False, **_):
    """fastText ``train_supervised`` on the feature ids as words.

    Multi-class data (one label per instance): ``loss="hs"`` (hierarchical
    softmax, what fastText recommends for many classes: its full softmax
    is O(m) per example), 5 epochs (fastText's default); multi-label data: ``loss="ova"``, 25 epochs
    (fastText's multi-label tutorial; 5 gives Bibtex P@1 18.8, 25 gives
    56.9, 50 gives 55.3).  Learning rate 0.5.  Feature values are ignored (fastText reads tokens),
    which fits binary bag-of-words / n-gram features.
    """
    import fasttext
    multi_label = bool(np.any(np.diff(train.labels.indptr) > 1))
    loss = "ova" if multi_label else "hs"
    if epoch is None:
        epoch = 25 if multi_label else 5
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.txt")
        with open(path, "w") as f:
            for line in _fasttext_lines(train, True):
                f.write(line + "\n")
        start = timer()
        model = fasttext.train_supervised(path, loss=loss, epoch=epoch,
                                          dim=dim, lr=lr, thread=threads,
                                          verbose=0)
        wall, _ = elapsed(start)
    lines = list(_fasttext_lines(test, False))
    start = timer()
    labels, _ = model.predict(lines, k=5)
    pwall, _ = elapsed(start)
    ids = np.full((test.num_instances, 5), -1, np.int64)
    for i, row in enumerate(labels):
        got = [int(t[len("__label__"):]) for t in row]
        ids[i, :len(got)] = got
    return {"method": f"fastText ({loss}, {epoch} ep)",
            **precision(ids, test.labels), "train_s": wall,
            "decode_qps": test.num_instances / pwall,
            **({"topk_ids": ids} if return_ids else {})}


def run_pecos(train, test, threads=2, return_ids=False, **_):
    """PECOS XR-Linear (libpecos 1.2.8) with its defaults
    (benchmarks/pecos_xrlinear.py), run by the interpreter named in
    ``XMC_PECOS_PYTHON`` (its own venv: libpecos pins NumPy < 2).

    Raises:
      RuntimeError: ``XMC_PECOS_PYTHON`` is unset, or the script failed.
    """
    python = os.environ.get("XMC_PECOS_PYTHON")
    if not python:
        raise RuntimeError("set XMC_PECOS_PYTHON to a Python with libpecos "
                           "(see benchmarks/pecos_xrlinear.py)")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "pecos_xrlinear.py")
    with tempfile.TemporaryDirectory() as tmp:
        data, out = os.path.join(tmp, "data.npz"), os.path.join(tmp,
                                                                "out.npz")
        arrays = {}
        for prefix, m in (("x_", train.features), ("y_", train.labels),
                          ("t_", test.features)):
            m = sp.csr_matrix(m)
            arrays.update({prefix + "data": m.data,
                           prefix + "indices": m.indices,
                           prefix + "indptr": m.indptr,
                           prefix + "shape": np.asarray(m.shape)})
        np.savez(data, **arrays)
        proc = subprocess.run([python, script, "--data", data, "--out", out,
                               "--threads", str(threads)],
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError("pecos_xrlinear.py failed: "
                               + proc.stderr[-2000:])
        with np.load(out) as res:
            ids, wall = res["ids"], float(res["train_s"])
            pwall = float(res["predict_s"])
    return {"method": "PECOS XR-Linear", **precision(ids, test.labels),
            "train_s": wall, "decode_qps": test.num_instances / pwall,
            **({"topk_ids": ids} if return_ids else {})}


#: name -> runner(train, test, threads=..., train_path=...).
PEERS = {"napkinxc": run_napkinxc, "omikuji": run_omikuji,
         "fasttext": run_fasttext, "pecos": run_pecos}
