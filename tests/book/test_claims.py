"""The claims ledger: records glued by executed notebooks, statuses computed from checks."""

from __future__ import annotations

import re

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
    assert claims.status_of(True, "vacuous") == claims.VACUOUS
    assert claims.status_of(False, "vacuous") == claims.FAILED
    assert claims.VACUOUS != claims.EXTENDED  # a vacuous bound is not a passing extension
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


def test_ledger_refuses_a_claim_both_verified_and_corrected() -> None:
    recs = [claims.ClaimRecord("table1_twokl", claims.CORRECTED, "ch05", "slope 1.2"),
            claims.ClaimRecord("table1_twokl", claims.VERIFIED, "ch07", "recurrence 1e-9"),
            claims.ClaimRecord("thm3", claims.VERIFIED, "ch04", "margin 0.1")]
    with pytest.raises(claims.LedgerConflict, match="table1_twokl") as err:
        claims.ledger(recs)
    message = str(err.value)
    assert "'verified with correction' in ch05" in message and "'verified' in ch07" in message
    assert "thm3" not in message
    # the same records with the correction recorded everywhere give one status
    fixed = [claims.ClaimRecord(r.claim, claims.CORRECTED, r.where, r.evidence)
             if r.claim == "table1_twokl" else r for r in recs]
    row = {r["claim"]: r for r in claims.ledger(fixed)}["table1_twokl"]
    assert row["status"] == claims.CORRECTED and row["where"] == "ch05; ch07"


def test_compatible_statuses_are_listed_together() -> None:
    recs = [claims.ClaimRecord("appA", claims.EXTENDED, "ch08", "toy"),
            claims.ClaimRecord("appA", claims.NOT_REPRODUCIBLE, "ch08", "no GPU"),
            claims.ClaimRecord("sec5", claims.VERIFIED, "ch05", "one step"),
            claims.ClaimRecord("sec5", claims.EXTENDED, "ch06", "finite G"),
            claims.ClaimRecord("fig2", claims.CORRECTED, "ch04", "eps 1e-2"),
            claims.ClaimRecord("fig2", claims.EXTENDED, "ch06", "finite G")]
    claims.check_consistent(recs)  # no conflict
    rows = {r["claim"]: r for r in claims.ledger(recs)}
    assert rows["sec5"]["status"] == "verified; extended"
    assert rows["fig2"]["status"] == "verified with correction; extended"


def test_every_numbered_result_of_the_paper_has_a_claim() -> None:
    required = {f"thm{i}" for i in range(1, 11)} | {"lemma1", "lemma2", "lemma3", "prop1",
                                                    "remark1", "remark2", "sec31", "sec5",
                                                    "sec5_beta_eff", "appC2", "appA",
                                                    "thm9_amplification"}
    required |= {f"fig{i}" for i in range(1, 6)}
    required |= {k for k in claims.CLAIMS if k.startswith("table1_")}
    assert required <= set(claims.CLAIMS)
    assert len([k for k in claims.CLAIMS if k.startswith("table1_")]) == 6


def test_ledger_reads_only_pages_before_it(tmp_path) -> None:
    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n  - file: ch/one\n  - file: ch/two\n"
        "  - file: ch/ledger\n  - file: ch/errata\n")
    (tmp_path / "ch").mkdir()
    for name in ("one", "ledger", "errata"):  # ch/two was never executed
        (tmp_path / "ch" / f"{name}.ipynb").write_text("{}")
    got = claims.earlier_notebooks(tmp_path, "ch/ledger")
    assert got == [tmp_path / "ch" / "one.ipynb"]
    with pytest.raises(ValueError, match="page must be listed"):
        claims.earlier_notebooks(tmp_path, "ch/missing")
    assert claims.earlier_notebooks(tmp_path / "ch", "ch/ledger") == []  # no _toc.yml there


def test_the_books_own_results_are_kept_apart() -> None:
    rows = {r["claim"]: r for r in claims.ledger([])}
    own = {c for c, r in rows.items() if r["origin"] == "book"}
    assert own == claims.BOOK_OWN
    assert {"toy_fig3", "toy_fig3_zero"} < own
    assert len([c for c in own if c.startswith("logs_")]) == 7  # chapter 12's seven answers
    assert all(rows[c]["origin"] == "paper" for c in ("thm1", "thm2", "appA"))
    assert all("not a claim of the paper" in claims.CLAIMS[c] for c in own)


def test_other_papers_claims_have_their_own_rows_and_statuses() -> None:
    rows = {r["claim"]: r for r in claims.ledger([])}
    other = {c for c, r in rows.items() if r["origin"] == "other"}
    assert other == claims.OTHER_PAPERS
    assert len(other) == 9  # issue 24: seven items, two of them with two claims
    assert not other & claims.BOOK_OWN
    assert claims.status_of(True, "toy") == claims.HOLDS_IN_TOYS
    assert claims.status_of(False, "toy") == claims.FAILS_IN_TOYS
    # a claim of another paper is recorded with kind="toy", and only such a claim is
    with pytest.raises(ValueError, match="kind must be 'toy'"):
        claims.record("beyond_passk", True, where="x", evidence="y")
    with pytest.raises(ValueError, match="kind must be 'toy'"):
        claims.record("thm1", True, where="x", evidence="y", kind="toy")
    recs = [claims.ClaimRecord("beyond_passk", claims.FAILS_IN_TOYS, "a", "e1"),
            claims.ClaimRecord("beyond_passk", claims.HOLDS_IN_TOYS, "b", "e2")]
    row = next(r for r in claims.ledger(recs) if r["claim"] == "beyond_passk")
    assert row["status"] == "fails in the toys; holds in the toys"
    assert row["primary"] == claims.FAILS_IN_TOYS


#: ASCII stand-ins for math that a ledger statement must write as math instead
ASCII_MATH = re.compile(r"sqrt|_\{|\^|\bbeta\b|\beps\b|\bp_ref\b|\bpi_ref\b|\bdelta\b|->|"
                        r"\bRenyi\b|\bk3\b")


def _outside_math_and_code(text: str) -> str:
    return re.sub(r"\$[^$]*\$|`[^`]*`", " ", text)


def ascii_math_in_statements(statements: dict[str, str]) -> dict[str, list[str]]:
    """Per claim, the ASCII math left outside ``$...$`` and code spans."""
    found = {claim: ASCII_MATH.findall(_outside_math_and_code(text))
             for claim, text in statements.items()}
    return {claim: hits for claim, hits in found.items() if hits}


def test_ledger_statements_write_their_math_as_math():
    assert ascii_math_in_statements(claims.CLAIMS) == {}
    for text in claims.CLAIMS.values():
        assert claims.statement_myst(text) == text
    # the check has power: the statements as they were before (a5b43d4) fail it
    old = {"eq3": "Eq. (3): whitening a 0/1 reward gives +sqrt((1-p)/p) and -sqrt(p/(1-p))",
           "thm3": "Theorem 3: every fixed point exceeds p_ref (success amplification)"}
    assert set(ascii_math_in_statements(old)) == {"eq3", "thm3"}


@pytest.mark.parametrize("bad, message", [("$|x|$ < 1", "table pipe"),
                                          ("a $x < 1", "inline math open")])
def test_a_statement_that_would_break_the_table_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        claims.statement_myst(bad)


def test_evidence_keeps_its_inline_math_and_escapes_the_rest():
    text = r"holds for $\sup \lvert h'\rvert < 1$ at p_ref* = 0.2; errata item 3"
    out = claims.errata_links(text)
    assert r"$\sup \lvert h'\rvert < 1$" in out  # math left for MathJax
    assert r"p\_ref\* = 0.2" in out  # markup characters outside math escaped
    assert "{ref}`3 <errata-item-3>`" in out
    assert claims.escape_outside_math("a $x|y$ b") == r"a \$x\|y\$ b"  # a pipe would split
