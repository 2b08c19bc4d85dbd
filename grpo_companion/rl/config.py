"""Configuration fields declared once; validation, CLI and tables generated from them.

Each field of :class:`~grpo_companion.rl.trainer.TrainConfig` is declared with
:func:`knob`, which keeps these next to its default, in the field's
``metadata``:

- ``help``: one line, shown by ``train --help`` and in the docstring;
- ``check``: a :class:`Check` (:class:`Choice`, :class:`Flag`, :class:`Int`,
  :class:`Real`, :class:`Reals` or :class:`Text`), the values that are valid.
  It validates the value when the config is built, describes the range in
  help and error messages, and reads the value from command-line text;
- ``group``: the section of ``--help`` it is listed in;
- ``options``: its command-line spelling, when that is not ``--field-name``;
- ``trl``: the name of the argument of TRL's ``GRPOConfig`` it stands for, and a note.

The rest of this module turns those declarations into what used to be written
by hand: :func:`check_fields` (the per-field validation),
:func:`add_arguments` and :func:`values_from_args` (the command line),
:func:`trl_table_text` and :func:`trl_table_markdown` (the TRL name table) and
:func:`fields_doc` (the list of fields in the docstring). Checks that involve
several fields stay with the config class. Nothing here knows the fields of
``TrainConfig``; it only reads the metadata.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_companion.validation import is_real_number as _is_real

__all__ = [
    "Check",
    "Choice",
    "Flag",
    "Int",
    "Real",
    "Reals",
    "Text",
    "accepts_preset",
    "add_arguments",
    "check_fields",
    "fields_doc",
    "knob",
    "knobs",
    "merge_preset",
    "option_of",
    "trl_rows",
    "trl_table_markdown",
    "trl_table_text",
    "values_from_args",
]


def _is_int(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


# ------------------------------------------------------------------- the checks
@dataclass(frozen=True, kw_only=True)
class Check:
    """What values a field accepts.

    ``optional``: None is accepted too (and the words in ``none_words`` stand
    for it on the command line); ``text``: a description that replaces the
    generated one; ``why``: a reason appended to the error message.
    """

    optional: bool = False
    none_words: tuple[str, ...] = ("none",)
    text: str = ""
    why: str = ""

    def describe(self) -> str:
        """The valid values in words, e.g. ``"None or an int >= 1"``."""
        text = self.text or self._describe()
        return f"None or {text}" if self.optional else text

    def validate(self, name: str, value: Any) -> Any:
        """The value, normalised (a sequence becomes a tuple); ``ValueError`` if invalid."""
        if value is None and self.optional:
            return None
        accepted, normalised = self._accept(value)
        if not accepted:
            why = f" ({self.why})" if self.why else ""
            raise ValueError(f"{name} must be {self.describe()}{why}, got {value!r}")
        return normalised

    def parse(self, text: str) -> Any:
        """One command-line word as a value (its range is checked by :meth:`Check.validate`)."""
        if self.optional and text.lower() in self.none_words:
            return None
        try:
            return self._parse(text)
        except ValueError:
            words = " or ".join(repr(w) for w in self.none_words) if self.optional else ""
            expected = f"{self._kind()}{' or ' + words if words else ''}"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None

    def from_cli(self, value: Any) -> Any:
        """The parsed command-line value as the field's value."""
        return value

    def cli_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``add_argument`` that read this field."""
        return {"type": self.parse}

    def cli_hint(self) -> str:
        """The valid values, for the option's help (empty where the metavar shows them).

        The help of an optional field says what ``none`` means, so it is not repeated.
        """
        return self.text or self._describe()

    # to be provided by each kind
    def _describe(self) -> str:
        raise NotImplementedError

    def _accept(self, value: Any) -> tuple[bool, Any]:
        raise NotImplementedError

    def _parse(self, text: str) -> Any:
        return text

    def _kind(self) -> str:
        return "a value"


@dataclass(frozen=True, kw_only=True)
class Choice(Check):
    """One of a fixed set of values, or of a registry read when the check runs."""

    values: tuple[Any, ...] | Callable[[], Iterable[Any]]

    def choices(self) -> tuple[Any, ...]:
        return tuple(self.values() if callable(self.values) else self.values)

    def _describe(self) -> str:
        return f"one of {self.choices()}"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        return value in self.choices(), value

    def cli_kwargs(self) -> dict[str, Any]:
        return {"type": self.parse, "metavar": "{" + ",".join(map(str, self.choices())) + "}"}

    def cli_hint(self) -> str:
        return ""

    def _kind(self) -> str:
        return "one of " + ", ".join(map(str, self.choices()))


@dataclass(frozen=True, kw_only=True)
class Flag(Check):
    """``True`` or ``False``; on the command line ``--name`` and ``--no-name``."""

    def _describe(self) -> str:
        return "True or False"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        return isinstance(value, bool), value

    def cli_kwargs(self) -> dict[str, Any]:
        return {"action": argparse.BooleanOptionalAction}

    def cli_hint(self) -> str:
        return ""


@dataclass(frozen=True)
class Int(Check):
    """An int (not a bool) in ``[low, high]``."""

    low: int
    high: int | None = None

    def _describe(self) -> str:
        if self.high is None:
            return f"an int >= {self.low}"
        return f"an int in [{self.low}, {self.high}]"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        return _is_int(value, self.low) and (self.high is None or value <= self.high), value

    def _parse(self, text: str) -> int:
        return int(text)

    def _kind(self) -> str:
        return "an int"


@dataclass(frozen=True)
class Real(Check):
    """A number (not NaN, not a bool) in ``[low, high]`` (``(low, high]`` with ``open_low``).

    ``or_zero``: 0 is accepted as well, outside the range (a switch-off value,
    e.g. no KL penalty); ``or_inf``: so is ``inf`` (e.g. no upper bound).
    """

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    finite: bool = False
    or_zero: bool = False
    or_inf: bool = False

    def _describe(self, plural: bool = False) -> str:
        noun = "numbers" if plural else "a number"
        zero = "0 or " if self.or_zero else ""
        inf = " or inf" if self.or_inf else ""
        if math.isfinite(self.high):
            bracket = "(" if self.open_low else "["
            return f"{zero}{noun} in {bracket}{self.low:g}, {self.high:g}]{inf}"
        if self.finite:
            noun = "finite numbers" if plural else "a finite number"
        return f"{zero}{noun} {'>' if self.open_low else '>='} {self.low:g}{inf}"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        if self.or_zero and _is_real(value, 0.0, 0.0):
            return True, value
        if self.or_inf and _is_real(value, math.inf, math.inf):
            return True, value
        ok = _is_real(value, self.low, self.high, open_low=self.open_low)
        return ok and not (self.finite and math.isinf(value)), value

    def _parse(self, text: str) -> float:
        return float(text)

    def _kind(self) -> str:
        return "a number"


_COUNT = {None: "a non-empty sequence of", 2: "two", 3: "three", 4: "four"}


@dataclass(frozen=True)
class Reals(Check):
    """A sequence of numbers each accepted by ``item``, of ``length`` (None: any, >= 1); a tuple."""

    item: Real
    length: int | None = None

    def _describe(self) -> str:
        return f"{_COUNT.get(self.length, str(self.length))} {self.item._describe(plural=True)}"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            return False, value
        values = tuple(value)
        if not values or (self.length is not None and len(values) != self.length):
            return False, values
        return all(self.item._accept(v)[0] for v in values), values

    def parse(self, text: str) -> Any:
        if self.optional and text.lower() in self.none_words:
            return None
        return self.item.parse(text)

    def from_cli(self, value: Any) -> Any:
        if self.optional and value == [None]:
            return None
        if None in value:
            words = " or ".join(repr(w) for w in self.none_words)
            raise ValueError(f"{words} stands alone, not among numbers")
        return tuple(value)

    def cli_kwargs(self) -> dict[str, Any]:
        return {"type": self.parse, "nargs": self.length or "+"}


@dataclass(frozen=True, kw_only=True)
class Text(Check):
    """A string; what it may say is checked where it is used."""

    def _describe(self) -> str:
        return "a string"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        return isinstance(value, str), value

    def cli_hint(self) -> str:
        return ""


# ------------------------------------------------------------------- the fields
def knob(default: Any, help: str, check: Check, *, group: str,
         options: Sequence[str] = (), metavar: str | tuple[str, ...] | None = None,
         trl: str | tuple[str, str] | None = None) -> Any:
    """A dataclass field carrying its help, check, ``--help`` group, options and TRL name.

    ``trl`` is the name of the corresponding ``GRPOConfig`` argument, or
    ``(name, note)``; fields that share a TRL name form one row of the table.
    """
    if isinstance(trl, str):
        trl = (trl, "")
    metadata = {"help": help, "check": check, "group": group, "options": tuple(options),
                "metavar": metavar, "trl": trl}
    return dataclasses.field(default=default, metadata=metadata)


def knobs(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls``; every one must have been declared with :func:`knob`."""
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if "check" not in f.metadata]
    if missing:
        raise TypeError(f"{cls.__name__} fields without knob(...): {', '.join(missing)}")
    return list(fields)


def check_fields(config: Any) -> None:
    """Validate every field of ``config`` with its own check (and store normalised values)."""
    for f in knobs(type(config)):
        value = getattr(config, f.name)
        checked = f.metadata["check"].validate(f.name, value)
        if checked is not value:
            object.__setattr__(config, f.name, checked)


# --------------------------------------------------------------- presets
def merge_preset(preset: dict[str, Any], passed: dict[str, Any], *, label: str,
                 name_of: Callable[[str], str] = str) -> dict[str, Any]:
    """``passed`` completed by ``preset``; ``ValueError`` naming both where they disagree."""
    clashes = [k for k, v in preset.items() if k in passed and passed[k] != v]
    if clashes:
        sets = ", ".join(f"{name_of(k)}={preset[k]!r}" for k in clashes)
        given = ", ".join(f"{name_of(k)}={passed[k]!r}" for k in clashes)
        raise ValueError(f"{label} sets {sets}, but {given} was given as well; give only one "
                         "of them, or values that agree")
    return {**passed, **preset}


def accepts_preset(keyword: str, expand: Callable[[Any], dict[str, Any]],
                   label: Callable[[Any], str]) -> Callable[[type], type]:
    """Class decorator: ``cls(..., keyword=preset)`` sets the fields that ``expand(preset)`` gives.

    A field passed as well must agree with the preset (see :func:`merge_preset`);
    ``dataclasses.replace`` and copies are unaffected (the preset is not a field).
    """

    def decorate(cls: type) -> type:
        init = cls.__init__
        names = [f.name for f in dataclasses.fields(cls) if f.init]

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            preset = kwargs.pop(keyword, None)
            if preset is not None:
                if len(args) > len(names):
                    raise TypeError(f"{cls.__name__} takes at most {len(names)} positional "
                                    f"arguments, got {len(args)}")
                passed = dict(zip(names, args, strict=False))
                twice = sorted(set(passed) & set(kwargs))
                if twice:
                    raise TypeError(f"{cls.__name__} got multiple values for {twice[0]!r}")
                passed.update(kwargs)
                args, kwargs = (), merge_preset(expand(preset), passed, label=label(preset))
            init(self, *args, **kwargs)

        signature = inspect.signature(init)
        extra = inspect.Parameter(keyword, inspect.Parameter.KEYWORD_ONLY, default=None)
        __init__.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*signature.parameters.values(), extra])
        cls.__init__ = __init__  # type: ignore[misc]
        return cls

    return decorate


# -------------------------------------------------------------- command line
def option_of(f: dataclasses.Field[Any]) -> str:
    """The command-line option of a field: its first ``options`` entry or ``--field-name``."""
    options = f.metadata.get("options") or ()
    return options[0] if options else "--" + f.name.replace("_", "-")


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return " ".join(map(_show, value))
    return str(value)


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> dict[str, Any]:
    """Add one option per field of ``cls`` to ``parser``, in ``--help`` groups.

    Options have no argparse default (``argparse.SUPPRESS``): the parsed
    namespace holds only what was typed, and the dataclass supplies the rest, so
    the defaults are written once. The help of each option is the field's help,
    its valid values and its default. Returns the argument groups by title.
    """
    groups: dict[str, Any] = {}
    for f in knobs(cls):
        meta, check = f.metadata, f.metadata["check"]
        title = meta["group"]
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        hint = check.cli_hint()
        text = f"{meta['help']}{'; ' + hint if hint else ''} (default: {_show(f.default)})"
        kwargs = check.cli_kwargs()
        if meta.get("metavar") is not None:
            kwargs["metavar"] = meta["metavar"]
        options = meta.get("options") or (option_of(f),)
        groups[title].add_argument(*options, dest=f.name, default=argparse.SUPPRESS,
                                   help=text.replace("%", "%%"), **kwargs)
    return groups


def values_from_args(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` given on the command line (parsed by :func:`add_arguments`)."""
    values = {}
    for f in knobs(cls):
        if hasattr(args, f.name):
            try:
                values[f.name] = f.metadata["check"].from_cli(getattr(args, f.name))
            except ValueError as err:
                raise ValueError(f"{option_of(f)}: {err}") from None
    return values


# ---------------------------------------------------------------- TRL names
def trl_rows(cls: type) -> list[tuple[str, list[dataclasses.Field[Any]], str]]:
    """``(TRL name, our fields, note)`` per ``GRPOConfig`` argument, in field order."""
    rows: dict[str, tuple[list[dataclasses.Field[Any]], list[str]]] = {}
    for f in knobs(cls):
        if f.metadata.get("trl"):
            name, note = f.metadata["trl"]
            ours, notes = rows.setdefault(name, ([], []))
            ours.append(f)
            if note:
                notes.append(note)
    return [(name, ours, " ".join(notes)) for name, (ours, notes) in rows.items()]


def trl_table_text(cls: type, width: int = 100) -> str:
    """The TRL name table as plain text (the ``train --help`` epilog)."""
    rows = trl_rows(cls)
    left = max(len(name) for name, _, _ in rows) + 2
    lines = ["TRL GRPOConfig argument -> option here (TrainConfig field): how the values map"]
    for name, ours, note in rows:
        target = ", ".join(f"{option_of(f)} ({f.name})" for f in ours)
        text = f"{target}: {note}" if note else f"{target}: the same meaning"
        lines += textwrap.wrap(text, width, initial_indent=f"  {name:<{left}}",
                               subsequent_indent=" " * (left + 4))
    return "\n".join(lines)


#: Code in a note: ``--option``, ``name=value`` and ``"value"`` (shown as code in Markdown).
_CODE = re.compile(r'--[a-z][a-z-]*(?:=\w+)?|\b\w+=(?:"[^"]*"|[\w.+-]+)|"[^"\s]+"')


def trl_table_markdown(cls: type) -> str:
    """The TRL name table as a Markdown (MyST) table, as in ``api.md``."""
    lines = ["| TRL `GRPOConfig` | `TrainConfig` field | `train` option | How the values map |",
             "| --- | --- | --- | --- |"]
    for name, ours, note in trl_rows(cls):
        fields = ", ".join(f"`{f.name}`" for f in ours)
        options = ", ".join(f"`{option_of(f)}`" for f in ours)
        note = _CODE.sub(lambda m: f"`{m.group(0)}`", note) if note else "the same meaning"
        lines.append(f"| `{name}` | {fields} | {options} | {note} |")
    return "\n".join(lines)


def fields_doc(cls: type, indent: str = "    ") -> str:
    """Docstring text listing every field, grouped: name, default, help and valid values.

    ``indent`` should be that of the docstring it is appended to.
    """
    out: list[str] = []
    group = None
    for f in knobs(cls):
        meta = f.metadata
        if meta["group"] != group:
            group = meta["group"]
            out += ["", f"**{group[0].upper()}{group[1:]}**", ""]
        valid = meta["check"].describe()
        out.append(f"- ``{f.name}`` = ``{f.default!r}``: {meta['help']}; {valid}.")
    return textwrap.indent("\n".join(out), indent)
