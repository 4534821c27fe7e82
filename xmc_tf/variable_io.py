"""Keras variables to and from ``.npy`` data in blocks of rows.

Used by the training checkpoint (:mod:`xmc_tf.job.checkpoint`), by the
best-weights files of :class:`xmc_tf.callbacks.EarlyStopping` and by the
weights file of ``model.keras`` (:func:`xmc_tf.saving.save_keras_file`,
:func:`write_h5_dataset`): a large
variable is written and restored a block of rows at a time, so neither ever
holds a second whole copy of it in memory (an encoder ``[D, d]`` and its two
Adam slots would otherwise cost three transient copies of ``4 D d`` bytes).
The files are plain ``.npy`` (format 1.0 or 2.0): ``np.load`` reads them.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf.ops.sampled import label_variable

__all__ = ["CHUNK_BYTES", "write_variable", "read_variable", "put_npy",
           "write_h5_dataset"]

#: Largest block of a variable read or assigned at once (16 MiB: what a
#: block costs on top of the training state, twice, while a checkpoint is
#: written during training).
CHUNK_BYTES = 16 * 2**20


def _numpy_dtype(variable) -> np.dtype:
    """The NumPy dtype of a Keras or TF variable (``ml_dtypes``' for
    bfloat16, whose ``.npy`` files hold it as raw ``|V2``).

    Raises:
      TypeError: a dtype without a NumPy equivalent.
    """
    return np.dtype(tf.as_dtype(variable.dtype).as_numpy_dtype)


def _rows_per_block(variable, shape, dtype, chunk_bytes: int):
    """``(tf variable, rows per block)`` when ``variable`` is read or
    assigned in blocks of rows, else ``(None, None)`` (scalars, small
    variables, ``tf.distribute`` variables: whole)."""
    tf_var = label_variable(variable)
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    if (tf_var is None or len(shape) == 0 or shape[0] == 0
            or row_bytes * shape[0] <= chunk_bytes):
        return None, None
    return tf_var, max(1, chunk_bytes // max(row_bytes, 1))


def write_variable(f, variable, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Writes ``variable`` to the binary file ``f`` in ``.npy`` format,
    reading at most ``chunk_bytes`` of it at a time.

    A variable larger than ``chunk_bytes`` is read in blocks of rows with
    ``ResourceGather`` (``tf.gather`` on the variable), so writing it never
    holds a second full copy: after a row-sparse update TensorFlow keeps a
    variable in copy-on-read mode, where a dense read copies all of it.
    Scalars, small variables and ``tf.distribute`` variables are read whole.

    Args:
      f: a writable binary file object.
      variable: a ``keras.Variable`` (TensorFlow backend) or ``tf.Variable``
        of any shape and dtype.
      chunk_bytes: bytes per block (> 0).
    """
    shape = tuple(int(d) for d in variable.shape)
    dtype = _numpy_dtype(variable)
    tf_var, rows = _rows_per_block(variable, shape, dtype, chunk_bytes)
    if tf_var is None:
        value = np.asarray(keras.ops.convert_to_numpy(variable))  # 0-d stays
        if not value.flags.c_contiguous:
            value = value.copy(order="C")
        np.lib.format.write_array(f, value, allow_pickle=False)
        return
    header = {"descr": np.lib.format.dtype_to_descr(dtype),
              "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_2_0(f, header)
    for start in range(0, shape[0], rows):
        stop = min(shape[0], start + rows)
        # np.asarray views the gathered tensor's buffer (.numpy() and
        # tobytes() each made one more copy of the block).
        block = np.asarray(tf.gather(tf_var, tf.range(start, stop)))
        # Bytes (a uint8 view: bfloat16 has no buffer-protocol format).
        f.write(memoryview(np.ascontiguousarray(block, dtype).reshape(-1)
                           .view(np.uint8)))


def write_h5_dataset(group, name: str, variable,
                     chunk_bytes: int = CHUNK_BYTES) -> bool:
    """Creates dataset ``name`` in the ``h5py`` group ``group`` holding
    ``variable``, written a block of rows at a time (ResourceGather, as
    :func:`write_variable`), so the variable is never copied whole.

    Variables that :func:`write_variable` would read whole (scalars, small
    ones, ``tf.distribute`` variables, non-variables) are not written.

    Args:
      group: a writable ``h5py.Group``.
      name: the dataset's name in it.
      variable: a ``keras.Variable`` (TensorFlow backend) or
        ``tf.Variable``.
      chunk_bytes: bytes per block (> 0).

    Returns:
      True if the dataset was written, False if the caller should write
      ``variable`` itself (nothing was created).
    """
    shape = tuple(int(d) for d in getattr(variable, "shape", ()))
    try:
        dtype = _numpy_dtype(variable)
    except TypeError:
        return False
    if dtype.kind == "V":  # bfloat16: Keras' own writer marks it
        return False
    tf_var, rows = _rows_per_block(variable, shape, dtype, chunk_bytes)
    if tf_var is None:
        return False
    dataset = group.create_dataset(name, shape=shape, dtype=dtype)
    for start in range(0, shape[0], rows):
        stop = min(shape[0], start + rows)
        dataset[start:stop] = np.asarray(
            tf.gather(tf_var, tf.range(start, stop)))
    return True


def put_npy(zf, name: str, value) -> None:
    """Adds ``NAME.npy`` to the open ``zipfile.ZipFile`` ``zf`` (zip64
    allowed): a Keras / TF variable through :func:`write_variable` (blocks
    of rows), anything else as a C-ordered NumPy array (0-d stays 0-d)."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        if isinstance(value, np.ndarray) or np.isscalar(value):
            value = np.asarray(value)
            if not value.flags.c_contiguous:
                value = value.copy(order="C")
            np.lib.format.write_array(f, value, allow_pickle=False)
        else:
            write_variable(f, value)


def read_variable(f, variable, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Assigns the ``.npy`` array at the position of binary file ``f`` to
    ``variable``, at most ``chunk_bytes`` of it at a time (the reverse of
    :func:`write_variable`: blocks of rows assigned by slice, so a large
    variable is never held twice).

    Args:
      f: a readable binary file object positioned at a ``.npy`` header.
      variable: the ``keras.Variable`` or ``tf.Variable`` to assign; its
        shape and dtype must be the array's.
      chunk_bytes: bytes per block (> 0).

    Raises:
      ValueError: the array's shape or dtype differs from the variable's
        (the message names the variable's path and both).
    """
    major, _ = np.lib.format.read_magic(f)
    read_header = (np.lib.format.read_array_header_1_0 if major == 1 else
                   np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(f)
    want = tuple(int(d) for d in variable.shape)
    own = _numpy_dtype(variable)
    if dtype != own and dtype.kind == own.kind == "V" and \
            dtype.itemsize == own.itemsize:
        dtype = own  # bfloat16 (ml_dtypes) is written as raw "|V2"
    if tuple(shape) != want or dtype != own or fortran:
        raise ValueError(f"{variable.path}: file holds {dtype}{list(shape)}, "
                         f"variable is {_numpy_dtype(variable)}{list(want)}")
    tf_var, rows = _rows_per_block(variable, shape, dtype, chunk_bytes)
    if tf_var is None:
        count = int(np.prod(shape, dtype=np.int64))
        value = np.frombuffer(f.read(count * dtype.itemsize), dtype, count)
        variable.assign(value.reshape(shape))
        return
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    for start in range(0, shape[0], rows):
        stop = min(shape[0], start + rows)
        block = np.frombuffer(f.read((stop - start) * row_bytes), dtype)
        # A scatter writes the rows in place; ``tf_var[a:b].assign`` first
        # reads the slice, which shares the variable's buffer, so every
        # block copied the whole variable before writing into the copy.
        tf.raw_ops.ResourceScatterUpdate(
            resource=tf_var.handle,
            indices=tf.range(start, stop, dtype=tf.int64),
            updates=block.reshape((stop - start,) + shape[1:]))
