"""Exporting and loading trained xmc_tf models.

* :func:`export_saved_model`: a TF SavedModel with named serving
  signatures (``serve``: ``label_ids``/``scores``; ``score_all_labels``:
  ``label_scores``).
* :func:`save_keras_file`: ``model.keras`` in blocks of rows.
* :func:`load_saved_model` / :func:`load_keras_file`: load them with the op
  library registered, and a clear message instead of TensorFlow's "Op type
  not registered" when it is not.

The files of a work directory (``xmc-tf train``) are written and read by
:mod:`xmc_tf.job.artifacts`.

Loading needs the op library (``Xmc>...`` ops) registered in the process
and xmc_tf's Keras classes registered: ``import xmc_tf`` does both, and
these helpers load the library and import the modules that register the
classes.

Example (serving, in a new process)::

    import tensorflow as tf
    import xmc_tf
    sm = xmc_tf.saving.load_saved_model("WORKDIR/saved_model")
    x = tf.sparse.reorder(tf.SparseTensor(indices, values, dense_shape))
    top = sm.signatures["serve"](indices=x.indices, values=x.values,
                                 dense_shape=x.dense_shape)
    top["label_ids"], top["scores"]        # int32 / float32 [batch, k]
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re

from absl import logging
import keras
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf import variable_io
# The layers, losses, metrics and optimizers register their Keras classes
# (and the ops' gradients) when imported: load_keras_file needs them.
from xmc_tf import layers, losses, metrics, optimizers  # noqa: F401
from xmc_tf.layers.uniform_sparse import per_call_inverted_index
from xmc_tf.errors import OpLibraryError, OpNotRegisteredError
from xmc_tf.ops import _loader, stock

__all__ = ["export_saved_model", "save_keras_file", "load_saved_model",
           "load_keras_file"]


def export_saved_model(model: keras.Model, path: str, k: int = 5,
                       portable: bool | None = None, output=None) -> bool:
    """Writes a TF SavedModel whose signatures have named inputs and outputs.

    Signatures (``tf.saved_model.load(path).signatures[...]``, also callable
    as methods of the loaded object):

    * ``serve``: the top ``k`` labels, ``{"label_ids": int32 [batch, k],
      "scores": float32 [batch, k]}``, best first, decoded by the model's
      head (the top ``k`` of the scores, or MACH's exact decoder).
    * ``score_all_labels`` (heads that score every label):
      ``{"label_scores": float32 [batch, num_labels]}``.

    Inputs, for a model on sparse features: the parts of a
    ``tf.SparseTensor`` ``[batch, num_features]`` in row-major order,
    ``indices`` int64 ``[nnz, 2]``, ``values`` float32 ``[nnz]``,
    ``dense_shape`` int64 ``[2]``; for dense features ``features`` float32
    ``[batch, num_features]``.  A model with several inputs takes each by
    its name (a dict input's key, else the ``keras.Input``'s name): a
    sparse one as ``NAME_indices``, ``NAME_values``, ``NAME_dense_shape``,
    a dense one as ``NAME`` (its dtype, ``[batch, ...]``).  The scores are
    float32 whatever the model's dtype policy (``mixed_float16`` too).  A
    model with several outputs is served at its label-scoring output
    (``output``, :func:`xmc_tf.decoding.label_output`).

    Portable or not: ``portable=True`` traces the signatures with
    TensorFlow's ops only (:func:`xmc_tf.ops.stock.stock_ops`):
    ``Xmc>TopK`` as ``tf.math.top_k``, ``Xmc>EmbeddingBag`` as
    ``tf.sparse.sparse_dense_matmul``, the uniform-sparse products (dense
    and sparse input: output, intermediate and wide-path layers) as
    :func:`xmc_tf.ops.uniform_sparse.uniform_sparse_matmul_stock` and
    MACH's decoder as :func:`xmc_tf.ops.mach.mach_top_k_stock`.  The
    SavedModel then loads in any TensorFlow (TF Serving included) without
    xmc_tf and gives the same top-k labels (scores equal up to float32
    rounding), but the uniform-sparse and MACH formulations serve several
    times slower on the CPU than the ``Xmc>`` ops (benchmarks/serving.py).
    ``portable=None`` uses TensorFlow's ops only where they are as fast
    (``Xmc>TopK``, ``Xmc>EmbeddingBag``): a model without uniform-sparse or
    MACH layers comes out portable, the others keep every ``Xmc>`` op and
    load after ``import xmc_tf`` (the op library must be registered), e.g.
    with :func:`load_saved_model`.
    Each weight is stored once (Keras' ``ExportArchive`` alone stores it
    twice and a loader restores two copies: Keras issue #23553).

    Args:
      model: a Keras model whose output layer a registered head decodes
        (xmc_tf's label-scoring layers, ``keras.layers.Dense``, MACH's
        training model -- not its serving model), or a trainer
        (:mod:`xmc_tf.models`: its wrapped model is exported).
      path: output directory (created or replaced; not atomic -- see
        :func:`export_model`).
      k: labels per instance of ``serve``.
      portable: None (default): TensorFlow's ops where they are as fast and
        that leaves no ``Xmc>`` op, else the ``Xmc>`` ops (as above); True:
        TensorFlow's ops and formulations only, and a model with an
        ``Xmc>`` op that has none (a custom layer's) is an error; False:
        always the ``Xmc>`` ops (the fastest serving on the CPU; loads
        after ``import xmc_tf``).
      output: which output scores the labels, for a model with several
        (a dict key, an output layer's name or a position); None: found
        structurally (:func:`xmc_tf.decoding.label_output`).

    Returns:
      True when the SavedModel is portable (it uses no ``Xmc>`` op); False
      when it needs the op library (load it after ``import xmc_tf``, e.g.
      with :func:`load_saved_model`); with ``portable=None`` an INFO log
      line then names the ops.

    Raises:
      ValueError: no registered head decodes the model (or it is a MACH
        serving model with a ``MachDecoder``: pass the training model), no
        single output scores the labels (pass ``output``),
        ``k`` is out of range, or ``portable=True`` for a model that needs
        an ``Xmc>`` op without a TensorFlow formulation (the message names
        them).
    """
    model = decoding.inference_model(model)
    if any(isinstance(layer, layers.MachDecoder) for layer in model.layers):
        raise ValueError(
            "export_saved_model takes MACH's training model (its output the "
            "MachHead's [b, R, B] logits), not a serving model that already "
            "decodes: its serve signature decodes with MACH's decoder")
    model = decoding.label_output(model, output)
    # The serving signatures keep no state between calls.
    with per_call_inverted_index():
        return _export(model, path, k, portable)


def _export(model, path, k, portable) -> bool:
    """:func:`export_saved_model` from the label-scoring model on."""
    stock_only = portable is None or portable
    # Auto: only the equivalents that serve as fast (TopK, EmbeddingBag).
    formulations = bool(portable)
    if stock_only:
        with stock.stock_ops(formulations):
            archive, endpoints = _serving_archive(model, k)
            needed = stock.custom_op_types(
                fn.get_concrete_function().graph.as_graph_def()
                for fn in endpoints)
        if needed and portable:
            raise ValueError(
                "the model's signatures need the xmc_tf ops "
                f"{', '.join(needed)}, which TensorFlow has no equivalent "
                "of: its SavedModel cannot be portable")
        stock_only = not needed
        if needed:
            logging.info("%s: not portable, it keeps the xmc_tf ops (%s are "
                         "several times faster than TensorFlow's "
                         "formulations): load it after `import xmc_tf`",
                         path, ", ".join(needed))
    if not stock_only:  # traced again, with the Xmc> ops
        archive, _ = _serving_archive(model, k)
    _track_backing_variables(archive)
    with (stock.stock_ops(formulations) if stock_only
          else contextlib.nullcontext()):
        archive.write_out(path, verbose=False)
    return stock_only



def _serving_archive(model: keras.Model, k: int):
    """An ``ExportArchive`` tracking ``model`` with the ``serve`` (and
    ``score_all_labels``) endpoints, traced now (in the caller's
    :func:`~xmc_tf.ops.stock.stock_ops` state); also returns the endpoint
    ``tf.function`` objects."""
    top_k = decoding.top_k_function(model, k)
    archive = keras.export.ExportArchive()
    archive.track(model)
    signature, pack = _input_signature(model)
    # Named parameters name the signature inputs (and the loaded object's
    # methods' keywords); tf.functions with their own signatures because
    # ExportArchive would make a sparse input dense.
    parameters = inspect.Signature([
        inspect.Parameter(spec.name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for spec in signature])

    def serve(*args):
        _capture_variables_by_name(model)
        ids, scores = top_k(pack(args))
        return {"label_ids": ids, "scores": scores}

    def score_all_labels(*args):
        _capture_variables_by_name(model)
        return {"label_scores": tf.cast(model(pack(args), training=False),
                                        tf.float32)}

    functions = [serve]
    if decoding.scores_every_label(model):
        functions.append(score_all_labels)
    endpoints = []
    for fn in functions:
        fn.__signature__ = parameters
        endpoints.append(tf.function(fn, input_signature=signature))
    for fn in endpoints:
        archive.add_endpoint(fn.__name__, fn)
    return archive, endpoints


def _input_signature(model: keras.Model):
    """The signature's ``TensorSpec`` s (named) and ``pack(args)``, which
    rebuilds the model's input from them: one sparse input as
    ``indices, values, dense_shape``, one dense input as ``features``,
    several by name (a sparse one ``NAME_indices``... as
    :func:`export_saved_model` says)."""
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        named = list(struct.items())
    else:
        named = [(t.name, t) for t in model.inputs]
    named = [(re.sub(r"\W", "_", str(name)), t) for name, t in named]
    single = len(named) == 1
    signature, parts = [], []
    for name, tensor in named:
        if tensor.sparse:
            prefix = "" if single else f"{name}_"
            signature += [
                tf.TensorSpec([None, 2], tf.int64, name=f"{prefix}indices"),
                tf.TensorSpec([None], tf.float32, name=f"{prefix}values"),
                tf.TensorSpec([2], tf.int64, name=f"{prefix}dense_shape")]
            parts.append(3)
        else:
            dtype = tf.float32 if single else tf.as_dtype(tensor.dtype)
            signature.append(tf.TensorSpec(
                [None, *tensor.shape[1:]], dtype,
                name="features" if single else name))
            parts.append(1)

    def pack(args):
        values, at = [], 0
        for width in parts:
            group = args[at:at + width]
            at += width
            values.append(tf.SparseTensor(*group) if width == 3 else group[0])
        if isinstance(struct, dict):
            return {key: v for key, v in zip(struct, values)}
        return values[0] if single else values
    return signature, pack


def _capture_variables_by_name(model: keras.Model) -> None:
    """Captures the handle of each of ``model``'s variables in the function
    being traced, under a valid input name of its own (from the variable's
    path, e.g. ``dense_kernel``).

    Otherwise each handle is captured where it is first read, named after
    the reading op's input inside its name scope (``resource``, or
    ``input_11`` for a ``tf.while_loop``'s captures), and the SavedModel
    writer renames every such input to its scoped name and logs each rename
    (one INFO line of about 600 characters per signature, e.g. "Function
    `serve` contains input name(s) resource, input_11, ... with unsupported
    characters which will be renamed to ..._readvariableop_resource").
    Later reads find the handle captured already and use this input.
    """
    graph = tf.compat.v1.get_default_graph()
    taken = {op.name.lower() for op in graph.get_operations()}
    for variable in model.variables:
        try:
            handle = _backing_variable(variable).handle
        except (AttributeError, ValueError, RuntimeError):
            continue  # not a resource variable, or no single handle here
        if not hasattr(handle, "numpy") or tf.is_symbolic_tensor(handle):
            continue  # captured by the graph it lives in, not by this one
        path = str(getattr(variable, "path", None) or variable.name)
        base = re.sub(r"[^a-z0-9_]+", "_", path.lower()).strip("_")
        if not base or not base[0].isalpha():
            base = "variable_" + base
        name, n = base, 0
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        taken.add(name)
        graph.capture(handle, name=name)


def _backing_variable(variable):
    """The ``tf.Variable`` behind a Keras variable (TensorFlow backend), or
    ``variable`` itself when it has none (already a ``tf.Variable``, or
    another kind of trackable)."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "_value", None)  # Keras 3 TF backend
    return inner if isinstance(inner, tf.Variable) else variable


def _track_backing_variables(archive) -> None:
    """Makes ``archive`` store each weight once.

    ``ExportArchive.track`` lists the model's Keras variables, while the
    endpoints capture the ``tf.Variable`` behind each of them; the two are
    different trackables, so the SavedModel's checkpoint held every weight
    twice (``variables/`` and ``_all_variables/``), and a process loading it
    restored two buffers per weight: twice the disk, the write time and the
    serving memory (Keras issue #23553).  Listing the backing
    ``tf.Variable`` objects instead lets TensorFlow's object-identity
    de-duplication store them once; the loaded object's ``variables``
    lists stay as they were.  A no-op where Keras already lists the
    backing variables (its fix of that issue), or lays the archive out
    otherwise.
    """
    tracked = getattr(archive, "_tf_trackable", None)  # Keras 3 internals
    if tracked is None:  # pragma: no cover - another Keras layout
        return
    for name in ("variables", "trainable_variables",
                 "non_trainable_variables"):
        listed = getattr(tracked, name, None)
        if listed is not None:
            setattr(tracked, name, [_backing_variable(v) for v in listed])


def _block_h5_store(base, chunk_bytes: int):
    """A subclass of Keras' ``H5IOStore`` whose large variables are written
    a block of rows at a time (:func:`xmc_tf.variable_io.write_h5_dataset`)
    instead of through one NumPy copy (Keras' ``convert_to_numpy``, which
    for a variable makes two)."""

    class BlockH5Store(base):
        def __setitem__(self, key, value):
            if self.mode == "w" and hasattr(self, "_create_h5_group"):
                if not self._h5_entry_initialized:
                    self._create_h5_group(self._h5_entry_path)
                if variable_io.write_h5_dataset(self._h5_entry_group, key,
                                                value, chunk_bytes):
                    return
            super().__setitem__(key, value)

    return BlockH5Store


def save_keras_file(model: keras.Model, path: str,
                    chunk_bytes: int = variable_io.CHUNK_BYTES) -> None:
    """``model.save(path)`` with the weights streamed to disk.

    Keras writes the ``.keras`` archive's weights file into memory first
    whenever the weights are smaller than half the machine's available
    memory, then copies it into the archive, and reads every variable into
    two NumPy copies as it writes it (0.5 GB each for a 670k-label model's
    ``[135909, 1024]`` encoder).  Here the weights file is written beside
    ``path`` and streamed into the archive (Keras' own path when memory is
    short: its memory check answers "insufficient"), and variables larger
    than ``chunk_bytes`` are written a block of rows at a time.  The
    archive holds what ``model.save`` writes.  These are Keras 3 internals
    (``keras.src.saving.saving_lib``); without them this is
    ``model.save(path)``.

    Args:
      model: a Keras model.
      path: the ``.keras`` file to write.
      chunk_bytes: largest block of a variable held at once (bytes, > 0).
    """
    try:
        from keras.src.saving import saving_lib  # Keras 3 internals
    except ImportError:  # pragma: no cover - another Keras layout
        saving_lib = None
    check = getattr(saving_lib, "is_memory_sufficient", None)
    store = getattr(saving_lib, "H5IOStore", None)
    if check is None or store is None:  # pragma: no cover - other Keras
        model.save(path)
        return
    saving_lib.is_memory_sufficient = lambda _model: False
    saving_lib.H5IOStore = _block_h5_store(store, chunk_bytes)
    try:
        model.save(path)
    finally:
        saving_lib.is_memory_sufficient = check
        saving_lib.H5IOStore = store


_UNREGISTERED = re.compile(r"Op type not registered '([^']+)'")


def _library_note() -> str:
    try:
        path = _loader.library_path()
        built = _loader.build_info(path).get("tf_version", "unknown")
        return (f"the op library {path} was built for TensorFlow {built}; "
                f"TensorFlow {tf.__version__} is running")
    except OpLibraryError as e:
        return str(e)


def _op_error(path: str, error: Exception) -> OpNotRegisteredError:
    match = _UNREGISTERED.search(str(error))
    op = match.group(1) if match else "an op"
    return OpNotRegisteredError(
        f"{path} uses {op}, which is not registered in this process: "
        "`import xmc_tf` before loading (xmc_tf.saving.load_saved_model does "
        f"that); {_library_note()}; if they differ, reinstall xmc_tf "
        "(`pip install .`)")


def _register_ops(path: str) -> None:
    try:
        _loader.load()
    except OpLibraryError as e:
        raise OpNotRegisteredError(
            f"cannot load {path}: the xmc_tf op library is unavailable: {e}"
        ) from e


def load_saved_model(path: str):
    """``tf.saved_model.load(path)`` with the xmc_tf ops registered.

    Args:
      path: a SavedModel directory (e.g. ``WORKDIR/saved_model``).

    Returns:
      The loaded object; ``.signatures["serve"]`` and
      ``.signatures["score_all_labels"]`` as documented in
      :func:`export_saved_model`.

    Raises:
      OpNotRegisteredError: the op library is missing, built for another
        TensorFlow, or lacks an op the model uses (the message names the op
        and the TensorFlow version the library was built for).
      OSError: ``path`` holds no SavedModel.
    """
    _register_ops(path)
    if not os.path.exists(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(2, "no saved_model.pb (not a SavedModel)",
                                path)
    try:
        return tf.saved_model.load(path)
    except (tf.errors.NotFoundError, ValueError) as e:
        if _UNREGISTERED.search(str(e)):
            raise _op_error(path, e) from e
        raise


def load_keras_file(path: str) -> keras.Model:
    """A ``.keras`` file written by xmc_tf, loaded uncompiled with the op
    library registered (``keras.models.load_model(path, compile=False)``).

    Args:
      path: the ``.keras`` file.

    Returns:
      The uncompiled ``keras.Model``.

    Raises:
      OSError: ``path`` does not exist.
      OpNotRegisteredError: the op library is unavailable (what to do is
        in the message).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist")
    _register_ops(path)
    try:
        return keras.models.load_model(path, compile=False)
    except (tf.errors.NotFoundError, ValueError) as e:
        if _UNREGISTERED.search(str(e)):
            raise _op_error(path, e) from e
        raise
