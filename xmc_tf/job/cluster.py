"""Data-parallel training with ``tf.distribute``: the strategies of ``xmc-tf
train --strategy`` and the chief-to-worker broadcasts that keep the workers
in step.  (The model classes that Keras 3.15 needs under these strategies
are :mod:`xmc_tf.models.distributed`.)

``--strategy=mirrored`` is ``tf.distribute.MirroredStrategy`` over this
machine's GPUs (or its logical CPUs when it has none); ``multi_worker`` is
``tf.distribute.MultiWorkerMirroredStrategy``, which reads the cluster from
the ``TF_CONFIG`` environment variable, as Keras users expect (TensorFlow
guide "Multi-worker training with Keras",
https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras).
Every replica holds the whole model, computes the gradient of its share of
every global batch, and the gradients are summed across replicas after
every step, so every replica applies the same update.  The strategy must be
created before TensorFlow runs any op (:func:`make_strategy`).

The chief -- the ``"chief"`` task, or worker 0 when ``TF_CONFIG`` names no
chief (TensorFlow's rule, ``tf.distribute.cluster_resolver``) -- is the one
process that writes the work directory; :class:`Cluster` says which process
this is and carries small messages and whole files from the chief to the
others (:meth:`Cluster.broadcast_json`, :meth:`Cluster.broadcast_files`)
over the strategy's own all-reduce: the chief contributes its bytes, the
others zeros, and integer sums are exact.  That is how the other workers
restore the chief's backup (they need not see its disk) and agree on its
epoch logs (:class:`xmc_tf.job.fit.ChiefLogs`).

``TF_CONFIG`` is checked by :func:`xmc_tf_cli.tf_config.parse_tf_config`
(re-exported here), which the ``xmc-tf`` command runs before it spends
~10 s importing TensorFlow; this module imports TensorFlow inside the
functions that need it.
"""

from __future__ import annotations

import json
import os

# The TF_CONFIG check lives in the TensorFlow-free package of the command
# line, which checks it before the ~10 s TensorFlow import.
from xmc_tf_cli.tf_config import (STRATEGIES, TF_CONFIG_EXAMPLE,  # noqa: F401
                                  parse_tf_config)

__all__ = ["STRATEGIES", "TF_CONFIG_EXAMPLE", "parse_tf_config",
           "make_strategy", "Cluster"]

#: int32 words per all-reduce of :meth:`Cluster.broadcast_files` (64 MiB).
CHUNK_WORDS = 1 << 24

def _error(message: str):
    from xmc_tf.errors import DistributeError  # (TensorFlow-free module top)
    return DistributeError(message)


def _differences(chief, mine, prefix="") -> list:
    """``["KEY=MINE (chief: CHIEF)", ...]`` of two JSON values (dicts
    compared key by key)."""
    if isinstance(chief, dict) and isinstance(mine, dict):
        out = []
        for key in sorted(set(chief) | set(mine)):
            out += _differences(chief.get(key), mine.get(key),
                                f"{prefix}{key}.")
        return out
    if chief == mine:
        return []
    return [f"{prefix[:-1] or 'value'}={mine!r} (chief: {chief!r})"]


def make_strategy(name: str):
    """The ``tf.distribute`` strategy that ``xmc-tf train --strategy=NAME``
    trains under.

    Call it first, before TensorFlow runs any op: ``MultiWorkerMirroredStrategy``
    configures TensorFlow's collective ops, which is possible only before the
    runtime starts, and it waits here until every worker of ``TF_CONFIG``
    has started.

    Args:
      name: ``"none"`` (returns None: one process, no strategy),
        ``"mirrored"`` (``tf.distribute.MirroredStrategy`` over the local
        GPUs, or over the logical CPUs when there is no GPU: one replica on
        a plain CPU machine) or ``"multi_worker"``
        (``tf.distribute.MultiWorkerMirroredStrategy``, cluster from
        ``TF_CONFIG``).

    Returns:
      None or the ``tf.distribute.Strategy``.

    Raises:
      DistributeError: an unknown ``name``, a missing or malformed
        ``TF_CONFIG`` (:func:`parse_tf_config`), TensorFlow already
        running, or a worker that cannot start its server (e.g. its port is
        taken).
    """
    if name not in STRATEGIES:
        raise _error(f"--strategy={name!r}; expected one of {STRATEGIES}")
    if name == "none":
        return None
    import tensorflow as tf
    from absl import logging
    if name == "mirrored":
        devices = ([d.name for d in tf.config.list_logical_devices("GPU")] or
                   [d.name for d in tf.config.list_logical_devices("CPU")])
        logging.info("--strategy=mirrored: %d replica(s) on %s", len(devices),
                     ", ".join(devices))
        return tf.distribute.MirroredStrategy(devices)
    try:
        info = parse_tf_config(os.environ.get("TF_CONFIG"))
    except ValueError as e:
        raise _error(f"--strategy=multi_worker: {e}") from None
    logging.info("--strategy=multi_worker: worker %d of %d (%s, %s %d); "
                 "waiting for every worker of TF_CONFIG to start",
                 info["index"], info["num_workers"], info["address"],
                 info["task_type"], info["task_index"])
    try:
        return tf.distribute.MultiWorkerMirroredStrategy()
    except RuntimeError as e:  # collective ops configured too late
        raise _error(
            "--strategy=multi_worker: the strategy must be created before "
            "TensorFlow runs any op (create it first: "
            f"xmc_tf.job.cluster.make_strategy); {' '.join(str(e).split())}"
        ) from e
    except tf.errors.OpError as e:  # e.g. the server's port is taken
        raise _error(
            f"--strategy=multi_worker: worker {info['index']} cannot start "
            f"at {info['address']}: {' '.join(e.message.split())}") from e


class Cluster:
    """This process's place in a data-parallel run, and broadcasts from the
    chief.

    With no strategy, or a single-process one (``MirroredStrategy``), this
    process is the chief of a cluster of one and the broadcasts return
    their input.  Under ``MultiWorkerMirroredStrategy`` every worker must
    call the same broadcasts in the same order (they are collective
    operations: a worker that skips one leaves the others waiting until
    TensorFlow's health check gives up on it).

    Args:
      strategy: a ``tf.distribute.Strategy`` or None.

    Attributes:
      strategy: the strategy (or None).
      kind: ``"none"``, ``"mirrored"``, ``"multi_worker"`` (the
        ``--strategy`` value), or the class name of another strategy.
      index: this process among the workers: 0 for the chief.
      num_workers: processes in the run (1 without ``TF_CONFIG``).
      is_chief: whether this process writes the work directory.
      multi_worker: whether there is more than one process.
    """

    def __init__(self, strategy=None):
        self.strategy = strategy
        self.kind = "none"
        if strategy is not None:
            import tensorflow as tf
            self.kind = (
                "multi_worker" if isinstance(
                    strategy, tf.distribute.MultiWorkerMirroredStrategy) else
                "mirrored" if isinstance(
                    strategy, tf.distribute.MirroredStrategy) else
                type(strategy).__name__)
        self.index, self.num_workers, self.is_chief = 0, 1, True
        resolver = getattr(strategy, "cluster_resolver", None)
        spec = resolver.cluster_spec().as_dict() if resolver else {}
        if spec and resolver.task_type in ("worker", "chief"):
            chiefs = len(spec.get("chief", []))
            self.num_workers = chiefs + len(spec.get("worker", []))
            self.index = (int(resolver.task_id) if resolver.task_type ==
                          "chief" else chiefs + int(resolver.task_id))
            self.is_chief = self.index == 0
        self.multi_worker = self.num_workers > 1

    @property
    def name(self) -> str:
        """``"worker I of N"`` (for messages)."""
        return f"worker {self.index} of {self.num_workers}"

    @property
    def num_replicas(self) -> int:
        """Replicas over all workers (1 without a strategy)."""
        return self.strategy.num_replicas_in_sync if self.strategy else 1

    def _from_chief(self, words):
        """The chief's 1-D integer array ``words`` on every worker (the same
        shape and dtype must be passed everywhere; only the chief's values
        count).  One all-reduce: the first replica of the chief adds its
        values, every other replica zeros."""
        import tensorflow as tf
        first = [self.is_chief]

        def value(_):
            keep, first[0] = first[0], False
            return tf.constant(words if keep else words * 0)

        values = self.strategy.experimental_distribute_values_from_function(
            value)
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, values,
                                    axis=None).numpy()

    def _bytes_from_chief(self, data: bytes | None, size: int) -> bytes:
        import numpy as np
        words = np.zeros((size + 3) // 4, np.int32)
        if self.is_chief:
            words.view(np.uint8)[:size] = np.frombuffer(data, np.uint8)
        return self._from_chief(words).astype(np.int32).tobytes()[:size]

    def _sum_over_workers(self, count: int) -> int:
        """The sum of every worker's ``count`` (one all-reduce; each worker
        adds it once, on its first replica)."""
        import numpy as np
        import tensorflow as tf
        first = [True]

        def value(_):
            keep, first[0] = first[0], False
            return tf.constant(np.int64(count if keep else 0))

        values = self.strategy.experimental_distribute_values_from_function(
            value)
        return int(self.strategy.reduce(tf.distribute.ReduceOp.SUM, values,
                                        axis=None).numpy())

    def check_same(self, what: str, value) -> None:
        """Checks that every worker has the chief's ``value`` (a
        JSON-serialisable description: the config, the data sizes), so that
        workers started with different arguments stop at once instead of
        building models that cannot all-reduce together.

        Every worker calls it with its own ``value``; the chief's is
        broadcast, each worker compares, and the number that differ is
        summed, so that all of them raise or none does.

        Args:
          what: what ``value`` describes, for the message (``"config"``).
          value: this worker's description.

        Raises:
          DistributeError: some worker's ``value`` differs from the chief's
            (the message names the first differing entries on the workers
            that differ; the chief says how many).
        """
        if not self.multi_worker:
            return
        chief = self.broadcast_json(value if self.is_chief else None)
        mine = json.loads(json.dumps(value))
        diff = [] if mine == chief else _differences(chief, mine)
        bad = self._sum_over_workers(1 if diff else 0)
        if not bad:
            return
        if diff:
            raise _error(
                f"{self.name} runs with another {what} than the chief (worker "
                f"0): {', '.join(diff[:3])}{' ...' if len(diff) > 3 else ''}; "
                "every worker must run the same command (only TF_CONFIG's "
                "task index differs)")
        raise _error(f"{bad} of the {self.num_workers - 1} other workers run "
                     f"with another {what} than this chief (their messages "
                     "say what differs); every worker must run the same "
                     "command (only TF_CONFIG's task index differs)")

    def broadcast_json(self, obj=None):
        """The chief's ``obj`` (JSON-serialisable) on every worker.

        Args:
          obj: the value on the chief; ignored elsewhere.

        Returns:
          The chief's ``obj`` (a copy through JSON off the chief).
        """
        if not self.multi_worker:
            return obj
        import numpy as np
        data = json.dumps(obj).encode() if self.is_chief else b""
        size = int(self._from_chief(np.array([len(data)], np.int64))[0])
        return json.loads(self._bytes_from_chief(data, size).decode())

    def broadcast_files(self, directory: str, names=()) -> list:
        """Copies the chief's files ``directory/NAME`` into the same-named
        ``directory`` of every other worker, in blocks of
        ``CHUNK_WORDS`` words (one block in memory at a time).

        Args:
          directory: on the chief, where the files are; on the others,
            where they are written (created; existing files of those names
            are replaced).
          names: on the chief, the file names (relative to ``directory``);
            ignored elsewhere.

        Returns:
          The names copied (the chief's ``names``), on every worker.

        Raises:
          OSError: a file cannot be read (chief) or written (others).
        """
        if not self.multi_worker:
            return list(names)
        sizes = self.broadcast_json(
            [[n, os.path.getsize(os.path.join(directory, n))] for n in names]
            if self.is_chief else None)
        if sizes and not self.is_chief:
            os.makedirs(directory, exist_ok=True)
        for name, size in sizes:
            path = os.path.join(directory, name)
            with open(path, "rb" if self.is_chief else "wb") as f:
                for start in range(0, size, 4 * CHUNK_WORDS):
                    n = min(4 * CHUNK_WORDS, size - start)
                    block = f.read(n) if self.is_chief else None
                    block = self._bytes_from_chief(block, n)
                    if not self.is_chief:
                        f.write(block)
        return [name for name, _ in sizes]
