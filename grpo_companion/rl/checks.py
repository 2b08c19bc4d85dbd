"""What values a config field accepts, written next to its type.

A field of a config section (:mod:`grpo_companion.rl.train_config`) is a plain
dataclass field whose type carries its check::

    iterations: Annotated[int, Int(1)] = 20
    \"\"\"outer GRPO iterations M\"\"\"

The docstring under the field is its help (tyro shows it in ``train --help``);
the check (:class:`Choice`, :class:`Flag`, :class:`Int`, :class:`Real`, :class:`Reals` or
:class:`Text`) says which values are valid, and :func:`check_fields` applies it
when the section is built, with an error that names the field, its valid range
and the value. A :class:`TRL` marker names the argument of TRL's ``GRPOConfig``
that the field stands for; :func:`trl_table_text` and :func:`trl_table_markdown`
build the name table from those markers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import textwrap
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from grpo_companion.validation import is_real_number as _is_real

__all__ = [
    "TRL",
    "Check",
    "Choice",
    "Flag",
    "Int",
    "Real",
    "Reals",
    "Text",
    "check_fields",
    "checked_fields",
    "merge_preset",
    "option_of",
    "trl_rows",
    "trl_table_markdown",
    "trl_table_text",
]


class Check:
    """What values a field accepts.

    ``optional``: None is accepted too; ``text``: a description that replaces
    the generated one; ``why``: a reason appended to the error message. (A plain
    class, not a dataclass, so that the API pages show a field's type with its
    ``__repr__``.)
    """

    def __init__(self, *, optional: bool = False, text: str = "", why: str = "") -> None:
        self.optional, self.text, self.why = optional, text, why

    def __repr__(self) -> str:
        """The class and the valid values in words (what the API pages show in a field's type)."""
        return f"{type(self).__name__}({self.describe()!r})"

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

    def _describe(self) -> str:
        raise NotImplementedError

    def _accept(self, value: Any) -> tuple[bool, Any]:
        raise NotImplementedError


class Choice(Check):
    """One of a fixed set of values, or of a registry read when the check runs."""

    def __init__(self, *, values: tuple[Any, ...] | Callable[[], Iterable[Any]],
                 **common: Any) -> None:
        super().__init__(**common)
        self.values = values

    def choices(self) -> tuple[Any, ...]:
        return tuple(self.values() if callable(self.values) else self.values)

    def _describe(self) -> str:
        return f"one of {self.choices()}"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        return value in self.choices(), value


class Flag(Check):
    """``True`` or ``False`` (not 0 or 1); on the command line ``--name`` and ``--no-name``."""

    def _describe(self) -> str:
        return "True or False"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        return isinstance(value, bool), value


class Int(Check):
    """An int (not a bool) in ``[low, high]``."""

    def __init__(self, low: int, high: int | None = None, **common: Any) -> None:
        super().__init__(**common)
        self.low, self.high = low, high

    def _describe(self) -> str:
        if self.high is None:
            return f"an int >= {self.low}"
        return f"an int in [{self.low}, {self.high}]"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= self.low
        return ok and (self.high is None or value <= self.high), value


class Real(Check):
    """A number (not NaN, not a bool) in ``[low, high]`` (``(low, high]`` with ``open_low``).

    ``or_zero``: 0 is accepted as well, outside the range (a switch-off value,
    e.g. no KL penalty); ``or_inf``: so is ``inf`` (e.g. no upper bound).
    """

    def __init__(self, low: float = -math.inf, high: float = math.inf, *,
                 open_low: bool = False, finite: bool = False, or_zero: bool = False,
                 or_inf: bool = False, **common: Any) -> None:
        super().__init__(**common)
        self.low, self.high, self.open_low, self.finite = low, high, open_low, finite
        self.or_zero, self.or_inf = or_zero, or_inf

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


_COUNT = {None: "a non-empty sequence of", 2: "two", 3: "three", 4: "four"}


class Reals(Check):
    """A sequence of numbers each accepted by ``item``, of ``length`` (None: any, >= 1); a tuple."""

    def __init__(self, item: Real, length: int | None = None, **common: Any) -> None:
        super().__init__(**common)
        self.item, self.length = item, length

    def _describe(self) -> str:
        return f"{_COUNT.get(self.length, str(self.length))} {self.item._describe(plural=True)}"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        if isinstance(value, str | bytes) or not isinstance(value, Iterable):
            return False, value
        values = tuple(value)
        if not values or (self.length is not None and len(values) != self.length):
            return False, values
        return all(self.item._accept(v)[0] for v in values), values


class Text(Check):
    """A string; what it may say is checked where it is used."""

    def _describe(self) -> str:
        return "a string"

    def _accept(self, value: Any) -> tuple[bool, Any]:
        return isinstance(value, str), value


class TRL:
    """The argument of TRL's ``GRPOConfig`` a field stands for, and how the values map.

    Fields with the same ``name`` form one row of the name table.
    """

    def __init__(self, name: str, note: str = "") -> None:
        self.name, self.note = name, note

    def __repr__(self) -> str:
        return f"TRL({self.name!r})"


@functools.cache
def _markers(cls: type) -> dict[str, tuple[Any, ...]]:
    """The ``Annotated`` metadata of each field of ``cls`` (read once per class)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: getattr(hints[f.name], "__metadata__", ()) for f in dataclasses.fields(cls)}


def _marker(cls: type, name: str, kind: type) -> Any:
    found = [m for m in _markers(cls)[name] if isinstance(m, kind)]
    return found[0] if found else None


def checked_fields(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Check]]:
    """``(field, its check)`` for every field of the section ``cls``; each must have one."""
    for f in dataclasses.fields(cls):
        check = _marker(cls, f.name, Check)
        if check is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no check in its Annotated type")
        yield f, check


def check_fields(section: Any) -> None:
    """Validate every field of ``section`` with its check (and store normalised values)."""
    for f, check in checked_fields(type(section)):
        value = getattr(section, f.name)
        checked = check.validate(f.name, value)
        if checked is not value:
            object.__setattr__(section, f.name, checked)


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


def option_of(name: str) -> str:
    """The command-line option of a field: ``--`` and its name with dashes."""
    return "--" + name.replace("_", "-")


def trl_rows(sections: Iterable[type]) -> list[tuple[str, list[str], str]]:
    """``(TRL name, our field names, note)`` per ``GRPOConfig`` argument, in field order."""
    rows: dict[str, tuple[list[str], list[str]]] = {}
    for cls in sections:
        for f in dataclasses.fields(cls):
            marker = _marker(cls, f.name, TRL)
            if marker is not None:
                ours, notes = rows.setdefault(marker.name, ([], []))
                ours.append(f.name)
                if marker.note:
                    notes.append(marker.note)
    return [(name, ours, " ".join(notes)) for name, (ours, notes) in rows.items()]


def trl_table_text(sections: Iterable[type], width: int = 100) -> str:
    """The TRL name table as plain text (in ``train --help``)."""
    rows = trl_rows(sections)
    left = max(len(name) for name, _, _ in rows) + 2
    lines = ["TRL GRPOConfig argument -> option here (TrainConfig field): how the values map"]
    for name, ours, note in rows:
        target = ", ".join(f"{option_of(f)} ({f})" for f in ours)
        text = f"{target}: {note}" if note else f"{target}: the same meaning"
        lines += textwrap.wrap(text, width, initial_indent=f"  {name:<{left}}",
                               subsequent_indent=" " * (left + 4))
    return "\n".join(lines)


#: Code in a note: ``--option``, ``name=value`` and ``"value"`` (shown as code in Markdown).
_CODE = re.compile(r'--[a-z][a-z-]*(?:=\w+)?|\b\w+=(?:"[^"]*"|[\w.+-]+)|"[^"\s]+"')


def trl_table_markdown(sections: Iterable[type]) -> str:
    """The TRL name table as a Markdown (MyST) table, as in ``api/rl.md``."""
    lines = ["| TRL `GRPOConfig` | `TrainConfig` field | `train` option | How the values map |",
             "| --- | --- | --- | --- |"]
    for name, ours, note in trl_rows(sections):
        fields = ", ".join(f"`{f}`" for f in ours)
        options = ", ".join(f"`{option_of(f)}`" for f in ours)
        note = _CODE.sub(lambda m: f"`{m.group(0)}`", note) if note else "the same meaning"
        lines.append(f"| `{name}` | {fields} | {options} | {note} |")
    return "\n".join(lines)
