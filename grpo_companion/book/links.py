"""Links out of the book and across it.

Three things live here, each small and tested:

* **The repository link of the page header.** The paper's links (arXiv and PMLR) are fixed and
  written in ``_config.yml``; the repository's address is not known to the sources (a fork, a
  clone without a remote, a CI runner). :func:`resolve_repository` reads it at build time from
  ``GRPO_REPOSITORY_URL``, else from GitHub Actions' ``GITHUB_SERVER_URL`` and
  ``GITHUB_REPOSITORY``, else from ``git remote get-url origin``, and
  :func:`with_repository` adds it to the configuration that Sphinx is generated from, with a
  Binder launch button on every chapter. When no address is known the header simply has
  neither button.
* **The paper's links in the page header.** ``_config.yml`` lists them once, as the theme's
  ``icon_links`` (shown under the book's title in the sidebar); :func:`setup` also puts them in a
  drop-down of the article header, which every page shows at every width.
* **Author-year labels for the bibliography.** :class:`AuthorYearLabelStyle` labels an entry
  ``Mroueh 2026`` or ``Shao et al. 2024``; :func:`setup` registers it with pybtex (as the
  formatting style ``BIBLIOGRAPHY_STYLE``) when Sphinx loads this module as an extension.
* **The index of the paper's numbered results.** :func:`paper_index` reads the book's pages
  (their ``{prf:...}`` boxes, whose titles name the paper's numbering, their figure captions and
  their prose) and maps every numbered result of the paper to the boxes, figures and pages that
  restate it; :func:`index_markdown` renders that as a MyST table of cross-references.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle

ARXIV_URL = "https://arxiv.org/abs/2503.06639"
PMLR_URL = "https://proceedings.mlr.press/v306/mroueh26a.html"
REPOSITORY_ENV = "GRPO_REPOSITORY_URL"
BRANCH_ENV = "GRPO_REPOSITORY_BRANCH"
#: Where launch buttons start a chapter: mybinder.org builds ``binder/`` (CPU torch, the
#: book's pins, the package installed from the checkout). Colab is not offered: it opens only
#: ``.ipynb`` files from the repository, and the chapters are MyST Markdown.
BINDER_URL = "https://mybinder.org"
#: Hosts whose repositories sphinx-book-theme can show (it infers the button's icon from them).
REPOSITORY_PROVIDERS = ("github", "gitlab", "bitbucket")
#: The name under which pybtex knows :class:`AuthorYearStyle` (``bibtex_default_style``).
BIBLIOGRAPHY_STYLE = "grpo_author_year"
#: The checkout the book is built from (``pipeline.REPO_ROOT``, found here as there, so that
#: this module, which the pipeline imports, does not import the pipeline back).
_REPO_ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------- repository

_SEGMENT = re.compile(r"[A-Za-z0-9_.~-]+")
_SCP_LIKE = re.compile(r"(?P<user>[^@/:]+@)?(?P<host>[^/:]+):(?P<path>[^/].*)")
_URL = re.compile(r"(?P<scheme>https?|ssh|git)://(?:[^@/]*@)?(?P<host>[^/:?#]+)(?::(?P<port>\d+))?"
                  r"(?P<path>/[^?#]*)?(?P<rest>[?#].*)?")


def normalise_repository_url(url: str, parameter: str = "repository_url") -> str:
    """The https address of a repository given as an https, ssh, git or scp-like (``git@host:
    owner/repo.git``) URL: credentials, a port of ssh, ``.git`` and a final ``/`` are dropped.

    Raises
    ------
    ValueError
        naming ``parameter`` when ``url`` is not a URL of a repository on a GitHub, GitLab or
        Bitbucket host with an ``owner/name`` path (the forms sphinx-book-theme can link).
    """
    text = url.strip() if isinstance(url, str) else ""
    valid = (f"{parameter} must be the address of a repository on a "
             f"{', '.join(REPOSITORY_PROVIDERS)} host, such as https://github.com/owner/name or "
             f"git@github.com:owner/name.git; got {url!r}")
    match = _URL.fullmatch(text)
    if match:
        if match["rest"]:
            raise ValueError(f"{valid} (a query or fragment is not part of a repository address)")
        host, path = match["host"], match["path"] or ""
        port = match["port"] if match["scheme"] in ("http", "https") else None
    else:
        scp = _SCP_LIKE.fullmatch(text)
        if scp is None or "://" in text:
            raise ValueError(valid)
        host, path, port = scp["host"], "/" + scp["path"], None
    path = path.strip("/").removesuffix(".git")
    segments = path.split("/")
    if len(segments) < 2 or not all(_SEGMENT.fullmatch(s) and s not in (".", "..")
                                    for s in segments):
        raise ValueError(f"{valid} (the path must be owner/name)")
    if not any(provider in host.lower() for provider in REPOSITORY_PROVIDERS):
        raise ValueError(valid)
    return f"https://{host.lower()}{f':{port}' if port else ''}/{path}"


def origin_url(root: Path) -> str | None:
    """``git remote get-url origin`` in ``root``, or None (no git, no repository, no origin)."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


@dataclass(frozen=True)
class RepositoryLink:
    """Where the repository is, and where that was read (``url`` None: not known)."""

    url: str | None
    source: str

    def describe(self) -> str:
        """One line for the build log."""
        if self.url:
            return f"repository button: {self.url} (from {self.source})"
        return f"no repository button: {self.source}"


def resolve_repository(environ: Mapping[str, str] | None = None, root: Path | None = None,
                       remote: Callable[[Path], str | None] = origin_url) -> RepositoryLink:
    """The repository to link from the header, from the first source that names one.

    1. ``GRPO_REPOSITORY_URL``;
    2. ``GITHUB_SERVER_URL`` (default ``https://github.com``) and ``GITHUB_REPOSITORY``
       (``owner/name``), which GitHub Actions sets;
    3. ``git remote get-url origin`` in ``root``, normalised to https.

    A malformed address in the environment raises ``ValueError`` (the person who set it wants
    a button); an origin that is not a GitHub, GitLab or Bitbucket repository (a local path, a
    host the theme cannot show) leaves the button out, and the result says why.
    """
    environ = os.environ if environ is None else environ
    given = environ.get(REPOSITORY_ENV, "").strip()
    if given:
        return RepositoryLink(normalise_repository_url(given, REPOSITORY_ENV), REPOSITORY_ENV)
    github = environ.get("GITHUB_REPOSITORY", "").strip()
    if github:
        server = environ.get("GITHUB_SERVER_URL", "").strip() or "https://github.com"
        return RepositoryLink(
            normalise_repository_url(f"{server.rstrip('/')}/{github}",
                                     "GITHUB_SERVER_URL/GITHUB_REPOSITORY"),
            "GITHUB_SERVER_URL/GITHUB_REPOSITORY")
    where = Path.cwd() if root is None else Path(root)
    origin = remote(where)
    if origin is None:
        return RepositoryLink(None, f"neither {REPOSITORY_ENV} nor GITHUB_REPOSITORY is set "
                                    f"and {where} has no git remote 'origin'")
    try:
        return RepositoryLink(normalise_repository_url(origin, "git remote origin"),
                              "git remote origin")
    except ValueError as err:
        return RepositoryLink(None, f"{err}; set {REPOSITORY_ENV} to link one")


def repository_branch(environ: Mapping[str, str] | None = None) -> str:
    """The branch that launch buttons open: ``GRPO_REPOSITORY_BRANCH``, else ``main``.

    The published book is built from ``main`` (``.github/workflows/book.yml``); a fork that
    publishes another branch sets the variable.
    """
    environ = os.environ if environ is None else environ
    branch = environ.get(BRANCH_ENV, "").strip() or "main"
    if not re.fullmatch(r"[A-Za-z0-9._/-]+", branch) or ".." in branch:
        raise ValueError(f"{BRANCH_ENV} must be a git branch name, got {branch!r}")
    return branch


def with_repository(config: Mapping, url: str | None, branch: str = "main") -> dict:
    """A copy of a parsed ``_config.yml`` whose header links the repository at ``url``.

    With an address the header gets the repository button and, on every chapter, a Binder
    launch button (:data:`BINDER_URL`) that opens the chapter's MyST source from ``branch``
    in JupyterLab, where jupytext and jupyterlab-myst (``binder/``) show it as a notebook.
    ``sphinx.config.html_theme_options``, when the book sets it, replaces the theme options
    that Jupyter Book derives from the ``repository:``, ``html:`` and ``launch_buttons:``
    sections, so the settings go there; otherwise into those sections. ``url`` None returns
    an unchanged copy (sphinx-book-theme cannot draw launch buttons without an address).
    """
    out = {key: (dict(value) if isinstance(value, dict) else value)
           for key, value in config.items()}
    if not url:
        return out
    launch = {"binderhub_url": BINDER_URL, "notebook_interface": "jupyterlab"}
    sphinx_config = dict((out.get("sphinx") or {}).get("config") or {})
    if isinstance(sphinx_config.get("html_theme_options"), dict):
        sphinx_config["html_theme_options"] = {**sphinx_config["html_theme_options"],
                                               "repository_url": url,
                                               "repository_branch": branch,
                                               "use_repository_button": True,
                                               "launch_buttons": launch}
        out["sphinx"] = {**out.get("sphinx", {}), "config": sphinx_config}
    else:
        out["repository"] = {**out.get("repository", {}), "url": url, "branch": branch}
        out["html"] = {**out.get("html", {}), "use_repository_button": True}
        out["launch_buttons"] = {**out.get("launch_buttons", {}), **launch}
    return out


# -------------------------------------------------------------------------- bibliography


def _surname(person) -> str:
    return " ".join(part.render_as("text") for part in
                    (*person.rich_prelast_names, *person.rich_last_names))


def author_year_label(entry) -> str:
    """``Mroueh 2026``, ``Vojnovic and Yun 2025`` or ``Shao et al. 2024`` for a pybtex entry."""
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(p) for p in people]
    year = entry.fields.get("year", "n.d.")
    if not names:
        return f"{entry.key} {year}"
    if len(names) == 1:
        return f"{names[0]} {year}"
    if len(names) == 2:
        return f"{names[0]} and {names[1]} {year}"
    return f"{names[0]} et al. {year}"


class AuthorYearLabelStyle(BaseLabelStyle):
    """pybtex labels in author-year form; equal labels get ``a``, ``b``, ... after the year."""

    def format_labels(self, sorted_entries):
        labels = [author_year_label(entry) for entry in sorted_entries]
        seen: dict[str, int] = {}
        for label in labels:
            seen[label] = seen.get(label, 0) + 1
        used: dict[str, int] = {}
        for label in labels:
            if seen[label] == 1:
                yield label
            else:
                used[label] = used.get(label, 0) + 1
                yield f"{label}{chr(ord('a') + used[label] - 1)}"


class AuthorYearStyle(PlainStyle):
    """pybtex's ``plain`` style (sorted by author, year and title) with author-year labels."""

    default_label_style = AuthorYearLabelStyle


def register_bibliography_style() -> None:
    """Make :class:`AuthorYearStyle` known to pybtex as ``BIBLIOGRAPHY_STYLE``."""
    register_plugin("pybtex.style.formatting", BIBLIOGRAPHY_STYLE, AuthorYearStyle, force=True)


def paper_button(icon_links: Iterable[Mapping]) -> dict | None:
    """A sphinx-book-theme header button (a drop-down, like its download and repository
    buttons) holding the theme's ``icon_links``, each with its name as text; None if none."""
    items = [{"type": "link", "url": link["url"], "text": link["name"],
              "tooltip": link["name"], "label": "paper-link"}
             for link in icon_links if link.get("url")]
    if not items:
        return None
    return {"type": "group", "tooltip": "The paper", "icon": "fa-solid fa-file-lines",
            "label": "paper-links", "buttons": items}


def _add_paper_button(app, pagename, templatename, context, doctree) -> None:
    """``html-page-context``: put :func:`paper_button` first among the page header's buttons.

    The theme shows ``icon_links`` only in the primary sidebar, which a phone folds away; its
    header buttons are on every page at every width."""
    from pydata_sphinx_theme.utils import get_theme_options_dict

    buttons = context.get("header_buttons")
    button = paper_button(get_theme_options_dict(app).get("icon_links") or [])
    if buttons is not None and button is not None:
        buttons.insert(0, button)


def launch_source(url: str, pagename: str, root: Path) -> str:
    """A launch button's ``url`` pointed at the chapter's source in the repository.

    Sphinx reads the executed ``<page>.ipynb`` of the staged tree, so sphinx-book-theme's
    Binder link opens ``<page>.ipynb``, a file the repository does not hold: the chapter is
    ``<page>.md`` there (opened as a notebook by jupytext). Any other URL is returned as is.
    """
    suffix = f"/{pagename}.ipynb"
    if url.startswith(BINDER_URL) and url.endswith(suffix) \
            and not (root / f"{pagename}.ipynb").exists() and (root / f"{pagename}.md").exists():
        return url[: -len(".ipynb")] + ".md"
    return url


def _launch_the_sources(app, pagename, templatename, context, doctree) -> None:
    """``html-page-context``: :func:`launch_source` on every header button of the page."""
    def walk(buttons):
        for button in buttons or []:
            if isinstance(button, dict):
                if isinstance(button.get("url"), str):
                    button["url"] = launch_source(button["url"], pagename, _REPO_ROOT)
                walk(button.get("buttons"))

    walk(context.get("header_buttons"))


def setup(app) -> dict:
    """Sphinx extension: register the bibliography style (``bibtex_default_style``), add
    the paper's links to every page header and point the launch buttons at the chapters'
    sources (after sphinx-book-theme made its buttons, which it does at priority 501)."""
    register_bibliography_style()
    app.connect("html-page-context", _add_paper_button, priority=502)
    app.connect("html-page-context", _launch_the_sources, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# --------------------------------------------------------------------------- paper index

#: Every numbered result of the paper (arXiv 2503.06639v4), in the paper's order of kinds.
PAPER_RESULTS: tuple[str, ...] = (
    *(f"Theorem {n}" for n in range(1, 11)),
    "Proposition 1", "Lemma 1", "Lemma 2", "Lemma 3", "Assumption 1", "Remark 1", "Remark 2",
    "Algorithm 1", "Table 1", *(f"Figure {n}" for n in range(1, 6)),
)

#: Results of :data:`PAPER_RESULTS` that no box or figure restates, and why.
NOT_RESTATED: dict[str, str] = {
    "Theorem 5": "not restated in a box: mirror GRPO's monotone climb to 1 is checked on a grid "
                 "of beta and logits in {doc}`/chapters/05_dynamics` (section 'Theorem 5 on a "
                 "grid') and recorded in the {doc}`claims ledger </chapters/claims_ledger>`",
    "Remark 1": "not restated in a box: what is lost with $\\varepsilon = 0$ is computed in "
                "{doc}`/chapters/04_recurrence` and corrected in "
                "{ref}`the errata <errata-item-16>` (its item 16)",
    "Remark 2": "not restated in a box: the bound uniform over prompts is checked in "
                "{doc}`/chapters/05_dynamics` (section 'Uniformly over prompts')",
    "Algorithm 1": "not restated in a box: it is the trainer's loop (sampled mode), described "
                   "in {doc}`/chapters/07_bandit_training` and implemented by "
                   "`grpo_companion.rl`",
}

_KINDS = {"theorem": "Theorem", "proposition": "Proposition", "lemma": "Lemma",
          "corollary": "Corollary", "corollarie": "Corollary", "assumption": "Assumption",
          "remark": "Remark", "algorithm": "Algorithm", "table": "Table", "figure": "Figure",
          "eq": "Eq.", "equation": "Eq."}
_ORDER = ("Theorem", "Proposition", "Lemma", "Corollary", "Assumption", "Remark", "Algorithm",
          "Table", "Figure", "Eq.")
_MENTION = re.compile(
    r"\b(?P<kind>Theorems?|Propositions?|Lemmas?|Corollar(?:y|ies)|Assumptions?|Remarks?"
    r"|Algorithms?|Tables?|Figures?|[Ee]qs?\.|[Ee]quations?)\s*"
    r"(?P<nums>\(?\d+\)?(?:\s*(?:-|–|,|and|or)\s*\(?\d+\)?)*)")
_PAPER_FIGURE = re.compile(r"paper's\s+Figures?\s+(\d+)|Figures?\s+(\d+)\s+of\s+the\s+paper")
_EQUATION = re.compile(r"\b[Ee]qs?\.\s*\(?(\d+)\)?(?:\s*(?:-|–|and)\s*\(?(\d+)\)?)?")
_BOX = re.compile(r"^(?:```|:::)\{prf:(?P<kind>[a-z]+)\}[ \t]*(?P<title>.*)\n"
                  r"(?P<options>(?:[ \t]*:[a-z_-]+:.*\n)*)", re.MULTILINE)
_LABEL = re.compile(r"^[ \t]*:label:[ \t]*(\S+)", re.MULTILINE)
#: "(Theorem 2 of the paper)" in a box's title: the index shows the rest of the title
_PAPER_NUMBERING = re.compile(r"\s*\([^()]*\bof the paper\)")


def paper_mentions(text: str) -> list[str]:
    """The paper's numbered results that ``text`` names, in order: ``"Theorems 1 and 4"`` gives
    ``["Theorem 1", "Theorem 4"]``, ``"eq. 3-4"`` gives ``["Eq. 3", "Eq. 4"]``."""
    out: list[str] = []
    for match in _MENTION.finditer(text):
        word = match["kind"].lower().rstrip(".")
        kind = _KINDS[word[:-1] if word.endswith("s") and word[:-1] in _KINDS else word]
        numbers = [int(n) for n in re.findall(r"\d+", match["nums"])]
        if len(numbers) == 2 and re.search(r"-|–", match["nums"]) and numbers[0] < numbers[1]:
            numbers = list(range(numbers[0], numbers[1] + 1))
        out.extend(f"{kind} {n}" for n in numbers if f"{kind} {n}" not in out)
    return out


@dataclass(frozen=True)
class Target:
    """A place of the book that restates a result: a box, a figure or a page."""

    role: str  # "prf:ref", "numref" or "doc"
    name: str  # the label, or the document
    doc: str  # the page it is on
    title: str = ""  # a box's own title (without the paper's numbering), shown after the link

    def myst(self) -> str:
        """The cross-reference in MyST (for a table cell)."""
        link = f"{{{self.role}}}`{self.name}`"
        return f"{link}: {self.title.replace('|', '&#124;')}" if self.title else link


def _cells(notebook, cell_type: str) -> Iterable:
    return (c for c in notebook.cells if c.cell_type == cell_type)


def _boxes(doc: str, notebook) -> Iterable[tuple[str, Target]]:
    for cell in _cells(notebook, "markdown"):
        for match in _BOX.finditer(cell.source + "\n"):
            label = _LABEL.search(match["options"])
            if label is None:
                continue
            own = _PAPER_NUMBERING.sub("", match["title"]).strip()
            for result in paper_mentions(match["title"]):
                yield result, Target("prf:ref", label.group(1), doc, own)


def _figures(doc: str, notebook) -> Iterable[tuple[str, Target]]:
    for cell in _cells(notebook, "code"):
        figure = cell.metadata.get("mystnb", {}).get("figure", {})
        caption, name = str(figure.get("caption", "")), figure.get("name")
        if not name:
            continue
        for match in _PAPER_FIGURE.finditer(" ".join(caption.split())):
            yield f"Figure {match.group(1) or match.group(2)}", Target("numref", name, doc)


def _equations(doc: str, notebook) -> Iterable[tuple[str, Target]]:
    text = "\n".join(c.source for c in _cells(notebook, "markdown"))
    for match in _EQUATION.finditer(text):
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        for n in range(first, max(first, last) + 1):
            yield f"Eq. {n}", Target("doc", f"/{doc}", doc)


def _sort_key(result: str) -> tuple[int, int]:
    kind, number = result.rsplit(" ", 1)
    return _ORDER.index(kind), int(number)


def paper_index(pages: Mapping[str, object]) -> dict[str, list[Target]]:
    """Map the paper's numbered results to the places of the book that restate them.

    Parameters
    ----------
    pages : document name (``"chapters/03_optimal_policies"``) -> its notebook (a jupytext
        source or an executed notebook, in the book's order).

    Returns
    -------
    dict
        ``"Theorem 8"`` -> the boxes (``{prf:...}`` directives whose title names it), then the
        figures (whose caption says it regenerates the paper's figure), then, for numbered
        equations, the pages whose prose cites them; every entry of :data:`PAPER_RESULTS` is a
        key (with an empty list when nothing restates it), sorted by kind and number.
    """
    found: dict[str, list[Target]] = {result: [] for result in PAPER_RESULTS}
    for doc, notebook in pages.items():
        for result, target in (*_boxes(doc, notebook), *_figures(doc, notebook),
                               *_equations(doc, notebook)):
            targets = found.setdefault(result, [])
            if target not in targets:
                targets.append(target)
    return {result: found[result] for result in sorted(found, key=_sort_key)}


def index_markdown(index: Mapping[str, list[Target]],
                   not_restated: Mapping[str, str] = NOT_RESTATED) -> str:
    """The index as a MyST table: the paper's result, and the book's boxes, figures or pages
    (or why it is not restated, or that this build has no page restating it)."""
    lines = ["| In the paper | In this book |", "| --- | --- |"]
    for result, targets in index.items():
        if targets:
            where = "; ".join(t.myst() for t in targets)
        elif result in not_restated:
            where = not_restated[result]
        else:
            where = "not restated on the pages of this build"
        lines.append(f"| {result} | {where} |")
    return "\n".join(lines) + "\n"
