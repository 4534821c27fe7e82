"""``TF_CONFIG``, checked without TensorFlow: the strategies of ``xmc-tf
train --strategy`` and :func:`parse_tf_config`.

Part of the TensorFlow-free package of the command line
(:mod:`xmc_tf_cli`): the command checks ``TF_CONFIG`` here before it spends
~10 s importing TensorFlow.  :mod:`xmc_tf.job.cluster` (the strategies
themselves) re-exports these names.

Source: TensorFlow guide "Multi-worker training with Keras" (the
``TF_CONFIG`` layout ``TFConfigClusterResolver`` reads).
"""

from __future__ import annotations

import json
import re

__all__ = ["STRATEGIES", "TF_CONFIG_EXAMPLE", "parse_tf_config"]

#: Values of ``xmc-tf train --strategy``.
STRATEGIES = ("none", "mirrored", "multi_worker")

#: What a ``TF_CONFIG`` looks like (worker 0 of two), for error messages.
TF_CONFIG_EXAMPLE = ('{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
                     '"task": {"type": "worker", "index": 0}}')

_ADDRESS = re.compile(r"^\S+:\d{1,5}$")


def parse_tf_config(text: str | None) -> dict:
    """Checks a ``TF_CONFIG`` value for ``MultiWorkerMirroredStrategy``.

    ``TF_CONFIG`` is the JSON that TensorFlow's ``TFConfigClusterResolver``
    reads: ``{"cluster": {"worker": ["host:port", ...], "chief":
    ["host:port"] (optional)}, "task": {"type": "worker" | "chief",
    "index": I}}``.  TensorFlow itself reports a malformed one late, deep
    in a traceback; this says what is wrong in one line.  Needs no
    TensorFlow.

    Args:
      text: the variable's value; None or empty when unset.

    Returns:
      ``{"cluster": {type: [address, ...]}, "task_type": str,
      "task_index": int, "num_workers": int (chief included), "index": int
      (this process among them: the chief 0, then the workers in order),
      "is_chief": bool, "address": str}``.

    Raises:
      ValueError: unset, not JSON, or not the layout above (the message
        names what is missing or wrong and shows an example).

    >>> info = parse_tf_config('{"cluster": {"worker": ["a:1", "b:2"]}, '
    ...                        '"task": {"type": "worker", "index": 1}}')
    >>> info["num_workers"], info["index"], info["is_chief"]
    (2, 1, False)
    """
    example = f"e.g. TF_CONFIG='{TF_CONFIG_EXAMPLE}'"
    if not text or not text.strip():
        raise ValueError("TF_CONFIG is not set: it names every worker and "
                         f"this one's index, {example}")
    try:
        tf_config = json.loads(text)
    except ValueError as e:
        raise ValueError(f"TF_CONFIG is not JSON ({e}): {text[:120]!r}; "
                         f"{example}") from None
    if not isinstance(tf_config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object, got "
                         f"{text[:120]!r}; {example}")
    cluster, task = tf_config.get("cluster"), tf_config.get("task")
    _check_cluster(cluster, example)
    return _task_info(cluster, task, example)


def _check_cluster(cluster, example: str) -> None:
    """Raises ValueError unless ``cluster`` maps "worker" (and at most one
    "chief") to lists of "host:port" strings."""
    if not isinstance(cluster, dict) or not isinstance(
            cluster.get("worker", cluster.get("chief")), list):
        raise ValueError('TF_CONFIG has no "cluster": {"worker": ["host:port", '
                         f'...]}}; {example}')
    extra = sorted(set(cluster) - {"worker", "chief"})
    if extra:
        raise ValueError(f"TF_CONFIG's cluster names tasks {extra}; "
                         "MultiWorkerMirroredStrategy trains with \"worker\" "
                         "(and at most one \"chief\") tasks only")
    for kind, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses or not all(
                isinstance(a, str) and _ADDRESS.match(a) for a in addresses):
            raise ValueError(f'TF_CONFIG\'s cluster "{kind}" must be a '
                             f'non-empty list of "host:port" strings, got '
                             f"{json.dumps(addresses)[:120]}")
    if len(cluster.get("chief", [])) > 1:
        raise ValueError('TF_CONFIG\'s cluster "chief" names more than one '
                         "task")


def _task_info(cluster: dict, task, example: str) -> dict:
    """The returned dict of :func:`parse_tf_config` for ``task`` in a
    checked ``cluster``; ValueError when ``task`` is not one of its tasks."""
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ValueError('TF_CONFIG has no "task": {"type": "worker", '
                         f'"index": I}} (this process); {example}')
    kind, index = task["type"], task["index"]
    if kind not in cluster:
        raise ValueError(f"TF_CONFIG's task type {kind!r} is not in its "
                         f"cluster ({', '.join(sorted(cluster))})")
    if not (isinstance(index, int) and not isinstance(index, bool)
            and 0 <= index < len(cluster[kind])):
        raise ValueError(f"TF_CONFIG's task index {index!r} is not an index "
                         f'of its cluster\'s {len(cluster[kind])} "{kind}" '
                         "tasks")
    chiefs = len(cluster.get("chief", []))
    position = index if kind == "chief" else chiefs + index
    return {"cluster": cluster, "task_type": kind, "task_index": index,
            "num_workers": chiefs + len(cluster.get("worker", [])),
            "index": position, "is_chief": position == 0,
            "address": cluster[kind][index]}
