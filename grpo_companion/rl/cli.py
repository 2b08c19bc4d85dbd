"""``python -m grpo_companion train``: toy GRPO runs from the command line.

The command line is derived from :class:`~grpo_companion.rl.train_config.TrainConfig` by
`tyro <https://brentyi.github.io/tyro/>`_, as CleanRL derives its ``Args``: every field is
an option ``--field-name`` with its docstring as help, its type and its default, grouped
by section. :class:`TrainCommand` adds what only the command has (``--out``,
``--resume``, ``--calibration``). Everything is validated before the output folder is
created; a bad option or value exits with status 2 and a one-line message.
``python -m grpo_companion.rl.cli`` runs the same command on its own.

Why tyro rather than pydantic: the config stays a plain frozen dataclass that the
trainer, the chapters and the tests build directly; tyro reads it as it is (types,
defaults, attribute docstrings), while pydantic would make it a model class with its own
validation rules and no command line of its own.
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from grpo_companion.rl.checks import merge_preset, option_of, trl_table_text
from grpo_companion.rl.train_config import SECTIONS, calibration_fields
from grpo_companion.rl.trainer import (
    PreparedRun,
    TrainConfig,
    TrainingFault,
    check_machine,
    prepare_run,
)
from grpo_companion.theory.variants import CALIBRATIONS

PROG = "python -m grpo_companion train"


@dataclass(frozen=True)
class TrainCommand:
    """Train a toy policy with GRPO; write metrics.csv, iterations.csv, run.json, checkpoint."""

    out: Path
    """output folder (must be new or empty unless --resume)"""
    resume: bool = False
    """continue the run checkpointed in --out (same options)"""
    calibration: Literal[tuple(CALIBRATIONS)] | None = None  # type: ignore[valid-type]
    """a named calibration of theory.CALIBRATIONS; it sets the calibration's fields (any given as well must agree with it)"""  # noqa: E501
    config: TrainConfig = field(default_factory=TrainConfig)
    """the run's configuration (TrainConfig), section by section"""


def _one_line(text: str) -> str:
    """tyro's boxed error as one line: the box, its title and its help hints removed.

    rich draws the box with Unicode lines, or with dashes where the stream looks ASCII-only;
    either way the first line is the title.
    """
    raw = [line for line in text.splitlines() if line.strip()]
    rule = re.compile(r"^[\s\u2500-\u257f-]*$")
    boxed = bool(raw) and ("\u256d" in raw[0] or (len(raw) > 1 and rule.match(raw[1])))
    lines = [re.sub(r"[\u2500-\u257f]", " ", line).strip() for line in raw]
    lines = [line for line in lines[1 if boxed else 0:] if not rule.match(line)]
    text = " ".join(" ".join(lines).split())
    for cut in ("Argument helptext:", "For full helptext", "For full help text"):
        text = text.split(cut)[0].strip()
    text = re.sub(r"^Error parsing ([\w.]+): ", "", text)  # a section: the message names the field
    text = re.sub(r"^Error parsing (--[\w-]+): ", r"\1: ", text)
    words = text.split(" ", 1)
    if len(words) == 2 and words[0] in _FIELD_OPTIONS:  # a check's message: name the option
        text = f"{_FIELD_OPTIONS[words[0]]} {words[1]}"
    return text


_FIELD_OPTIONS = {f: option_of(f) for f in ("task", "exact", *(
    name for cls in SECTIONS.values() for name in cls.__dataclass_fields__))}


def parse_command(argv: list[str], prog: str = PROG) -> TrainCommand:
    """The command of ``argv``, validated: ``ValueError`` with a one-line message if not.

    ``--help`` prints the help and the TRL name table, and exits with status 0. A field
    set by ``--calibration`` and given as well must agree with it.
    """
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            command = tyro.cli(tyro.conf.OmitArgPrefixes[TrainCommand], args=argv, prog=prog,
                               description=TrainCommand.__doc__)
    except SystemExit as stop:
        if stop.code == 0:
            if any(a in ("-h", "--help") for a in argv):
                print("\n" + trl_table_text(SECTIONS.values()))
            raise
        raise ValueError(_one_line(stderr.getvalue()) or "invalid options") from None
    if command.calibration is not None:
        typed = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        config = command.config.to_dict()
        given = {name: config[name] for name in calibration_fields(CALIBRATIONS["paper"])
                 if option_of(name) in typed}
        preset = calibration_fields(CALIBRATIONS[command.calibration])
        merged = merge_preset(preset, given, label=f"--calibration {command.calibration}",
                              name_of=option_of)
        try:
            command = TrainCommand(command.out, command.resume, command.calibration,
                                   command.config.replace(**merged))
        except ValueError as err:
            raise ValueError(_one_line(str(err))) from None
    return command


def config_from_command(command: TrainCommand) -> TrainConfig:
    """The command's configuration, once this machine is known to run it
    (:func:`~grpo_companion.rl.machine.check_machine`); errors name the option."""
    try:
        check_machine(command.config)  # the device and the memory, before any folder is made
    except ValueError as err:
        raise ValueError(_one_line(str(err))) from None
    return command.config


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


def _error(message: str, kind: str = "error", prog: str = PROG) -> None:
    text = " ".join(str(message).split())  # one line
    print(f"{prog}: {kind}: {text}", file=sys.stderr)


def _how_to_continue(prepared: PreparedRun) -> str:
    """What the next command can do, as it is: resume a checkpoint, or start again."""
    last = prepared.run_state.checkpointed
    if last is None:
        return ("no checkpoint was written yet, so there is nothing to resume; rerun the same "
                "command to start again")
    return f"--resume continues from the checkpoint of iteration {last}"


def run_train(argv: list[str], prog: str = PROG) -> int:
    """Parse ``argv``, validate everything, then train; returns the process exit status.

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
        command = parse_command(argv, prog)
        config = config_from_command(command)
        prepared = prepare_run(config, out_dir=command.out, resume=command.resume)
    except ValueError as err:
        _error(str(err), prog=prog)
        return 2
    except OSError as err:  # a file of the folder that cannot be read
        _error(f"cannot use {err.filename or command.out!r}: {err.strerror or err}", prog=prog)
        return 2
    except KeyboardInterrupt:
        _error("interrupted before the run started; nothing was written", prog=prog)
        return 130
    out = prepared.out
    if prepared.notice:
        _error(prepared.notice, "note", prog)
    try:
        with _sigterm_as_interrupt():
            result = prepared.run()
    except KeyboardInterrupt as stop:
        _error(f"{'terminated' if isinstance(stop, _Terminated) else 'interrupted'}; run.json "
               f"in {out} says so; {_how_to_continue(prepared)}", prog=prog)
        return 143 if isinstance(stop, _Terminated) else 130
    except TrainingFault as err:
        _error(f"{err} (recorded in {out / 'run.json' if out else 'no folder'})", prog=prog)
        return 1
    except OSError as err:  # e.g. the disk filled up or became read-only during the run
        where = f" {err.filename!r}" if err.filename else ""
        _error(f"cannot write{where}: {err.strerror or err}; the run stopped; "
               f"{_how_to_continue(prepared)}", prog=prog)
        return 1
    final = result.success_prob[-1]
    print(f"done: {config.run.iterations} iterations on {result.device}; mean PoS "
          f"{result.success_prob[0].mean():.4f} -> {final.mean():.4f}; results in {out}")
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m grpo_companion.rl.cli") -> int:
    """Entry point of ``python -m grpo_companion.rl.cli`` (and of the lead CLI's ``train``)."""
    return run_train(sys.argv[1:] if argv is None else list(argv), prog)


__all__ = ["PROG", "TrainCommand", "config_from_command", "main", "parse_command", "run_train"]

if __name__ == "__main__":
    raise SystemExit(main())
