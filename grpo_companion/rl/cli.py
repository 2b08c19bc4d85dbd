"""``python -m grpo_companion train``: toy GRPO runs from the command line.

The lead CLI calls :func:`add_train_arguments` and :func:`run_train`;
``python -m grpo_companion.rl.cli`` runs the same command on its own.
Everything is validated before the output folder is created; a bad option
or value exits with status 2 and an argparse-style message.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from grpo_companion.rl import config as fields
from grpo_companion.rl.trainer import (
    PreparedRun,
    TrainConfig,
    TrainingFault,
    calibration_fields,
    check_machine,
    prepare_run,
)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the line breaks of the description and of the TRL table in the epilog."""


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--out``, ``--resume``, ``--calibration`` and one option per config field.

    The options are generated (:func:`grpo_companion.rl.config.add_arguments`)
    from the fields of :class:`~grpo_companion.rl.trainer.TrainConfig`: every
    field, with its help, valid values and default. The parser also gets the
    TRL name table as its epilog, and a formatter that keeps its layout.
    """
    from grpo_companion.theory.variants import CALIBRATIONS

    groups = fields.add_arguments(parser, TrainConfig)
    options = {f.name: fields.option_of(f) for f in fields.knobs(TrainConfig)}
    run = groups["run"]
    run.add_argument("--out", type=Path, required=True,
                     help="output folder (must be new or empty unless --resume)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run checkpointed in --out (same options)")
    sets = ", ".join(options[name] for name in calibration_fields(CALIBRATIONS["paper"]))
    groups["objective"].add_argument(
        "--calibration", choices=tuple(CALIBRATIONS), default=argparse.SUPPRESS,
        help=f"a named calibration of theory.CALIBRATIONS; it sets {sets} (any of those given "
             "as well must agree with it)")
    parser.formatter_class = _HelpFormatter
    parser.epilog = fields.trl_table_text(TrainConfig)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Build (and so validate) the configuration from parsed arguments, and check that this
    machine can run it (:func:`~grpo_companion.rl.machine.check_machine`).

    Error messages name the option as typed (``--group-size``, not ``group_size``).
    """
    options = {f.name: fields.option_of(f) for f in fields.knobs(TrainConfig)}
    values = fields.values_from_args(args, TrainConfig)
    name = getattr(args, "calibration", None)
    try:
        if name is not None:
            from grpo_companion.theory.variants import CALIBRATIONS

            values = fields.merge_preset(
                calibration_fields(CALIBRATIONS[name]), values,
                label=f"--calibration {name}", name_of=lambda k: options[k])
        config = TrainConfig(**values)
        check_machine(config)  # the device and the memory, before any folder is made
        return config
    except ValueError as err:
        text = str(err)
        for field_name in sorted(options, key=len, reverse=True):
            if text.startswith(f"{field_name} "):
                text = f"{options[field_name]}{text[len(field_name):]}"
                break
        raise ValueError(text) from None


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C so that run.json records the stop."""


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def stop(signum: int, frame: object) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _error(message: str, kind: str = "error") -> None:
    text = " ".join(str(message).split())  # one line
    print(f"python -m grpo_companion train: {kind}: {text}", file=sys.stderr)


def _how_to_continue(prepared: PreparedRun) -> str:
    """What the next command can do, as it is: resume a checkpoint, or start again."""
    last = prepared.run_state.checkpointed
    if last is None:
        return ("no checkpoint was written yet, so there is nothing to resume; rerun the same "
                "command to start again")
    return f"--resume continues from the checkpoint of iteration {last}"


def run_train(args: argparse.Namespace) -> int:
    """Validate everything, then train; returns the process exit status.

    - 2, nothing written: invalid options, an output folder that cannot be
      used (not empty, or in use by another run: one writer per folder), or
      (``--resume``) a checkpoint that is unreadable, of another configuration
      or made by other code (another normalisation or KL estimator).
    - 1: the run failed midway (it diverged, a solve failed, a file could not
      be written); ``run.json`` says ``"failed"`` with the message.
    - 130 (Ctrl-C) or 143 (SIGTERM): interrupted; ``run.json`` says
      ``"interrupted"``. The message says what the next command can do:
      ``--resume`` continues from the last checkpoint or, stopped before the
      first one, rerunning the same command starts again.
    - 0 after a complete run.

    Each error is one line on stderr, without a traceback. Files are written
    atomically, so a stopped run never leaves a half-written one. A folder
    holding only what a run stopped before its first checkpoint left is
    reused, with or without ``--resume``, after a one-line note.
    """
    try:
        config = config_from_args(args)
        prepared = prepare_run(config, out_dir=args.out, resume=args.resume)
    except ValueError as err:
        _error(str(err))
        return 2
    except OSError as err:  # a file of the folder that cannot be read
        _error(f"cannot use {err.filename or args.out!r}: {err.strerror or err}")
        return 2
    except KeyboardInterrupt:
        _error("interrupted before the run started; nothing was written")
        return 130
    out = prepared.out
    if prepared.notice:
        _error(prepared.notice, "note")
    try:
        with _sigterm_as_interrupt():
            result = prepared.run()
    except KeyboardInterrupt as stop:
        _error(f"{'terminated' if isinstance(stop, _Terminated) else 'interrupted'}; run.json "
               f"in {out} says so; {_how_to_continue(prepared)}")
        return 143 if isinstance(stop, _Terminated) else 130
    except TrainingFault as err:
        _error(f"{err} (recorded in {out / 'run.json' if out else 'no folder'})")
        return 1
    except OSError as err:  # e.g. the disk filled up or became read-only during the run
        where = f" {err.filename!r}" if err.filename else ""
        _error(f"cannot write{where}: {err.strerror or err}; the run stopped; "
               f"{_how_to_continue(prepared)}")
        return 1
    final = result.success_prob[-1]
    print(f"done: {config.iterations} iterations on {result.device}; mean PoS "
          f"{result.success_prob[0].mean():.4f} -> {final.mean():.4f}; results in {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m grpo_companion.rl.cli``."""
    parser = argparse.ArgumentParser(
        prog="python -m grpo_companion.rl.cli", description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(parser)
    return run_train(parser.parse_args(argv))


__all__ = ["add_train_arguments", "config_from_args", "main", "run_train"]

if __name__ == "__main__":
    raise SystemExit(main())
