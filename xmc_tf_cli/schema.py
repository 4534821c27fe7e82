"""The config schema of ``xmc-tf train``: every field and its one default.

:func:`base` builds the schema for one head: the fields every job reads
(:data:`BASE`) with the fields and defaults that head declares
(:data:`HEAD_DEFAULTS`; each :class:`xmc_tf.job.heads.Head` subclass carries
its entry as ``config_defaults``), locked, so that a config or a command
line can set a field but not invent one (``--config.model.dropuot=0.1`` is
an error).  The code reads fields directly (``config.model.encoder``).

The *packaged configs* (``xmc_tf/configs/<name>.py``, shipped with the
package) are short overrides of :func:`base`, each line a value that
differs and why; :func:`get_config` loads one by name, and ``xmc-tf train
--config=NAME`` takes a name as well as a file (:func:`config_file`).  The
measurements behind the defaults are in ``docs/notes/defaults.md``.

This module imports neither TensorFlow nor keras: it lives in the
TensorFlow-free package of the command line (:mod:`xmc_tf_cli`), so that
``xmc-tf train --help`` and config files load it at once; the library
re-exports it as :mod:`xmc_tf.config`, the name to import.

Example:
    >>> from xmc_tf import config as xconfig
    >>> c = xconfig.base("mach")
    >>> c.model.head, c.loss, c.model.num_buckets, c.model.encoder
    ('mach', 'bce', 32, 'sparse_embedding')
    >>> xconfig.get_config("mach").model.dropout
    0.5
    >>> "mach" in xconfig.names()
    True
"""

from __future__ import annotations

import copy
import importlib.util
import os
import runpy

import ml_collections
from ml_collections import config_dict

__all__ = ["BASE", "DEFAULT_CONFIG", "DEFAULT_HEAD", "HEAD_DEFAULTS",
           "CONFIGS_DIR", "MULTI_CLASS_DEFAULTS", "REGIME_FIELDS", "base",
           "config_file", "get_config", "names", "by_regime", "AUTO", "auto_bool",
           "check_int", "check_nonnegative",
           "AUTO_BOOL_FIELDS",
           "unresolved_fields", "regime_values", "resolve_regime",
           "flat_fields", "config_from_file"]

def _configs_dir() -> str:
    """``xmc_tf/configs`` of the installed ``xmc_tf`` package, found
    without importing it (its ``__init__`` loads TensorFlow)."""
    spec = importlib.util.find_spec("xmc_tf")
    locations = list(spec.submodule_search_locations or []) if spec else []
    base = (locations[0] if locations else os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "xmc_tf"))
    return os.path.join(base, "configs")


#: Folder of the packaged configs (``xmc_tf/configs``).
CONFIGS_DIR = _configs_dir()
#: The config ``xmc-tf train`` uses without ``--config``.
DEFAULT_CONFIG = "quickstart"
#: ``config.model.head`` of :func:`base` without an argument.
DEFAULT_HEAD = "uniform_sparse"


#: The value of a config field that the job reads from the data.
AUTO = "auto"


def auto_bool(value, field: str):
    """A bool config field that also takes ``"auto"``: True, False or None
    (``"auto"``).  The command line gives such a string field strings
    (``--config.sampler.shared=True`` on a config whose default is
    ``"auto"``), which are read here.

    Args:
      value: the field's value.
      field: its dotted name, for the message (``"config.tree.enabled"``).

    Raises:
      ValueError: any other value.

    >>> auto_bool("auto", "f"), auto_bool("True", "f"), auto_bool(False, "f")
    (None, True, False)
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == AUTO:
        return None
    if text in ("true", "1"):
        return True
    if text in ("false", "0", "none", ""):
        return False
    raise ValueError(f"{field}={value!r}; expected True, False or {AUTO!r}")


def check_int(field: str, value, low: int) -> None:
    """An int field (not a bool) of at least ``low``.

    Args:
      field: its dotted name without ``config.`` (``"tree.beam"``).
      value: the field's value.
      low: the smallest value allowed.

    Raises:
      ValueError: any other value (the message names the field).
    """
    if not (isinstance(value, int) and not isinstance(value, bool)
            and value >= low):
        raise ValueError(f"config.{field}={value!r} must be an int >= {low}")


def check_nonnegative(field: str, value) -> None:
    """A number field (int or float, not a bool) of at least 0.

    Raises:
      ValueError: any other value (the message names ``config.<field>``).
    """
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and value >= 0):
        raise ValueError(f"config.{field}={value!r} must be a number >= 0")


def _base() -> dict:
    """The fields every job reads, with their defaults: the paper's
    uniform-sparse model (Schultheis & Babbar, Sec. 3-4), re-chosen on
    validation splits (docs/notes/defaults.md)."""
    return dict(
        seed=0,  # initialisation, batch order, SET draws, the validation split
        # "squared_hinge" (Sec. 3.3) or "bce"; heads may take others
        # (xmc_tf.job.heads: "softmax", "auto", "scent")
        loss="squared_hinge",
        data=dict(
            # xmc_tf.data.load_dataset spec or XC file; bundled Bibtex
            train="bibtex:train",
            test="bibtex:test",  # "" for none
            # sparse features: "auto" (tf-idf for count / binary values, l2
            # rows for files holding tf-idf weights), "tfidf", "l2", "none"
            normalize="auto",
            validation_fraction=0.1,  # of train, for LR schedule / early stop
            # seed of the validation split; None: config.seed
            split_seed=config_dict.placeholder(int),
        ),
        model=dict(
            head=DEFAULT_HEAD,  # xmc_tf.job.heads.names(); see HEAD_DEFAULTS
            # first encoder layer on sparse input: "sparse_embedding"
            # (row-sparse gradient) or "dense" (keras Dense)
            encoder="sparse_embedding",
            encoder_dims=(1024,),  # ReLU encoder layers; () for none
            input_dropout=0.0,  # on the input features (paper 0.1-0.2)
            # wide path (sparse input, label-wise heads): per label a linear
            # classifier on its 128 strongest input features; 0 turns it off
            wide_connections=128,
            # ... cut to fit this many MiB of training memory (20 bytes per
            # connection: weight, index, two Adam moments, gradient): all
            # 128 up to 26k labels, 5 at 670k; None: no cap
            wide_max_mib=config_dict.FieldReference(64, field_type=int),
            # no input feature in more than this many times the mean
            # number of labels per feature (m s / e) of the wide path: a
            # feature of most instances is otherwise in the choices of
            # almost every label, and a batch costs one multiply-add per
            # (entry, label of its feature); None: no cap
            wide_max_fan_out=config_dict.FieldReference(None,
                                                        field_type=float),
            wide_init="zeros",  # or "centroid": the label's centroid cosine
            wide_lr_multiplier=5.0,  # the wide kernel trains 5x faster
            wide_l2=0.0,  # L2 on the wide kernel (no gain at 1e-4 / 1e-3)
            dropout=0.7,  # after each encoder layer
            intermediate_dim=4096,  # 0: encoder output -> head
            # "leaky_relu" (no dead units under the prior bias), "relu",
            # "gelu" or "linear"
            intermediate_activation="leaky_relu",
            intermediate_dropout=0.0,  # after the intermediate layer
            connections_per_label=64,  # uniform-sparse fan-in per label
            # the uniform-sparse head's kernel: "optimizer" (train.optimizer,
            # from a dense [m, s] gradient) or "fused_adam" (Adam, every
            # label) / "fused_lazy_adam" (the labels with signal only) /
            # "fused_sgd", stepped inside the backward at the optimizer's
            # learning rate: no [m, s] gradient, no optimizer slots
            # (xmc_tf.optimizers.FusedUpdate)
            head_update="optimizer",
            # the uniform-sparse head's kernel dtype: "float32" or
            # "bfloat16" (2 bytes a weight; with a fused update its state is
            # bfloat16 too and its steps Kahan-compensated)
            head_dtype="float32",
            # label-wise heads' output bias at the start: "prior" (the
            # loss's best constant score per label) or "zeros"
            output_bias_init="prior",
            # members trained with seeds seed, seed+1, ... and averaged
            ensemble_size=1,
        ),
        train=dict(
            # "lazy_adam", "lazy_adamw" or "adam" (densifies sparse gradients)
            optimizer="lazy_adam",
            weight_decay=0.004,  # lazy_adamw only (decoupled, x learning rate)
            batch_size=64,
            # label-wise heads: the batch's [batch_size, num_labels] float32
            # scores are kept under this many MiB (a larger batch_size is
            # cut to fit, with a log line: 256 up to 131,072 labels, 50 at
            # 670k); None: no cap
            batch_scores_mib=config_dict.FieldReference(128, field_type=int),
            epochs=60,  # at most; early stopping decides
            learning_rate=1e-3,  # LR halved on plateaus of val P@3 ...
            min_learning_rate=1e-4,  # ... down to this
            lr_patience=1,  # epochs without progress before halving
            # "plateau" (the halving above) or "cosine": per step from
            # learning_rate down to min_learning_rate over train.epochs
            # epochs (early stopping still ends the run)
            schedule="plateau",
            early_stopping_patience=3,
            # what LR halving and early stopping follow: "network" (the
            # head's validation P@k), "fused" (the validation P@k of the
            # network fused with the tree, centroids and votes:
            # xmc_tf.job.finalize.FusedValidation) or "auto" ("fused" on
            # multi-class labels when the few-shot scorers are on:
            # xmc_tf.job.plan.monitor_plan)
            monitor="auto",
            # progress = the monitor moving by this; None: Keras' defaults
            # (1e-4 for the LR schedule, 0 for early stopping)
            min_delta=config_dict.FieldReference(0.001, field_type=float),
            tensorboard=False,  # writes DIR/tensorboard (needs tensorboard)
            # Keras: 1 = progress bar (one line per epoch where stdout is
            # not a terminal), 2 = one line per epoch
            verbose=2,
        ),
        set=dict(  # SET rewiring of uniform-sparse layers (Sec. 4.1)
            enabled=True,
            every_n_steps=1000,
            fraction=0.1,  # of each label's connections moved
            # "random" (SET) or "gradient" (RigL: the largest dense
            # gradient over gradient_instances training instances)
            regrowth="random",
            gradient_instances=4096,
            wide=False,  # also rewire the wide path's layer
        ),
        # Shortlist and re-rank (xmc_tf.layers.FusedScores): the fused
        # model ranks, per instance, the labels its shortlisting scorers
        # shortlist (the tree's beam search, the neighbours' votes), each
        # scored by every scorer and the network; its weights are read and
        # its test P@k measured on those shortlists.
        shortlist=ml_collections.ConfigDict(type_safe=False, initial_dictionary=dict(
            # "auto": on above min_labels labels (below, every label is
            # scored exactly: as cheap); or a bool
            enabled="auto",
            min_labels=4096,
        )),
        # Second scorer: a label tree of L2-regularised linear rankers
        # (xmc_tf.shortlist.fit_label_tree, Parabel), fit on the fit split
        # and added to the model's scores as network + weight * tree.
        tree=ml_collections.ConfigDict(type_safe=False, initial_dictionary=dict(
            # "auto": on for sparse input with a validation split and a
            # head that scores every label, up to max_labels labels
            # (multi-label data) or max_classes (multi-class), and with
            # centroid rankers up to max_centroid_labels; or a bool
            enabled="auto",
            max_labels=100_000,  # linear rankers up to (time, memory)
            max_classes=262_144,  # multi-class: one solve per leaf
            # centroid rankers up to this many labels: 0 (off) by default,
            # their shortlist missed most of the network's top 5 on the
            # Amazon-670K-shaped set (docs/notes/shortlist.md)
            max_centroid_labels=0,
            # the rankers of the nodes and labels: "linear" (liblinear,
            # Parabel), "centroids" (the labels' PIFA centroids, no training:
            # a shortlist for the network where linear ones cost too much),
            # "auto" (linear up to max_labels / max_classes, else centroids)
            rankers="auto",
            # "auto": the weight of FUSION_WEIGHTS (0 included) with the best
            # mean validation P@k over eval.ks; or a number >= 0
            weight="auto",
            leaf_size=100,  # labels per leaf
            beam=10,  # nodes kept per level of the beam search (Parabel)
            shortlist=400,  # labels per instance it shortlists
            c=1.0,  # liblinear C (inverse L2 strength)
            tol=0.1,  # liblinear stopping tolerance
            threshold=0.1,  # weights of smaller magnitude are dropped
        )),
        # Nearest-centroid scores (xmc_tf.layers.label_centroids: each
        # label's normalised PIFA row) added to the model's after training,
        # as model + weight * centroids, for labels with few instances.
        centroids=ml_collections.ConfigDict(type_safe=False, initial_dictionary=dict(
            # "auto": on for sparse input with a validation split, a head
            # that scores every label and few-shot training labels (median
            # instances per label <= max_median_instances), up to max_labels
            # labels and max_entries entries of the PIFA aggregate; or a bool
            enabled="auto",
            connections=32,  # features kept per label (8 bytes each)
            max_median_instances=8,
            max_labels=262_144,  # "auto" stays off above (weight choice time)
            max_entries=20_000_000,  # label_nnz x features per instance
            # "auto": the weight of CENTROID_WEIGHTS (0 included) with the
            # best mean validation P@k over eval.ks; or a number >= 0
            weight="auto",
            # centroids of the rows weighted by the training set's idf once
            # more (FeatureNormalization("tfidf") before the centroid
            # layer): "auto" builds both and keeps the one with the better
            # validation P@k (the plain one without a validation split or
            # at a fixed weight); or a bool
            idf="auto",
        )),
        # Nearest-neighbour scores (xmc_tf.layers.NearestNeighbourScores:
        # the k most similar training instances vote for their labels)
        # added to the model's after training, as model + weight * votes,
        # for labels with few instances.
        neighbours=ml_collections.ConfigDict(type_safe=False, initial_dictionary=dict(
            # "auto": on for sparse input with a validation split, a head
            # that scores every label and few-shot training labels (median
            # instances per label <= max_median_instances), up to max_labels
            # labels, while an instance's features meet at most
            # max_postings stored training entries on average; or a bool
            enabled="auto",
            k=100,  # training instances that vote
            power=2.0,  # a neighbour's vote: cosine ** power
            max_median_instances=8,
            # "auto" stays off above, unless the fused model shortlists
            # (config.shortlist: then no part scores every label)
            max_labels=262_144,
            max_postings=100_000,  # "auto" stays off above (time per query)
            # "auto": the weight of NEIGHBOUR_WEIGHTS (0 included) with the
            # best mean validation P@k over eval.ks; or a number >= 0
            weight="auto",
            # cosines of the rows weighted by the training set's idf once
            # more, as centroids.idf: "auto" reads both on validation
            idf="auto",
            shortlist=100,  # labels per instance its votes shortlist
        )),
        eval=dict(
            ks=(1, 3, 5),  # P@k, nDCG@k, PSP@k, R@k
            batch_size=1024,
            propensity_a=0.55,  # PSP propensity model (Jain et al. 2016)
            propensity_b=1.5,
        ),
    )


#: Every field of :func:`base` that all heads share, with its default.
BASE = _base()

#: Per head (``config.model.head``): the fields it adds and the defaults
#: it changes.  A section given as a ``ConfigDict`` keeps its own settings
#: (``sampler`` is not type-safe: ``shared`` takes True, False or "auto").
HEAD_DEFAULTS = {
    # chosen on the validation splits of Bibtex, Delicious and
    # WordNetHypernyms for the time to train (docs/notes/epochs.md)
    "uniform_sparse": dict(
        model=dict(intermediate_dim=1024),
        # patience 2: on the shared sets' validation splits (3 seeds each)
        # no run improved after two epochs without progress, so the third
        # was a lost epoch (docs/notes/epochs.md section 6)
        train=dict(batch_size=256, learning_rate=2e-3,
                   early_stopping_patience=2),
    ),
    "dense": dict(
        set=dict(enabled=False),  # SET rewires uniform-sparse layers only
    ),
    "mach": dict(
        loss="bce",  # or "softmax" (multi-class data)
        model=dict(
            num_buckets=32,  # B: a round default; set B and R for your m
            num_repetitions=16,  # R
            wide_connections=0,  # no wide path
            # measured with ReLU, lr 2e-3 and Keras' min_delta: leaky ReLU,
            # 1e-3 and 0.001 came with the prior bias of label-wise heads
            intermediate_activation="relu",
        ),
        train=dict(learning_rate=2e-3, min_delta=None),
        set=dict(enabled=False),  # SET rewires uniform-sparse layers only
    ),
    "sampled": dict(
        # "auto": the sampled softmax on multi-class data, the squared hinge
        # on multi-label data; or "squared_hinge", "bce", "softmax"
        loss="auto",
        model=dict(
            sampled_layer="uniform_sparse",  # or "dense" (label-major)
            wide_connections=0,  # no wide path
            intermediate_activation="relu",  # as MACH's (measured with)
        ),
        train=dict(learning_rate=2e-3, min_delta=None),  # as MACH's
        sampler=ml_collections.ConfigDict(type_safe=False, initial_dictionary=dict(
            kind="mixture",  # "uniform", "in_batch", "ann", "mixture", "lsh"
            num_negatives=256,  # k of "uniform" / "in_batch" / "ann" / "lsh"
            num_hard=32,  # k_h (ASTRA: O(log L))
            num_uniform=256,  # k_r
            index="auto",  # exact up to 16k labels, IVFFlat-IP above
            nprobe=16,  # faiss IVF lists probed
            refresh_start_epoch=1,  # tau_s: first epoch with hard negatives
            refresh_every_epochs=1,  # tau_r
            refresh_every_steps=0,  # 0: epoch schedule only
            max_fraction=0.25,  # cap on candidates per row, fraction of m
            # one candidate set per batch ("uniform", "mixture", "lsh");
            # "auto": shared on multi-class data, per row on multi-label
            shared="auto",
            pool_positives=True,  # shared "mixture": batch positives in pool
            hard_queries=32,  # shared: rows queried for hard ones (0: all)
            hash="simhash",  # "lsh": or "dwta"
            # "lsh": hash functions per table; "auto": lsh_auto_K (about k
            # labels in the L probed buckets, per hash family; K=9 left
            # Bibtex's buckets empty)
            K="auto",
            L=50,  # "lsh": tables
            query="embedding",  # "lsh": or "label"
            weighting="inverse_probability",  # "lsh": or "none"
            min_probability=0.0,  # "lsh": floor of p_j (0: 1 / m)
            rehash_every_steps=50,  # "lsh": table update period ...
            rehash_decay=0.95,  # ... and its decay
        )),
    ),
    "scent": dict(
        loss="scent",
        model=dict(
            sampled_layer="dense",  # or "uniform_sparse"
            wide_connections=0,  # no wide path
        ),
        set=dict(enabled=False),  # SET: with sampled_layer="uniform_sparse"
        scent=dict(
            variant="scent",  # or "sox"
            alpha=1000.0,  # dual step alpha (SOX: gamma)
            negatives="multiset",  # paper; "unique": each other class once
            correction="log_q",  # "none": the paper's in-batch estimator
            # own class in the inner mean (False: paper; NaN on
            # ManNextWord's 400k instances from epoch 2)
            own_term=True,
            beta=0.1,  # momentum weight of Algorithm 26 (scent_momentum)
        ),
    ),
}


#: Values of the fields a config leaves to the data (:func:`by_regime`) on
#: *multi-class* training labels (every instance has at most one label):
#: configs/scent.py's network and schedule, measured on ManNextWord (50k
#: classes; docs/notes/scent.md).  With them the shared ASTRA head tied SCENT's
#: validation P@1 after 2 epochs (12.80 vs 12.75) at 1.5x its time, against
#: 10.50 at 4.1x with the base network (docs/notes/sampled.md).  On multi-label
#: labels the fields take the head's schema default (:func:`base`), the
#: values measured on Bibtex / Delicious (docs/notes/defaults.md).
#: ``train.min_delta`` is not here: None in both (the sampled head's and
#: SCENT's), and None means Keras' thresholds there.
MULTI_CLASS_DEFAULTS = {
    "data.normalize": "l2",  # as measured for SCENT (docs/notes/scent.md)
    "data.validation_fraction": 0.05,  # large multi-class training files
    "model.encoder_dims": (512,),
    "model.intermediate_dim": 0,  # encoder output -> head
    "model.dropout": 0.5,
    "model.sampled_layer": "dense",  # label-major: one GEMM per shared set
    "train.batch_size": 256,
    "train.learning_rate": 1e-2,
    "train.min_learning_rate": 1e-3,
    "train.early_stopping_patience": 2,
}
#: The fields :func:`by_regime` may leave to the data.
REGIME_FIELDS = tuple(MULTI_CLASS_DEFAULTS)
#: Fields that take True, False or ``"auto"`` (:func:`auto_bool`; the
#: command line gives them strings).  The job's plan leaves a bool in each,
#: except an ``idf="auto"`` that the finalize phase reads on validation.
AUTO_BOOL_FIELDS = ("tree.enabled", "centroids.enabled", "centroids.idf",
                    "neighbours.enabled", "neighbours.idf",
                    "shortlist.enabled", "sampler.shared")


def _get(config, field: str):
    section, _, name = field.rpartition(".")
    holder = config[section] if section else config
    return holder, name


def by_regime(config, fields=REGIME_FIELDS) -> ml_collections.ConfigDict:
    """Leaves ``fields`` of ``config`` to the data's label regime.

    Each field becomes a typed placeholder holding None ("chosen when the
    training labels are read", :func:`resolve_regime`); a value set later
    (in a config file, or ``--config.model.encoder_dims="(256,)"`` on the
    command line, parsed with the field's type) replaces the placeholder
    and is kept.

    Args:
      config: a config of :func:`base` (changed in place).
      fields: dotted names from :data:`REGIME_FIELDS` that ``config`` has.

    Returns:
      ``config`` itself.

    Raises:
      ValueError: a field not in :data:`REGIME_FIELDS`.
      KeyError: a field ``config`` lacks (e.g. ``model.sampled_layer``
        for a head without one).

    >>> c = by_regime(base("sampled"), ("model.dropout", "train.batch_size"))
    >>> c.model.dropout, c.train.batch_size, c.model.encoder_dims
    (None, None, (1024,))
    >>> c.train.batch_size = 32  # an explicit value
    >>> unresolved_fields(c)
    ('model.dropout',)
    """
    for field in fields:
        if field not in REGIME_FIELDS:
            raise ValueError(f"config.{field} cannot be chosen by regime; "
                             f"fields that can: {', '.join(REGIME_FIELDS)}")
        holder, name = _get(config, field)
        holder[name] = config_dict.placeholder(holder.get_type(name))
    return config


def flat_fields(fields: dict, prefix: str = ""):
    """Yields ``(dotted name, value)`` for every leaf of a nested dict (a
    config's JSON, or overrides such as ``{"train": {"epochs": 5}}``).

    >>> list(flat_fields({"train": {"epochs": 5}, "seed": 0}))
    [('train.epochs', 5), ('seed', 0)]
    """
    for key, value in fields.items():
        if isinstance(value, dict):
            yield from flat_fields(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def unresolved_fields(config) -> tuple[str, ...]:
    """The fields of :data:`REGIME_FIELDS` that ``config`` leaves to the
    data (None), in :data:`REGIME_FIELDS` order.

    Args:
      config: a job config (fields it lacks are skipped).

    Returns:
      tuple of dotted field names, e.g. ``("model.dropout",)``; empty when
      the config sets them all.
    """
    out = []
    for field in REGIME_FIELDS:
        try:
            holder, name = _get(config, field)
            value = holder[name]
        except (KeyError, AttributeError):
            continue
        if value is None:
            out.append(field)
    return tuple(out)


def regime_values(config, multi_class: bool) -> dict:
    """What :func:`resolve_regime` sets.

    Args:
      config: a job config (``config.model.head`` names its schema).
      multi_class: the training labels' regime (:func:`xmc_tf.data.is_multi_class`).

    Returns:
      ``{field: value}`` for every :func:`unresolved_fields` field:
      :data:`MULTI_CLASS_DEFAULTS` on multi-class labels, else
      ``base(config.model.head)``'s value.

    >>> c = by_regime(base("sampled"), ("train.batch_size",))
    >>> regime_values(c, True), regime_values(c, False)
    ({'train.batch_size': 256}, {'train.batch_size': 64})
    """
    fields = unresolved_fields(config)
    if multi_class:
        return {f: MULTI_CLASS_DEFAULTS[f] for f in fields}
    schema = base(config.model.head)
    out = {}
    for f in fields:
        holder, name = _get(schema, f)
        out[f] = holder[name]
    return out


def resolve_regime(config, multi_class: bool) -> ml_collections.ConfigDict:
    """A copy of ``config`` with the fields left to the data filled in.

    Args:
      config: a job config; fields of :data:`REGIME_FIELDS` that hold None
        (:func:`by_regime`) are filled in, every other value is kept.
      multi_class: the training labels' regime (:func:`xmc_tf.data.is_multi_class`).

    Returns:
      ml_collections.ConfigDict: a new config (``config`` is unchanged;
      a plain copy when nothing is left to the data).

    >>> c = by_regime(base("sampled"), ("model.dropout",
    ...                                 "model.encoder_dims"))
    >>> c.model.encoder_dims = (256,)  # explicit: kept
    >>> r = resolve_regime(c, multi_class=True)
    >>> r.model.dropout, r.model.encoder_dims, c.model.dropout
    (0.5, (256,), None)
    >>> resolve_regime(c, multi_class=False).model.dropout
    0.7
    """
    out = copy.deepcopy(config)
    for field, value in regime_values(config, multi_class).items():
        holder, name = _get(out, field)
        holder[name] = copy.deepcopy(value)
    return out


def _merge(into: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(into.get(key), config_dict.FieldReference):
            into[key] = copy.deepcopy(into[key])  # keeps its type: None
            into[key].set(value)  # stays settable from the command line
        else:
            into[key] = copy.deepcopy(value)


def _to_config(fields: dict) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    for key, value in fields.items():
        setattr(c, key, _to_config(value) if isinstance(value, dict)
                else value)
    return c


def base(head: str = DEFAULT_HEAD) -> ml_collections.ConfigDict:
    """The schema for ``head``: :data:`BASE` with ``HEAD_DEFAULTS[head]``.

    Args:
      head (str): a key of :data:`HEAD_DEFAULTS` (``config.model.head``).

    Returns:
      ml_collections.ConfigDict: a new, locked config (fields can be set,
      not added).

    Raises:
      ValueError: an unknown head.
    """
    if head not in HEAD_DEFAULTS:
        raise ValueError(f"head {head!r}; expected one of "
                         f"{tuple(HEAD_DEFAULTS)}")
    fields = copy.deepcopy(BASE)
    _merge(fields, HEAD_DEFAULTS[head])
    fields["model"]["head"] = head
    c = _to_config(fields)
    c.lock()
    return c


def names() -> tuple[str, ...]:
    """Names of the packaged configs (``xmc_tf/configs/<name>.py``), sorted."""
    return tuple(sorted(
        f[:-3] for f in os.listdir(CONFIGS_DIR)
        if f.endswith(".py") and not f.startswith("_")))


def config_file(spec: str) -> str:
    """The file of a ``--config`` value: a path as given (``configs/mach.py``,
    also with ml_collections' ``:ARG`` suffix), or the packaged file of a
    name (``mach``).

    Raises:
      ValueError: ``spec`` is neither an existing file nor a packaged name
        (the message lists the names).
    """
    if os.path.exists(spec.split(":")[0]) or spec.endswith(".py") or \
            os.sep in spec or "/" in spec:
        return spec
    if spec in names():
        return os.path.join(CONFIGS_DIR, f"{spec}.py")
    raise ValueError(f"no config file or packaged config named {spec!r}; "
                     f"packaged configs: {', '.join(names())}")


def get_config(name: str = DEFAULT_HEAD) -> ml_collections.ConfigDict:
    """The packaged config ``name`` (what ``--config=NAME`` loads).

    Args:
      name (str): one of :func:`names`, e.g. ``"uniform_sparse"``,
        ``"mach"``, ``"astra"``.

    Returns:
      ml_collections.ConfigDict: a new, locked config.

    Raises:
      ValueError: an unknown name (the message lists the names).
    """
    path = config_file(name)
    if not path.startswith(CONFIGS_DIR):
        raise ValueError(f"no packaged config named {name!r}; packaged "
                         f"configs: {', '.join(names())}")
    return config_from_file(path, f"xmc_tf.configs.{name}")


def config_from_file(path: str,
                     module_name: str = "xmc_tf_user_config"
                     ) -> ml_collections.ConfigDict:
    """The config of a config file: its ``get_config()``.

    Args:
      path: a Python file defining ``get_config()`` (``configs/mach.py``).
      module_name: the name the file is executed under.

    Raises:
      ValueError: ``path`` does not exist.
    """
    if not os.path.exists(path):
        raise ValueError(f"config file {path!r} does not exist")
    return runpy.run_path(path, run_name=module_name)["get_config"]()
