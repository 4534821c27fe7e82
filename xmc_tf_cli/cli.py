"""The ``xmc-tf`` command (also ``python -m xmc_tf``): train, evaluate,
predict, export.

Usage::

    xmc-tf train --config=NAME|FILE --workdir=DIR \\
        [--config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz] \\
        [--config.KEY=VALUE ...] [--overwrite] [--force] \\
        [--strategy=none|mirrored|multi_worker]
    xmc-tf evaluate --workdir=DIR --data=TEST.txt.gz
    xmc-tf predict --workdir=DIR --data=FILE --output=PRED.txt [--k=5]
    xmc-tf export --workdir=DIR --output=SAVED_MODEL_DIR [--k=5] \\
        [--portable=auto|yes|no]
    xmc-tf train --config=NAME|FILE [--config.KEY=VALUE ...] --print-config
    xmc-tf --help | xmc-tf train --help [--config=NAME|FILE]

``train`` writes ``DIR/model.keras``, ``DIR/saved_model/`` and, last,
``DIR/metrics.json``; with no data flags it trains on the bundled Bibtex
data set.  ``--config`` takes the name of a packaged config
(``uniform_sparse``, ``mach``, ...: :func:`xmc_tf.config.names`; default
``quickstart``) or a config file (``configs/mach.py``).  It holds a lock on ``DIR``, resumes an interrupted run from
``DIR/backup`` and refuses a finished ``DIR`` unless ``--overwrite``
(:mod:`xmc_tf.job.workdir`, :mod:`xmc_tf.job.checkpoint`).  Data specs are
those of :func:`xmc_tf.data.load_dataset` (XC-repo files, ``X.txt|Y.txt``,
``EMB.npy|LABELS.txt``, ``bibtex:test``, ``synthetic:...``).
``export`` writes the model of ``DIR`` as another SavedModel (another
``k`` for ``serve``; ``--portable=yes``: TensorFlow's ops only, so that
it loads without xmc_tf (TF Serving) for every model, uniform-sparse and
MACH included; ``--portable=no``: the faster ``Xmc>`` ops:
:func:`xmc_tf.saving.export_saved_model`).
``--strategy=mirrored`` trains data parallel on this machine's devices,
``--strategy=multi_worker`` on the machines that ``TF_CONFIG`` names (the
same command on each; only the chief, worker 0, writes ``DIR``):
:mod:`xmc_tf.job.cluster`.

Exit status: 0 success; 2 a user error -- bad flags or config, unreadable
data, a busy/finished/incomplete workdir, a corrupt backup, a missing or
stale op library, a missing or malformed ``TF_CONFIG``, a lost worker --
printed as one line ``xmc-tf: error: ...`` naming the
file (and line) where known (``--debug`` adds the traceback); 130
interrupted (Ctrl-C; the line says what was kept); 1 an internal error,
printed with its traceback.

This module and the package it is in (:mod:`xmc_tf_cli`: the schema
:mod:`xmc_tf_cli.schema`, the ``TF_CONFIG`` check
:mod:`xmc_tf_cli.tf_config`) import neither TensorFlow nor the ``xmc_tf``
package, so that ``--help`` and every argument check answer without the
~10 s TensorFlow import.  One table, :data:`COMMANDS`, drives the help,
the argument checks and the dispatch; a command's work is a function of
:mod:`xmc_tf.job.cli`, imported after ``xmc_tf`` (``_import_xmc_tf()``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import re
import sys
import tempfile
import textwrap
import traceback
from typing import Callable

from absl import flags, logging
from ml_collections import config_flags

from xmc_tf_cli import schema, tf_config

__all__ = ["COMMANDS", "Command", "FLAGS", "UsageError", "help_text",
           "load_config", "shown_name", "main", "run"]

PROG = "xmc-tf"
EXIT_OK, EXIT_INTERNAL, EXIT_USER, EXIT_INTERRUPTED = 0, 1, 2, 130

_DEFAULT_CONFIG = schema.config_file(schema.DEFAULT_CONFIG)


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of ``xmc-tf``: everything the help, the argument checks
    and the dispatch know of it.

    Attributes:
      name: the command (``"train"``).
      summary: one line for ``--help``.
      usage: its usage line after ``xmc-tf``.
      flags: the flags it reads (keys of :data:`FLAGS`), listed by its
        ``--help``.
      needs: ``(flag, placeholder)`` pairs that must be given, in the order
        they are checked (``("data", "SPEC")``: "evaluate needs
        --data=SPEC").
      run: ``"module:function"`` doing the work, imported after ``xmc_tf``
        (``_import_xmc_tf()``); called with the parsed flags and the
        config path.
      check: further argument checks ``(flag_values) -> None`` (raise
        :class:`UsageError`), run before TensorFlow is imported; or None.
      interrupted: ``(flag_values) -> str``, what Ctrl-C kept; or None
        ("interrupted").
    """

    name: str
    summary: str
    usage: str
    flags: tuple
    run: str
    needs: tuple = ()
    check: Callable | None = None
    interrupted: Callable | None = None


#: Every flag and its placeholder in help (None: a switch).
FLAGS = {"workdir": "DIR", "config": "FILE", "overwrite": None,
         "force": None, "strategy": "NAME", "print-config": None,
         "data": "SPEC", "output": "PATH", "k": "K", "portable": "WHEN",
         "debug": None}
_HELP_ARGS = ("-h", "--help", "-help", "--helpshort", "--helpfull", "help")


class UsageError(Exception):
    """Bad command line (printed as one line, exit status 2)."""


def _define_flags(argv) -> flags.FlagValues:
    """A fresh FlagValues for ``argv`` (config overrides are registered from
    it), so that :func:`main` can run more than once in a process."""
    fv = flags.FlagValues()
    config_path = _config_arg(argv)
    if config_path and not os.path.exists(config_path) and \
            not os.path.exists(config_path.split(":")[0]):
        raise UsageError(f"--config={config_path}: no such config file")
    try:  # loads the config file and registers the overrides in argv
        config_flags.DEFINE_config_file(
            "config",
            _DEFAULT_CONFIG if os.path.exists(_DEFAULT_CONFIG) else None,
            "train: the experiment config: a packaged config's name ("
            f"{', '.join(schema.names())}) or a config file "
            f"(configs/*.py); its fields are listed by `{PROG} train --help "
            "--config=NAME`; override one with --config.KEY=VALUE.",
            lock_config=True, flag_values=fv, sys_argv=list(argv))
    except (KeyError, AttributeError) as e:  # an override names no field
        raise _unknown_field(e, argv, config_path, always=True) from e
    except UsageError:
        raise
    except flags.Error:
        raise
    except Exception as e:  # the config file's own errors
        raise _config_error(config_path, e) from e
    flags.DEFINE_string("workdir", None, "the run's directory: train writes "
                        "it, evaluate/predict/export read its model.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "train: retrain into a DIR that "
                      "holds a finished run (deletes its results, history "
                      "and backup first).", flag_values=fv)
    flags.DEFINE_bool("force", False, "train: take over a stale lock on DIR "
                      "(one whose owner process is gone, or on another "
                      "host).", flag_values=fv)
    flags.DEFINE_enum("strategy", "none",
                      list(tf_config.STRATEGIES),
                      "train: data-parallel training through tf.distribute: "
                      "'none' (one process, one device), 'mirrored' (the "
                      "GPUs of this machine, or its logical CPUs), "
                      "'multi_worker' (the machines that TF_CONFIG names; run "
                      "the same command on each).", flag_values=fv)
    flags.DEFINE_string("data", None, "evaluate/predict: the data set (XC "
                        "file, 'X.txt|Y.txt', 'EMB.npy|LABELS.txt', "
                        "bibtex:test, synthetic:...).", flag_values=fv)
    flags.DEFINE_string("output", None, "predict: output file (one line per "
                        "instance: 'id:score id:score ...'); export: the "
                        "SavedModel directory (replaced).", flag_values=fv)
    flags.DEFINE_integer("k", 5, "predict/export: labels per instance.",
                         flag_values=fv)
    flags.DEFINE_enum("portable", "auto", ["auto", "yes", "no"],
                      "export: 'auto': TensorFlow's own ops where they "
                      "are as fast and every xmc_tf op has one (models "
                      "without uniform-sparse or MACH layers), else the "
                      "xmc_tf ops; 'yes': TensorFlow's ops only, for "
                      "every model (loads without xmc_tf, e.g. in TF "
                      "Serving; uniform-sparse and MACH serve slower); "
                      "'no': the xmc_tf ops (fastest on the CPU; load "
                      "after `import xmc_tf`).",
                      flag_values=fv)
    flags.DEFINE_bool("print-config", False, "train: read the training data, "
                      "print the config with every automatic field resolved "
                      "(JSON) and exit without training.", flag_values=fv)
    flags.DEFINE_bool("debug", False, "print the Python traceback of errors.",
                      flag_values=fv)
    return fv


# ---------------------------------------------------------------------------
# Help (no TensorFlow).


def _config_arg(argv) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--config="):
            return a.split("=", 1)[1]
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
    return _DEFAULT_CONFIG if os.path.exists(_DEFAULT_CONFIG) else None


def _with_config_file(argv) -> list:
    """``argv`` with a packaged config's name (``--config=mach``) replaced by
    its file, which is what ml_collections' config flag loads.

    Raises:
      UsageError: a ``--config`` value that is neither a file nor a
        packaged name (the message lists the names).
    """
    out = list(argv)
    for i, a in enumerate(out):
        value = (a.split("=", 1)[1] if a.startswith("--config=") else
                 out[i + 1] if a == "--config" and i + 1 < len(out) else None)
        if value is None:
            continue
        try:
            path = schema.config_file(value)
        except ValueError as e:
            raise UsageError(f"--config={value}: {e}") from e
        if a == "--config":
            out[i + 1] = path
        else:
            out[i] = f"--config={path}"
    return out


def _command_of(argv) -> str | None:
    for a in argv[1:]:
        if not a.startswith("-") and a != "help":
            return a
    return None


def _flag_lines(fv, command=None) -> list:
    lines = []
    shown = COMMANDS[command].flags if command is not None else None
    for name, meta in FLAGS.items():
        if shown is not None and name not in shown:
            continue
        flag = fv[name]
        left = f"--{name}={meta}" if meta else f"--{name}"
        default = ""
        if name == "config":
            default = f" (default: {schema.DEFAULT_CONFIG})"
        elif flag.default not in (None, False):
            default = f" (default: {flag.default})"
        lines.extend(textwrap.wrap(f"{flag.help}{default}", 79,
                                   initial_indent=f"  {left:<17}",
                                   subsequent_indent=" " * 19))
    return lines


def _config_lines(config) -> list:
    def walk(d, prefix=""):
        for key in sorted(d.keys()):
            value = d[key]
            if hasattr(value, "keys") and not isinstance(value, str):
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"  --config.{prefix}{key}={value!r}"
    return list(walk(config))


def help_text(argv) -> str:
    """The text of ``xmc-tf [COMMAND] --help`` (loads only the config file).

    Raises:
      UsageError: an unknown command, or a config file that cannot be
        loaded.
    """
    command = _command_of(argv)
    argv = [a for a in argv if a not in _HELP_ARGS]
    fv = _define_flags(argv)
    if command is None:
        width = max(map(len, COMMANDS))
        return "\n".join(
            [f"usage: {PROG} COMMAND --workdir=DIR [flags]",
             "",
             "Extreme multi-label classification with TensorFlow (xmc_tf).",
             "",
             "commands:"] +
            [line for c in COMMANDS.values() for line in textwrap.wrap(
                c.summary, 79, initial_indent=f"  {c.name:<{width}}  ",
                subsequent_indent=" " * (width + 4))] +
            ["", "flags:"] + _flag_lines(fv) +
            [""] + textwrap.wrap(
                f"`{PROG} COMMAND --help` lists a command's flags; `{PROG} "
                "train --help [--config=NAME|FILE]` also lists the config fields.",
                79) + textwrap.wrap(
                "Exit status: 0 ok; 2 user error (one line 'xmc-tf: error: "
                "...'); 130 interrupted (Ctrl-C); 1 internal error "
                "(traceback).", 79))
    if command not in COMMANDS:
        raise UsageError(f"unknown command {command!r}; expected one of "
                         f"{', '.join(COMMANDS)} (see {PROG} --help)")
    usage, summary = COMMANDS[command].usage, COMMANDS[command].summary
    lines = ([f"usage: {PROG} {usage}", ""] +
             textwrap.wrap(summary[0].upper() + summary[1:] + ".", 79) + ["", "flags:"] +
             _flag_lines(fv, command))
    if command == "train":
        path = _config_arg(argv)
        _parse(fv, argv, path)
        config = load_config(fv, path)
        shown = shown_name(path)
        shown = f"{shown} ({path})" if shown != path else path
        lines += ["", f"config fields of {shown} (with the overrides given; "
                      "set with --config.KEY=VALUE):"] + _config_lines(config)
        lines += [""] + textwrap.wrap(
            "A killed or interrupted run resumes from DIR/backup when the "
            "same command is rerun; a finished DIR is refused unless "
            "--overwrite; one run per DIR at a time (DIR/.lock).", 79)
        lines += [""] + textwrap.wrap(
            "Several machines: run the same command on each with "
            "--strategy=multi_worker and TF_CONFIG naming every worker and "
            "this one's index, e.g. "
            f"TF_CONFIG='{tf_config.TF_CONFIG_EXAMPLE}'; "
            "only worker 0 (the chief) writes DIR.", 79)
    return "\n".join(lines)


def _config_error(path, e) -> UsageError:
    """One line for a config file that fails to load (file:line if known)."""
    if isinstance(e, SyntaxError):
        return UsageError(f"{e.filename}:{e.lineno}: {e.msg}")
    where = path
    tb = e.__traceback__
    while tb is not None:
        if path and os.path.abspath(tb.tb_frame.f_code.co_filename) == \
                os.path.abspath(path.split(":")[0]):
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    msg = " ".join(str(e).split())
    if isinstance(e, OSError) and "No such file" in msg:
        msg = "no such config file"
    return UsageError(f"--config={where}: {type(e).__name__}: {msg}"
                      if not msg.startswith("no such") else f"{where}: {msg}")


def shown_name(config_path) -> str:
    """How messages name a config file: a packaged one by its name
    (``"mach"``), any other by its path."""
    module = schema
    name = os.path.splitext(os.path.basename(config_path or ""))[0]
    if name in module.names() and config_path == module.config_file(name):
        return name
    return str(config_path)


def _unknown_field(e, argv, config_path, always=False) -> UsageError:
    """One line for an override ``--config.A.B=V`` naming no field of the
    (locked) config, from ml_collections' KeyError / AttributeError ``e``;
    unless ``always``, an error that names no ``--config.`` argument is
    the config file's own (:func:`_config_error`)."""
    text = str(e.args[0] if e.args else e)
    key = re.search(r"([A-Za-z_][A-Za-z0-9_]*)", text)
    key = key.group(1) if key else text
    hint = re.search(r'Did you mean "([^"]+)"', text)
    hint = f" (did you mean {hint.group(1)!r}?)" if hint else ""
    bad = [a.split("=")[0] for a in argv if a.startswith("--config.")
           and key in a.split("=")[0].split(".")]
    if not bad and not always:
        return _config_error(config_path, e)
    return UsageError(
        f"{bad[0] if bad else '--config.' + key}: {shown_name(config_path)} has "
        f"no config field {key!r}{hint}; the fields: {PROG} train --help "
        f"--config={shown_name(config_path)}")


def _parse(fv, argv, config_path) -> list:
    """Parses ``argv`` into ``fv``; returns the positional arguments.

    Raises:
      UsageError: a missing or failing config file (file:line).
      absl.flags.Error: an unknown flag or config field, a bad value.
    """
    try:
        return fv(argv)
    except flags.Error:
        raise
    except (KeyError, AttributeError) as e:  # e.g. --config.model.dropuot
        raise _unknown_field(e, argv, config_path) from e
    except Exception as e:  # the config file failed while parsing
        raise _config_error(config_path, e) from e


def load_config(fv, path):
    """The config that ``fv``'s ``--config`` flag loaded from ``path``.

    Raises:
      UsageError: no config, no such file, or the file's own error
        (one line, file:line where known).
    """
    if not path:
        raise UsageError("train needs --config=NAME or FILE (e.g. "
                         "uniform_sparse)")
    if path and not os.path.exists(path) and not os.path.exists(
            path.split(":")[0]):
        raise UsageError(f"--config={path}: no such config file")
    try:
        return fv.config
    except Exception as e:  # the config file's own errors
        raise _config_error(path, e) from e



# ---------------------------------------------------------------------------
# TensorFlow's import.


#: absl's line before its C++ logging is initialised (printed by TensorFlow's
#: import on some CPUs, e.g. with oneDNN's start-up INFO line).
_ABSL_PREAMBLE = ("WARNING: All log messages before absl::InitializeLog() is "
                  "called are written to STDERR")


def _startup_noise(line: str, min_level: int) -> bool:
    """Whether ``line`` (one line that TensorFlow's C++ code wrote to stderr
    while it was imported) is below ``TF_CPP_MIN_LOG_LEVEL`` ``min_level``
    (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL): absl's ``I0000 ...`` lines and its
    preamble from 1 on, ``W....`` lines from 2, ``E....`` lines from 3."""
    if min_level >= 1 and line.strip() == _ABSL_PREAMBLE:
        return True
    return bool(re.match(r"[IWE]\d{4} ", line)) and (
        "IWE".index(line[0]) < min_level)


@contextlib.contextmanager
def _quiet_tf_startup():
    """Drops TensorFlow's C++ start-up log lines below ``TF_CPP_MIN_LOG_LEVEL``.

    TensorFlow 2.21 prints some lines (oneDNN's "custom operations are on",
    absl's preamble) before its log level is read, so the variable alone
    does not quiet them.  File descriptor 2 goes to a temporary file for
    the ``with`` block; the lines that :func:`_startup_noise` does not drop
    are written back to stderr afterwards, also when the block raises.
    """
    try:
        min_level = int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        min_level = 0
    if min_level < 1:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode("utf-8", "replace")
            kept = [l for l in text.splitlines(keepends=True)
                    if not _startup_noise(l, min_level)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _import_xmc_tf():
    """Imports xmc_tf and loads the op library, raising its error (one line)
    instead of the import-time warning; TensorFlow's start-up log lines are
    quieted (:func:`_quiet_tf_startup`)."""
    import warnings
    with warnings.catch_warnings(), _quiet_tf_startup():
        warnings.simplefilter("ignore")
        try:
            import xmc_tf  # noqa: F401
        except ModuleNotFoundError as e:  # installed without its TF extra
            if e.name != "tensorflow":
                raise
            raise UsageError(str(e)) from e
        from xmc_tf.ops import _loader
        _loader.load()



# ---------------------------------------------------------------------------
# The commands.


def _check_train(fv) -> None:
    if not fv.workdir and not fv["print-config"].value:
        raise UsageError("train needs --workdir=DIR")
    if fv.strategy == "multi_worker":
        try:  # before the ~10 s TensorFlow import
            tf_config.parse_tf_config(os.environ.get("TF_CONFIG"))
        except ValueError as e:
            raise UsageError(f"--strategy=multi_worker: {e}") from e
    elif os.environ.get("TF_CONFIG"):
        logging.warning("TF_CONFIG is set but --strategy=%s: this process "
                        "trains on its own (pass --strategy=multi_worker to "
                        "train with the workers it names)", fv.strategy)


def _train_interrupted(fv) -> str:
    workdir = getattr(fv, "workdir", None)
    if not workdir:
        return "interrupted"
    if fv.strategy == "multi_worker":
        return ("interrupted; rerun the same command on every worker to "
                "resume from the chief's backup (--workdir on worker 0)")
    backup = os.path.join(workdir, "backup")
    if os.path.exists(os.path.join(backup, "checkpoint.npz")):
        return (f"interrupted; the backup in {backup} resumes the run: "
                "rerun the same command")
    return ("interrupted before the first epoch ended; nothing was kept "
            "to resume from")


def _output_interrupted(fv) -> str:
    if fv.output:
        return f"interrupted; {fv.output} was not written"
    return "interrupted"


#: The commands, in help order.
COMMANDS = {c.name: c for c in (
    Command("train",
            "train a model on config.data.train, evaluate it on "
            "config.data.test and export it to DIR (model.keras, "
            "saved_model/, metrics.json); resumes an interrupted run",
            "train [--config=NAME|FILE] --workdir=DIR "
            "[--config.KEY=VALUE ...] [--overwrite] [--force] "
            "[--strategy=none|mirrored|multi_worker]",
            ("workdir", "config", "overwrite", "force", "strategy",
             "print-config", "debug"),
            "xmc_tf.job.cli:train", check=_check_train,
            interrupted=_train_interrupted),
    Command("evaluate",
            "P@k, nDCG@k, PSP@k and R@k of the model in DIR on --data",
            "evaluate --workdir=DIR --data=SPEC",
            ("workdir", "data", "debug"), "xmc_tf.job.cli:evaluate",
            needs=(("workdir", "DIR"), ("data", "SPEC"))),
    Command("predict",
            "top-k labels of every instance of --data, written to "
            "--output ('id:score id:score ...' per line)",
            "predict --workdir=DIR --data=SPEC --output=FILE [--k=K]",
            ("workdir", "data", "output", "k", "debug"),
            "xmc_tf.job.cli:predict",
            needs=(("workdir", "DIR"), ("data", "SPEC"), ("output", "FILE")),
            interrupted=_output_interrupted),
    Command("export",
            "write the model of DIR as a SavedModel to --output (serve: "
            "top --k labels; --portable: TensorFlow's own ops or the "
            "xmc_tf ops)",
            "export --workdir=DIR --output=DIR [--k=K] "
            "[--portable=auto|yes|no]",
            ("workdir", "output", "k", "portable", "debug"),
            "xmc_tf.job.cli:export",
            needs=(("workdir", "DIR"), ("output", "DIR")),
            interrupted=_output_interrupted),
)}


def _interrupted(command, fv) -> str:
    spec = COMMANDS.get(command)
    if spec is None or spec.interrupted is None or fv is None:
        return "interrupted"
    return spec.interrupted(fv)


def _check_args(fv, rest) -> str:
    if len(rest) < 2:
        raise UsageError(f"no command; usage: {PROG} "
                         f"{{{'|'.join(COMMANDS)}}} --workdir=DIR [flags] "
                         f"(see {PROG} --help)")
    command = rest[1]
    if command not in COMMANDS:
        raise UsageError(f"unknown command {command!r}; usage: {PROG} "
                         f"{{{'|'.join(COMMANDS)}}} --workdir=DIR [flags] "
                         f"(see {PROG} --help)")
    if len(rest) > 2:
        raise UsageError(f"unexpected arguments {rest[2:]} (flags are "
                         "--name=value)")
    spec = COMMANDS[command]
    for flag, placeholder in spec.needs:
        if not fv[flag].value:
            raise UsageError(f"{command} needs --{flag}={placeholder}")
    if spec.check is not None:
        spec.check(fv)
    return command


def _dispatch(command: str, fv, config_path) -> None:
    """Imports xmc_tf (``_import_xmc_tf()``), then runs the command's
    function (:attr:`Command.run`)."""
    _import_xmc_tf()
    module, function = COMMANDS[command].run.split(":")
    getattr(importlib.import_module(module), function)(fv, config_path)


# ---------------------------------------------------------------------------
# Errors.


def _is_user_error(e: BaseException) -> bool:
    if isinstance(e, (UsageError, flags.Error, OSError)):
        return True
    errors = sys.modules.get("xmc_tf.errors")  # imported with xmc_tf
    return errors is not None and isinstance(
        e, (errors.UserError, errors.OpLibraryError))


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror}"
    if isinstance(e, flags.UnrecognizedFlagError) and \
            str(e.flagname).startswith("config."):
        return (f"unknown config field --{e.flagname} (the fields: {PROG} "
                "train --help [--config=NAME|FILE])")
    text = " ".join(str(e).split())
    return text or type(e).__name__


def main(argv=None) -> int:
    """Runs the command line ``argv`` (default ``sys.argv``); returns the
    exit status (see the module docstring) instead of exiting.

    Internal errors (bugs) are re-raised, so their traceback is printed.
    """
    argv = list(sys.argv if argv is None else argv)
    debug = any(a in ("--debug", "--debug=true", "--debug=True", "--debug=1")
                for a in argv)
    command, fv = None, None
    try:
        argv = _with_config_file(argv)
        if any(a in _HELP_ARGS for a in argv[1:]) or len(argv) == 1:
            print(help_text(argv))
            return EXIT_OK if len(argv) > 1 else EXIT_USER
        fv = _define_flags(argv)
        config_path = _config_arg(argv)
        command = _check_args(fv, _parse(fv, argv, config_path))
        if not flags.FLAGS.is_parsed():  # absl logging reads these
            flags.FLAGS.mark_as_parsed()
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        logging.set_verbosity(logging.INFO)
        _dispatch(command, fv, config_path)
        return EXIT_OK
    except KeyboardInterrupt:
        print(f"{PROG}: {_interrupted(command, fv)}", file=sys.stderr)
        if debug:
            traceback.print_exc()
        return EXIT_INTERRUPTED
    except Exception as e:  # pylint: disable=broad-except
        if not _is_user_error(e):
            raise
        if debug:
            traceback.print_exc()
        print(f"{PROG}: error: {_message(e)}", file=sys.stderr)
        return EXIT_USER


def run():
    """Entry point of ``python -m xmc_tf``: exits with :func:`main`'s
    status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
