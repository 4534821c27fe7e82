"""Named data sets: the bundled ones and the string specs of the CLI.

:func:`load_dataset` maps a short spec (``"bibtex:train"``,
``"synthetic:..."``, ``"X.txt|Y.txt"``, ``"EMB.npy|LABELS.txt"`` or a
combined XC-repo file) to the reader that loads it; :func:`load_bundled`
reads a data set shipped inside the package.
"""

from __future__ import annotations

from xmc_tf.data.dataset import PathLike, XCDataset
from xmc_tf.data.embeddings import read_embeddings
from xmc_tf.data.synthetic import make_synthetic
from xmc_tf.data.xc_reader import read_xc, read_xc_xy

__all__ = ["BUNDLED_DATASETS", "load_bundled", "load_dataset"]

#: Bundled data sets: name -> {split: file name inside xmc_tf/data/bundled}.
BUNDLED_DATASETS = {
    "bibtex": {
        "train": "bibtex_xcsplit_train.txt.gz",
        "test": "bibtex_xcsplit_test.txt.gz",
    },
}


def load_bundled(name: str = "bibtex", split: str = "train") -> XCDataset:
    """Loads a data set shipped inside the package (``xmc_tf/data/bundled``).

    Bundled: ``"bibtex"`` (Katakis et al. 2008; the XC repo's train/test
    split: 4,880 / 2,515 instances, 1,836 binary bag-of-words features, 159
    labels). See ``xmc_tf/data/bundled/README.md`` for provenance and
    citation.

    Args:
      name: data set name (case-insensitive), a key of ``BUNDLED_DATASETS``.
      split: ``"train"`` or ``"test"``.

    Returns:
      The :class:`XCDataset` (CSR float32 features, CSR 1.0 labels).

    Raises:
      ValueError: unknown name or split.

    Example:
        >>> load_bundled("bibtex", "test").num_instances
        2515
    """
    import importlib.resources as resources

    files = BUNDLED_DATASETS.get(name.lower())
    if files is None:
        raise ValueError(f"unknown bundled data set {name!r}; available: "
                         f"{sorted(BUNDLED_DATASETS)}")
    if split not in files:
        raise ValueError(f"unknown split {split!r} of {name!r}; available: "
                         f"{sorted(files)}")
    res = resources.files("xmc_tf.data").joinpath("bundled", files[split])
    with resources.as_file(res) as p:
        return read_xc(p)


def _parse_synthetic_spec(rest: str) -> dict:
    kwargs = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"synthetic spec item {item!r} is not key=value")
        try:
            num = int(val)
        except ValueError:
            try:
                num = float(val)
            except ValueError:
                raise ValueError(f"synthetic spec value {item!r} is not a "
                                 "number") from None
        kwargs[key.strip()] = num
    return kwargs


def load_dataset(spec: PathLike) -> XCDataset:
    """Loads a data set from a short string spec (used by the CLI).

    Conventions, tried in this order:

    * ``"NAME:SPLIT"`` -- a bundled data set, e.g. ``"bibtex:train"``,
      ``"bibtex:test"`` (``"bibtex"`` alone means the train split).
    * ``"synthetic:num_instances=N,num_features=D,num_labels=L[,k=v...]"``
      -- :func:`xmc_tf.data.make_synthetic` with these keyword arguments.
    * ``"EMB.npy|LABELS.txt"`` or ``"EMB.npz|LABELS.txt"`` -- dense
      embeddings plus an XC labels file (:func:`read_embeddings`).
    * ``"X.txt|Y.txt"`` -- separate XC features and labels files
      (:func:`read_xc_xy`).
    * ``"DATA.txt"`` (any other single path, ``.gz`` allowed) -- a combined
      XC repo file (:func:`read_xc`).

    Args:
      spec: the spec string, or a path-like for a combined XC file.

    Returns:
      The loaded :class:`XCDataset`.

    Raises:
      ValueError: a malformed spec (e.g. an ``.npy`` path without ``|``) or
        malformed file contents.
      OSError: a file cannot be opened.

    Example:
        >>> load_dataset("bibtex:test").num_labels
        159
    """
    if not isinstance(spec, str):
        return read_xc(spec)
    head, sep, rest = spec.partition(":")
    if sep and head.lower() in BUNDLED_DATASETS and "|" not in spec:
        return load_bundled(head, rest)
    if spec.lower() in BUNDLED_DATASETS:
        return load_bundled(spec, "train")
    if sep and head.lower() == "synthetic":
        return make_synthetic(**_parse_synthetic_spec(rest))
    if "|" in spec:
        first, _, second = spec.partition("|")
        if not first or not second:
            raise ValueError(f"dataset spec {spec!r}: expected 'A|B'")
        if first.endswith((".npy", ".npz")):
            return read_embeddings(first, second)
        return read_xc_xy(first, second)
    if spec.endswith((".npy", ".npz")):
        raise ValueError(
            f"dataset spec {spec!r}: embeddings need a labels file, "
            "write 'EMBEDDINGS.npy|LABELS.txt'")
    return read_xc(spec)
