"""The claims ledger: records glued by executed notebooks, statuses computed from checks."""

from __future__ import annotations

import pytest

from grpo_companion.book import claims
from grpo_companion.book.pipeline import BuildOptions, stage_documents

from .test_pipeline import _chapter, _mini_book


def test_status_follows_the_check_and_its_kind() -> None:
    assert claims.status_of(True) == claims.VERIFIED
    assert claims.status_of(False) == claims.FAILED
    assert claims.status_of(True, "corrected") == claims.CORRECTED
    assert claims.status_of(False, "corrected") == claims.FAILED
    assert claims.status_of(True, "extended") == claims.EXTENDED
    assert claims.status_of(False, "not_reproducible") == claims.NOT_REPRODUCIBLE
    with pytest.raises(ValueError, match="kind must be one of"):
        claims.status_of(True, "maybe")


def test_ledger_has_every_claim_and_lists_failures_first() -> None:
    recs = [
        claims.ClaimRecord("thm3", claims.VERIFIED, "ch04", "margin 0.1"),
        claims.ClaimRecord("thm3", claims.FAILED, "ch05", "margin -0.2"),
        claims.ClaimRecord("eq3", claims.VERIFIED, "ch01", "error 1e-16"),
        claims.ClaimRecord("appA", claims.EXTENDED, "ch08", "toy"),
        claims.ClaimRecord("appA", claims.NOT_REPRODUCIBLE, "ch08", "no GPU"),
    ]
    rows = {r["claim"]: r for r in claims.ledger(recs)}
    assert set(rows) == set(claims.CLAIMS)
    assert rows["thm3"]["primary"] == claims.FAILED
    assert rows["thm3"]["status"] == "failed; verified"
    assert rows["thm3"]["where"] == "ch04; ch05"
    assert rows["eq3"]["status"] == claims.VERIFIED
    assert rows["appA"]["status"] == "extended; not reproducible here"
    assert rows["thm10"]["status"] == claims.NOT_CHECKED


def test_unknown_claim_is_rejected() -> None:
    with pytest.raises(ValueError, match="claim must be one of"):
        claims.record("thm99", True, where="x", evidence="y")


def test_records_round_trip_through_an_executed_notebook(tmp_path) -> None:
    body = (
        "```{code-cell} ipython3\n"
        "from grpo_companion.book import claims\n"
        "margin = 0.25\n"
        "claims.record('thm3', margin > 0, where='test page', evidence=f'margin {margin}')\n"
        "claims.record('eq4', margin > 1, where='test page', evidence='fails on purpose')\n"
        "```\n"
    )
    root = _mini_book(tmp_path / "book", body)
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    stage_documents(opts, log=lambda *_: None)
    recs = claims.collect([opts.stage / "ch" / "one.ipynb", tmp_path / "missing.ipynb"])
    assert [(r.claim, r.status) for r in recs] == [("thm3", claims.VERIFIED),
                                                    ("eq4", claims.FAILED)]
    assert recs[0].evidence == "margin 0.25"


def test_summary_page_reruns_when_an_earlier_chapter_changes(tmp_path) -> None:
    root = _mini_book(tmp_path / "book", "```{code-cell} ipython3\nx = 1\n```\n")
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: index\nchapters:\n  - file: ch/one\n  - file: ch/summary\n")
    summary = _chapter("```{code-cell} ipython3\ny = 2\n```\n").replace(
        "---\n\n# A chapter", "grpo_companion:\n  depends_on_previous: true\n---\n\n# A chapter", 1)
    (root / "ch" / "summary.md").write_text(summary)
    opts = BuildOptions(root=root, out=tmp_path / "out", quick=True)
    quiet = lambda *_: None  # noqa: E731
    assert [r.cached for r in stage_documents(opts, log=quiet)] == [False, False]
    assert [r.cached for r in stage_documents(opts, log=quiet)] == [True, True]
    (root / "ch" / "one.md").write_text(_chapter("```{code-cell} ipython3\nx = 3\n```\n"))
    assert [r.cached for r in stage_documents(opts, log=quiet)] == [False, False]


def test_evidence_of_several_records_names_each_source() -> None:
    recs = [claims.ClaimRecord("thm3", claims.VERIFIED, "ch04", "margin 0.1"),
            claims.ClaimRecord("thm3", claims.EXTENDED, "ch06", "finite G")]
    row = {r["claim"]: r for r in claims.ledger(recs)}["thm3"]
    assert row["evidence"] == "[ch04] margin 0.1 [ch06] finite G"
    assert row["status"] == "verified; extended"
