"""Executed chapters as notebooks any Jupyter renders: the book's download files.

A chapter's Markdown cells are MyST: glued numbers (the ``glue`` text role, with a
format spec), theorem and exercise boxes (``{prf:theorem}``, ``{exercise}``),
cross-references (``{numref}``, ``{ref}``, ``{prf:ref}``) and citations (``{cite:t}``).
Sphinx renders them on the book's pages; a plain notebook viewer shows them as literal
markup. :func:`reader_notebook` rewrites each Markdown cell in CommonMark that Jupyter renders:

- a glued value becomes its text, formatted by myst-nb's own ``format_plain_text`` (so the
  number is the one on the page); ``{glue:md}`` pastes the glued Markdown;
- a box becomes a block quote headed by its kind, number and title; a solution folds into an
  HTML ``<details>`` element;
- a reference becomes what the page shows (``Fig. 8.1``, ``Theorem 2.1``, a section title),
  read from Sphinx's environment after the HTML build;
- a citation becomes ``Mroueh (2026)`` or ``(Mroueh, 2026)``, from ``references.bib``;
- a figure's caption, which the page takes from its cell's metadata, follows the figure as a
  Markdown cell headed "**Fig. 8.1.**".

:func:`export_reader_notebooks` writes these over the ``.ipynb`` files that the book's download
button serves (``_sources/<doc>.ipynb`` in the HTML folder). Code cells and outputs are kept as
executed.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from myst_nb.core.variables import format_plain_text

from grpo_companion.files import atomic_write

GLUE_KEY = "scrapbook"
GLUE_PREFIX = "application/papermill.record/"
#: How Sphinx numbers figures and tables in this book (Sphinx's defaults).
NUMFIG_FORMAT = {"figure": "Fig. {}", "table": "Table {}", "code-block": "Listing {}"}

_ROLE = re.compile(r"\{(?P<role>[a-z][a-z:-]*)\}`(?P<body>[^`]*)`")
_TITLED = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
_FENCE_OPEN = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[a-z][a-z:-]*)\}\s*(?P<arg>.*)$")
_OPTION = re.compile(r"^:(?P<key>[a-z-]+):\s*(?P<value>.*)$")
_EQUATION_LABEL = re.compile(r"\$\$\s*\((?P<label>[^()\s]+)\)")


@dataclass
class References:
    """What a reference shows on the built page, by target label."""

    text: dict[str, str] = field(default_factory=dict)  # label -> "Fig. 8.1", a title, ...
    numbered: dict[str, str] = field(default_factory=dict)  # label -> "Fig. 8.1" (numref)
    documents: dict[str, str] = field(default_factory=dict)  # docname -> its title
    citations: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (names, year)

    def ref(self, target: str) -> str:
        return self.text.get(target, self.numbered.get(target, target))


def glued_values(nb: nbformat.NotebookNode) -> dict[str, dict]:
    """Every ``glue`` output of an executed notebook: name -> its MIME bundle."""
    values: dict[str, dict] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            meta = output.get("metadata", {}).get(GLUE_KEY)
            if not meta:
                continue
            values[meta["name"]] = {k.removeprefix(GLUE_PREFIX): v
                                    for k, v in output.get("data", {}).items()}
    return values


def _glue_text(values: Mapping[str, dict], body: str) -> str:
    name, _, spec = body.partition(":")
    if name not in values or "text/plain" not in values[name]:
        raise KeyError(f"no glued text/plain value named {name!r}")
    return format_plain_text(values[name]["text/plain"], spec)


def _glue_md(values: Mapping[str, dict], body: str) -> str:
    name = body.partition(":")[0]
    bundle = values.get(name, {})
    if "text/markdown" in bundle:
        return bundle["text/markdown"]
    if "text/plain" in bundle:
        return format_plain_text(bundle["text/plain"], "")
    raise KeyError(f"no glued value named {name!r}")


def _citation(refs: References, keys: str, parenthetical: bool) -> str:
    parts = []
    for key in (k.strip() for k in keys.split(",")):
        names, year = refs.citations.get(key, (key, ""))
        parts.append(f"{names}, {year}" if parenthetical else f"{names} ({year})")
    return f"({'; '.join(parts)})" if parenthetical else "; ".join(parts)


def _split_titled(body: str) -> tuple[str | None, str]:
    match = _TITLED.match(body.strip())
    if match:
        return match.group("text"), match.group("target").strip()
    return None, body.strip()


def rewrite_roles(text: str, values: Mapping[str, dict], refs: References) -> str:
    """Replace every MyST role of ``text`` by what the book's page shows."""

    def one(match: re.Match) -> str:
        role, body = match.group("role"), match.group("body")
        if role in ("glue:text", "glue"):
            return _glue_text(values, body)
        if role == "glue:md":
            return rewrite_roles(_glue_md(values, body), values, refs)
        if role in ("cite:t", "cite"):
            return _citation(refs, body, parenthetical=False)
        if role == "cite:p":
            return _citation(refs, body, parenthetical=True)
        title, target = _split_titled(body)
        if role == "numref":
            number = refs.numbered.get(target, target)
            if title is None:
                return number
            digits = number.split(" ", 1)[-1]
            return title.replace("%s", digits).replace("{number}", digits)
        if role in ("ref", "prf:ref", "eq"):
            return title if title is not None else refs.ref(target)
        if role == "doc":
            return title if title is not None else refs.documents.get(
                target.lstrip("/").removesuffix(".md"), target)
        if role in ("func", "py:func", "class", "py:class", "mod", "py:mod", "meth", "attr"):
            return f"`{title or target}`"
        if role == "math":
            return f"${body}$"
        return title or target  # an unknown role: its text, never its markup

    return _ROLE.sub(one, text)


def _quote(lines: list[str]) -> list[str]:
    return [f"> {line}" if line.strip() else ">" for line in lines]


def _box_heading(name: str, arg: str, options: Mapping[str, str], refs: References) -> str:
    kind = name.split(":")[-1].replace("-", " ").capitalize()
    label = options.get("label") or options.get("name")
    shown = refs.text.get(label, "") if label else ""
    number = shown if shown.lower().startswith(kind.lower()) else kind
    return f"**{number}{f' ({arg})' if arg else ''}.**"


def rewrite_directives(text: str, render: Callable[[str], str], refs: References) -> str:
    """Replace fenced MyST directives by CommonMark, innermost first; ``render`` rewrites the
    roles of the text inside."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i].strip())
        if not opened:
            out.append(lines[i])
            i += 1
            continue
        fence, name, arg = opened.group("fence"), opened.group("name"), opened.group("arg")
        close = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if close is None:  # unterminated: leave it as written
            out.append(lines[i])
            i += 1
            continue
        body = lines[i + 1:close]
        options: dict[str, str] = {}
        while body and _OPTION.match(body[0].strip()):
            option = _OPTION.match(body[0].strip())
            options[option.group("key")] = option.group("value").strip()
            body = body[1:]
        inner = rewrite_directives("\n".join(body).strip("\n"), render, refs).split("\n")
        out.extend(_directive(name, arg, options, inner, refs))
        i = close + 1
    return "\n".join(out)


def _directive(name: str, arg: str, options: Mapping[str, str], body: list[str],
               refs: References) -> list[str]:
    if name == "math":
        return ["$$", *body, "$$"]
    if name == "solution":
        target = refs.ref(arg) if arg else "the exercise"
        return ["<details>", f"<summary>Solution to {target}</summary>", "", *body, "",
                "</details>"]
    if name == "bibliography":
        return ["*(The book's bibliography page lists the works cited.)*"]
    if name in ("figure", "image"):
        alt = options.get("alt", arg)
        return [f"![{alt}]({arg})", "", *body]
    if name == "proof" or name == "prf:proof":
        return _quote(["*Proof.*", *body, "∎"])
    heading = _box_heading(name, arg, options, refs)
    return _quote([heading, "", *body])


def reader_markdown(source: str, values: Mapping[str, dict], refs: References) -> str:
    """One Markdown cell of a chapter, in CommonMark (see the module's docstring)."""
    text = _EQUATION_LABEL.sub("$$", source)
    text = re.sub(r"^\([^()\s]+\)=\s*$\n?", "", text, flags=re.MULTILINE)  # (label)= targets
    render = lambda t: rewrite_roles(t, values, refs)  # noqa: E731
    return render(rewrite_directives(text, render, refs))


#: tag of the Markdown cell that carries a figure's caption in a reader notebook
CAPTION_TAG = "figure-caption"


def figure_caption(cell: nbformat.NotebookNode, values: Mapping[str, dict],
                   refs: References) -> str | None:
    """The caption of a figure cell as the page shows it ("**Fig. 1.2.** ..."), in CommonMark;
    None for a cell that draws no captioned figure. On the page the caption comes from the
    cell's ``mystnb.figure`` metadata, which no plain notebook viewer shows."""
    figure = (cell.metadata.get("mystnb") or {}).get("figure") or {}
    if cell.cell_type != "code" or not figure.get("caption"):
        return None
    number = refs.numbered.get(figure.get("name", ""), "Figure")
    return f"**{number}.** {reader_markdown(str(figure['caption']), values, refs)}"


def reader_notebook(nb: nbformat.NotebookNode, refs: References) -> nbformat.NotebookNode:
    """A copy of an executed chapter whose Markdown cells any Jupyter renders, with each
    figure's caption in a Markdown cell (tagged :data:`CAPTION_TAG`) after its figure."""
    copy = nbformat.from_dict(nb)
    values = glued_values(copy)
    cells = []
    for cell in copy.cells:
        if cell.cell_type == "markdown":
            cell.source = reader_markdown(cell.source, values, refs)
        cells.append(cell)
        caption = figure_caption(cell, values, refs)
        if caption is not None:
            cells.append(nbformat.v4.new_markdown_cell(caption,
                                                       metadata={"tags": [CAPTION_TAG]}))
    copy.cells = cells
    return copy


# ------------------------------------------------------------------- the built book


def _author_names(entry) -> str:
    people = entry.persons.get("author", [])
    last = [" ".join(p.last_names).replace("{", "").replace("}", "") for p in people]
    if len(last) == 1:
        return last[0]
    if len(last) == 2:
        return f"{last[0]} and {last[1]}"
    return f"{last[0]} et al."


def read_citations(bibfile: Path) -> dict[str, tuple[str, str]]:
    """Author-year labels of every entry of a BibTeX file: key -> (names, year)."""
    from pybtex.database import parse_file

    data = parse_file(str(bibfile))
    return {key: (_author_names(entry), entry.fields.get("year", "n.d."))
            for key, entry in data.entries.items()}


def read_references(doctrees: Path, bibfile: Path) -> References:
    """What each label shows in the built book, from Sphinx's saved environment."""
    with (doctrees / "environment.pickle").open("rb") as f:
        env = pickle.load(f)
    refs = References(citations=read_citations(bibfile))
    std = env.domaindata.get("std", {})
    for label, (_, _, title) in std.get("labels", {}).items():
        refs.text[label] = title
    numbers = env.toc_fignumbers
    for label, (docname, labelid) in std.get("anonlabels", {}).items():
        for figtype, fmt in NUMFIG_FORMAT.items():
            number = numbers.get(docname, {}).get(figtype, {}).get(labelid)
            if number:
                refs.numbered[label] = fmt.format(".".join(map(str, number)))
                refs.text.setdefault(label, refs.numbered[label])
    for label, (_, number) in env.domaindata.get("math", {}).get("objects", {}).items():
        if number:
            refs.text[label] = f"({number})"
    for label, shown in _proof_labels(env).items():
        refs.text[label] = shown
    for label, entry in getattr(env, "sphinx_exercise_registry", {}).items():
        if entry.get("type") == "exercise":
            number = numbers.get(entry["docname"], {}).get("exercise", {}).get(label)
            refs.text[label] = f"Exercise {'.'.join(map(str, number))}" if number else "Exercise"
    for docname, title in env.titles.items():
        refs.documents[docname] = title.astext()
    return refs


def _proof_labels(env) -> dict[str, str]:
    """sphinx-proof's boxes: label -> what its ``{prf:ref}`` shows ("Theorem 2.1"), from the
    ``proof_list`` sphinx-proof keeps on the environment."""
    shown: dict[str, str] = {}
    for label, entry in getattr(env, "proof_list", {}).items():
        kind = str(entry.get("realtype", "proof")).split(":")[-1].title()
        number = None
        if not entry.get("nonumber"):
            counters = env.toc_fignumbers.get(entry["docname"], {})
            number = counters.get(entry.get("countertype"), {}).get(label)
        shown[label] = f"{kind} {'.'.join(map(str, number))}" if number else kind
    return shown


def export_reader_notebooks(stage: Path, html: Path, doctrees: Path, bibfile: Path,
                            documents: list[str]) -> int:
    """Write the reader notebook of every staged chapter over the one the download button
    serves (``html/_sources/<doc>.ipynb``); returns how many were written."""
    if not (doctrees / "environment.pickle").exists():  # no Sphinx build here (a test's fake)
        return 0
    refs = read_references(doctrees, bibfile)
    written = 0
    for doc in documents:
        executed = stage / f"{doc}.ipynb"
        served = html / "_sources" / f"{doc}.ipynb"
        if not executed.exists() or not served.exists():
            continue
        nb = nbformat.read(executed, as_version=4)
        atomic_write(served, nbformat.writes(reader_notebook(nb, refs)).encode())
        written += 1
    return written
