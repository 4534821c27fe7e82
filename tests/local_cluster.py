"""Helpers of the tests that start several workers on localhost."""

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on localhost right now (bound to port 0
    together, so the kernel picks distinct ones, then released)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def worker_env(root: str) -> dict:
    """The environment of a worker subprocess: the repository ``root`` on
    ``PYTHONPATH``, TensorFlow's C++ logs at warnings, no GPU (one CPU
    replica per worker)."""
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def script_result(stdout: str, log: str) -> dict:
    """The JSON of a script's last ``RESULT {...}`` line (``log`` is the
    assertion message when there is none)."""
    import json
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, log
    return json.loads(lines[-1][len("RESULT "):])


def run_two_workers(script: str, out_dir, root: str, timeout: float) -> list:
    """Runs ``python -c script OUT_DIR INDEX`` as the two workers of a
    ``TF_CONFIG`` cluster on localhost; returns their results
    (:func:`script_result`) after both exit 0, killing any left running."""
    import json
    import subprocess
    import sys
    ports = free_ports(2)
    procs = []
    for index in range(2):
        env = worker_env(root)
        env["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": [f"localhost:{p}" for p in ports]},
            "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen(
            [sys.executable, "-c", script, str(out_dir), str(index)], env=env,
            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for p, (stdout, stderr) in zip(procs, outputs):
        log = stdout[-3000:] + stderr[-6000:]
        assert p.returncode == 0, log
        results.append(script_result(stdout, log))
    return results


def run_script(script: str, root: str, timeout: float) -> dict:
    """Runs ``python -c script`` in a fresh interpreter from ``root`` (its
    environment :func:`worker_env`); returns its :func:`script_result`
    after it exits 0."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", script], env=worker_env(root),
                          cwd=root, capture_output=True, text=True,
                          timeout=timeout)
    log = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, log
    return script_result(proc.stdout, log)
