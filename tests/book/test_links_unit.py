"""Unit tests of grpo_companion.book.links (repository address, bibliography labels, paper
index) and of the ledger's link rendering in grpo_companion.book.claims."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import jupytext
import nbformat
import pytest
from pybtex.database import Entry, Person, parse_file
from pybtex.plugin import find_plugin

from grpo_companion.book import claims, links
from grpo_companion.book.pipeline import REPO_ROOT, source_path, toc_documents, write_sphinx_config

PAPER_TEXT = Path(os.environ.get("GRPO_PAPER_TEXT", REPO_ROOT.parent / "shared" / "paper"
                                  / "mroueh-2503.06639v4.txt"))

# ---------------------------------------------------------------------------- repository


@pytest.mark.parametrize("given, expected", [
    ("https://github.com/owner/name", "https://github.com/owner/name"),
    ("https://github.com/owner/name.git", "https://github.com/owner/name"),
    ("https://github.com/owner/name/", "https://github.com/owner/name"),
    ("  https://GitHub.com/owner/name  ", "https://github.com/owner/name"),
    ("http://github.com/owner/name", "https://github.com/owner/name"),
    ("https://user:token@github.com/owner/name.git", "https://github.com/owner/name"),
    ("git@github.com:owner/name.git", "https://github.com/owner/name"),
    ("ssh://git@gitlab.com:2222/group/sub/name.git", "https://gitlab.com/group/sub/name"),
    ("git://bitbucket.org/owner/name", "https://bitbucket.org/owner/name"),
    ("https://github.example.com:8443/owner/name", "https://github.example.com:8443/owner/name"),
])
def test_repository_urls_normalise_to_https(given, expected):
    assert links.normalise_repository_url(given) == expected


@pytest.mark.parametrize("given", [
    "", "not a url", "https://github.com/owner-only", "https://github.com/",
    "ftp://github.com/owner/name", "file:///home/me/name.git", "/home/me/name.git",
    "https://example.org/owner/name", "https://github.com/owner/name?tab=readme",
    "https://github.com/owner/name#readme", "https://github.com/owner/../name",
    "https://github.com/own er/name", "git@github.com:/owner/name.git",
])
def test_malformed_repository_urls_are_refused_naming_the_parameter(given):
    with pytest.raises(ValueError, match=r"GRPO_REPOSITORY_URL must be the address of a "
                                         r"repository on a github, gitlab, bitbucket host"):
        links.normalise_repository_url(given, links.REPOSITORY_ENV)


def _no_remote(root):
    return None


def test_the_explicit_address_comes_first():
    env = {"GRPO_REPOSITORY_URL": "git@github.com:a/book.git",
           "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "b/book"}
    link = links.resolve_repository(env, remote=lambda root: "https://github.com/c/book")
    assert (link.url, link.source) == ("https://github.com/a/book", "GRPO_REPOSITORY_URL")
    assert link.describe() == ("repository button: https://github.com/a/book "
                               "(from GRPO_REPOSITORY_URL)")


def test_github_actions_variables_come_next():
    env = {"GITHUB_SERVER_URL": "https://github.example.com", "GITHUB_REPOSITORY": "b/book"}
    link = links.resolve_repository(env, remote=lambda root: "https://github.com/c/book")
    assert link.url == "https://github.example.com/b/book"
    assert link.source == "GITHUB_SERVER_URL/GITHUB_REPOSITORY"
    # without the server variable, github.com
    assert links.resolve_repository({"GITHUB_REPOSITORY": "b/book"},
                                    remote=_no_remote).url == "https://github.com/b/book"


def test_the_git_remote_comes_last_normalised(tmp_path):
    seen = []

    def remote(root):
        seen.append(root)
        return "git@gitlab.com:c/book.git"

    link = links.resolve_repository({}, root=tmp_path, remote=remote)
    assert (link.url, link.source) == ("https://gitlab.com/c/book", "git remote origin")
    assert seen == [tmp_path]


def test_no_address_leaves_the_button_out_and_says_why(tmp_path):
    link = links.resolve_repository({"GRPO_REPOSITORY_URL": "  "}, root=tmp_path,
                                    remote=_no_remote)
    assert link.url is None
    line = link.describe()
    assert line.startswith("no repository button: ") and "\n" not in line
    assert "GRPO_REPOSITORY_URL" in line and str(tmp_path) in line


def test_an_origin_the_theme_cannot_link_leaves_the_button_out(tmp_path):
    link = links.resolve_repository({}, root=tmp_path, remote=lambda root: "/srv/git/book.git")
    assert link.url is None and "git remote origin must be" in link.describe()


def test_a_malformed_address_in_the_environment_is_refused():
    with pytest.raises(ValueError, match="GRPO_REPOSITORY_URL must be"):
        links.resolve_repository({"GRPO_REPOSITORY_URL": "github.com/a"}, remote=_no_remote)
    with pytest.raises(ValueError, match="GITHUB_SERVER_URL/GITHUB_REPOSITORY must be"):
        links.resolve_repository({"GITHUB_REPOSITORY": "just-a-name"}, remote=_no_remote)


def test_origin_url_reads_git(tmp_path):
    assert links.origin_url(tmp_path) is None  # not a repository
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert links.origin_url(tmp_path) is None  # no origin
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin",
                    "git@github.com:c/book.git"], check=True)
    assert links.origin_url(tmp_path) == "git@github.com:c/book.git"


def test_with_repository_sets_the_theme_options_or_the_jupyter_book_sections():
    config = {"title": "t", "sphinx": {"config": {"html_theme_options": {"icon_links": []}}}}
    out = links.with_repository(config, "https://github.com/a/book")
    launch = {"binderhub_url": "https://mybinder.org", "notebook_interface": "jupyterlab"}
    assert out["sphinx"]["config"]["html_theme_options"] == {
        "icon_links": [], "repository_url": "https://github.com/a/book",
        "repository_branch": "main", "use_repository_button": True, "launch_buttons": launch}
    assert "repository_url" not in config["sphinx"]["config"]["html_theme_options"]
    plain = links.with_repository({"html": {"use_download_button": True}},
                                  "https://github.com/a/book", "dev")
    assert plain["repository"] == {"url": "https://github.com/a/book", "branch": "dev"}
    assert plain["html"] == {"use_download_button": True, "use_repository_button": True}
    assert plain["launch_buttons"] == launch
    assert links.with_repository(config, None) == config


def test_repository_branch_defaults_to_main_and_refuses_a_bad_name():
    assert links.repository_branch({}) == "main"
    assert links.repository_branch({"GRPO_REPOSITORY_BRANCH": " gh-pages "}) == "gh-pages"
    for bad in ("a b", "../x", "x;rm"):
        with pytest.raises(ValueError, match="GRPO_REPOSITORY_BRANCH must be a git branch"):
            links.repository_branch({"GRPO_REPOSITORY_BRANCH": bad})


@pytest.mark.parametrize("url", [None, "https://github.com/a/book"])
def test_write_sphinx_config_adds_the_button_only_with_an_address(tmp_path, monkeypatch, url):
    for name in ("GRPO_REPOSITORY_URL", "GITHUB_REPOSITORY", "GITHUB_SERVER_URL",
                 "GRPO_REPOSITORY_BRANCH"):
        monkeypatch.delenv(name, raising=False)
    if url:
        monkeypatch.setenv("GRPO_REPOSITORY_URL", url)
    for name in ("_config.yml", "_toc.yml"):
        (tmp_path / name).write_bytes((REPO_ROOT / name).read_bytes())
    lines: list[str] = []
    write_sphinx_config(tmp_path, log=lines.append, root=tmp_path)
    options = _theme_options(tmp_path / "conf.py")
    assert len(lines) == 1
    if url:
        assert options["repository_url"] == url and options["use_repository_button"] is True
        assert options["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
        assert options["repository_branch"] == "main"
        assert "repository button: https://github.com/a/book" in lines[0]
    else:
        assert "repository_url" not in options and not options.get("use_repository_button")
        assert "launch_buttons" not in options
        assert lines[0].strip().startswith("no repository button")
    # the paper's links are there either way
    assert {link["url"] for link in options["icon_links"]} == {links.ARXIV_URL, links.PMLR_URL}


def _theme_options(conf: Path) -> dict:
    import ast

    for node in ast.parse(conf.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == \
                "html_theme_options":
            return ast.literal_eval(node.value)
    raise AssertionError(f"{conf} sets no html_theme_options")


# -------------------------------------------------------------------------- bibliography


def _entry(*authors: str, year: str = "2024") -> Entry:
    return Entry("article", fields={"title": "T", "year": year},
                 persons={"author": [Person(a) for a in authors]})


def test_author_year_labels():
    assert links.author_year_label(_entry("Mroueh, Youssef", year="2026")) == "Mroueh 2026"
    assert links.author_year_label(_entry("Vojnovic, Milan", "Yun, Se-Young")) == \
        "Vojnovic and Yun 2024"
    assert links.author_year_label(_entry("Shao, Z.", "Wang, P.", "Zhu, Q.")) == \
        "Shao et al. 2024"
    assert links.author_year_label(_entry("von Werra, Leandro", "Belkada, Y.", "T, L.")) == \
        "von Werra et al. 2024"


def test_equal_labels_get_letters():
    entries = [_entry("Liu, Z.", "Chen, C.", "Li, W."), _entry("Liu, A.", "Feng, B.", "X, Y."),
               _entry("Yu, Q.")]
    labels = list(links.AuthorYearLabelStyle().format_labels(entries))
    assert labels == ["Liu et al. 2024a", "Liu et al. 2024b", "Yu 2024"]


def test_the_books_bibliography_is_author_year_and_every_entry_links_out():
    links.register_bibliography_style()
    style = find_plugin("pybtex.style.formatting", links.BIBLIOGRAPHY_STYLE)()
    bib = parse_file(REPO_ROOT / "references.bib")
    formatted = list(style.format_entries(bib.entries.values()))
    assert len(formatted) == len(bib.entries) >= 10
    for entry in formatted:
        assert re.fullmatch(r"(von )?[A-Z][a-z]+( and [A-Z][a-z]+| et al\.)? \d{4}[a-z]?",
                            entry.label), entry.label
        fields = bib.entries[entry.key].fields
        assert fields.get("url") or fields.get("doi"), f"{entry.key} has no URL or DOI"
        journal = fields.get("journal", "")
        arxiv = re.search(r"arXiv:(\d{4}\.\d{5})", journal)
        if arxiv:  # the URL is the one the entry's own identifier gives
            assert fields["url"] == f"https://arxiv.org/abs/{arxiv[1]}"
        assert "https://" in entry.text.render_as("html")


# --------------------------------------------------------------------------- paper index


def test_paper_mentions():
    assert links.paper_mentions("Reference and mirror GRPO (Theorems 1 and 4 of the paper)") \
        == ["Theorem 1", "Theorem 4"]
    assert links.paper_mentions("(Lemma 3 and Theorem 9 of the paper)") == \
        ["Lemma 3", "Theorem 9"]
    assert links.paper_mentions("Calibrated advantage (eq. 3-4 of the paper)") == \
        ["Eq. 3", "Eq. 4"]
    assert links.paper_mentions("(Section 2.2-2.3, eq. 5)") == ["Eq. 5"]
    assert links.paper_mentions("The six recurrences of Table 1") == ["Table 1"]
    assert links.paper_mentions("Degenerate groups in practice") == []


def _chapter_sources() -> dict[str, nbformat.NotebookNode]:
    return {doc: jupytext.read(source_path(REPO_ROOT, doc))
            for doc in toc_documents(REPO_ROOT)
            if doc.startswith("chapters/") and doc != "chapters/paper_index"}


def test_every_numbered_result_of_the_paper_is_restated_or_says_why_not():
    index = links.paper_index(_chapter_sources())
    assert set(links.PAPER_RESULTS) <= set(index)
    missing = [r for r in links.PAPER_RESULTS if not index[r] and r not in links.NOT_RESTATED]
    assert not missing, f"restated nowhere and no reason given: {missing}"
    stale = [r for r in links.NOT_RESTATED if index.get(r)]
    assert not stale, f"said to be not restated, but boxes restate them: {stale}"
    theorems = [r for r in links.PAPER_RESULTS if r.startswith("Theorem")]
    assert sum(1 for r in theorems if index[r]) >= 9  # all but Theorem 5 have a box today
    for result in ("Figure 1", "Figure 2", "Figure 4", "Figure 5"):
        assert any(t.role == "numref" for t in index[result]), result


@pytest.mark.skipif(not PAPER_TEXT.exists(), reason=f"no paper text at {PAPER_TEXT}")
def test_the_list_of_results_is_the_papers():
    text = PAPER_TEXT.read_text(errors="replace")
    named = set(re.findall(r"\b((?:Theorem|Proposition|Lemma|Corollary|Assumption|Remark"
                           r"|Algorithm|Table|Figure) \d+)\b", text))
    assert named == set(links.PAPER_RESULTS)


def test_a_new_box_enters_the_index():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "```{prf:theorem} Mirror iterates climb (Theorem 5 of the paper)\n:label: thm-new\n\n"
        "Text.\n```")])
    index = links.paper_index({"chapters/99_new": nb})
    assert index["Theorem 5"] == [links.Target("prf:ref", "thm-new", "chapters/99_new",
                                               "Mirror iterates climb")]
    table = links.index_markdown(index)
    assert "| Theorem 5 | {prf:ref}`thm-new`: Mirror iterates climb |" in table
    assert "| Theorem 6 | not restated on the pages of this build |" in table
    assert "| Remark 1 | not restated in a box" in table
    assert table.count("\n") == 2 + len(links.PAPER_RESULTS)


# ------------------------------------------------------------------ the ledger's links


def test_errata_mentions_become_links():
    assert claims.errata_links("with lim sup (errata items 19 and 22)") == (
        "with lim sup (errata items {ref}`19 <errata-item-19>` and "
        "{ref}`22 <errata-item-22>`)")
    assert claims.errata_links("see item 16 of the errata") == \
        "see item {ref}`16 <errata-item-16>` of the errata"
    assert claims.errata_links("typos, see errata)") == \
        "typos, see {doc}`errata </chapters/errata>`)"
    assert claims.errata_links("p_ref * 2 | x") == r"p\_ref \* 2 \| x"


def test_where_cells_link_their_pages():
    titles = {"intro": "GRPO, executed", "chapters/08_tiny_lm": "A tiny transformer",
              "chapters/12_grpo_logs": "What your GRPO logs mean"}
    assert claims.page_of("Chapter 8, per-prompt trajectories", titles) == "chapters/08_tiny_lm"
    assert claims.page_of("What your GRPO logs mean", titles) == "chapters/12_grpo_logs"
    assert claims.page_of("Chapter 3 (Optimal policies)", titles) is None
    assert claims.where_links("Chapter 8, per-prompt trajectories; Chapter 3 (x)", titles) == (
        "{doc}`Chapter 8, per-prompt trajectories </chapters/08_tiny_lm>`; Chapter 3 (x)")


def test_ledger_markdown_is_a_table_with_one_row_per_claim():
    rows = claims.ledger([claims.ClaimRecord("thm10", claims.CORRECTED, "Chapter 9, x",
                                             "holds (errata items 19 and 22)")])
    colours = {status: "#000" for status in claims.STATUS_ORDER + [claims.NOT_CHECKED]}
    text = claims.ledger_markdown(rows, {"chapters/09_parametric_gap": "Gap"}, colours)
    body = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(body) == len(claims.CLAIMS)
    row = next(line for line in body if line.startswith("| `thm10`"))
    assert "{doc}`Chapter 9, x </chapters/09_parametric_gap>`" in row
    assert row.count("{ref}`") == 2 and row.count("|") == 6


def test_launch_links_open_the_markdown_source_the_repository_holds(tmp_path):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "04_recurrence.md").write_text("# t\n")
    (tmp_path / "chapters" / "nb.ipynb").write_text("{}")
    binder = "https://mybinder.org/v2/gh/a/book/main?urlpath=lab/tree/chapters/"
    assert links.launch_source(binder + "04_recurrence.ipynb", "chapters/04_recurrence",
                               tmp_path) == binder + "04_recurrence.md"
    # a chapter kept as .ipynb, another page, another link: unchanged
    assert links.launch_source(binder + "nb.ipynb", "chapters/nb", tmp_path) == binder + "nb.ipynb"
    assert links.launch_source(binder + "04_recurrence.ipynb", "chapters/other",
                               tmp_path) == binder + "04_recurrence.ipynb"
    github = "https://github.com/a/book"
    assert links.launch_source(github, "chapters/04_recurrence", tmp_path) == github
