"""The claims ledger: every claim of the paper, and where the book checks it.

A chapter that checks a claim calls :func:`record` with the *outcome of the
check* (a boolean computed in the notebook, never a typed status). The record is
glued into the executed notebook; the ledger page gathers the records of every
executed chapter with :func:`collect` and joins them with :data:`CLAIMS`, so a
regression in any chapter changes the ledger without anyone editing it.

Statuses
--------
``verified``
    the check passed and the paper's statement holds as printed.
``verified with correction``
    the check passed for a corrected statement (the correction is in the
    evidence and on the errata page).
``extended``
    the book goes beyond the claim (e.g. finite groups) and the check passed.
``not reproducible here``
    the claim needs resources the book does not have; the evidence says why.
``failed``
    the check did not pass.
``not checked``
    no executed chapter recorded this claim.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

GLUE_PREFIX = "claim__"

VERIFIED = "verified"
CORRECTED = "verified with correction"
EXTENDED = "extended"
NOT_REPRODUCIBLE = "not reproducible here"
FAILED = "failed"
NOT_CHECKED = "not checked"
KINDS = ("holds", "corrected", "extended", "not_reproducible")

#: Every claim of the paper that the book tracks: identifier -> short description.
CLAIMS: dict[str, str] = {
    "eq3": "Eq. (3): whitening a 0/1 reward gives +sqrt((1-p)/p) and -sqrt(p/(1-p))",
    "eq4": "Eq. (4): smoothed weights w+ = (1-p)/sqrt(p(1-p)+eps), w- = p/sqrt(p(1-p)+eps)",
    "eq5": "Eq. (5) and Sec. 2.2: GRPO's objective is a weighted contrastive loss "
           "(with and without clipping)",
    "thm1": "Theorem 1: closed-form optimal policy with KL to the reference",
    "thm2": "Theorem 2: the success probability follows p_n = h(p_{n-1})",
    "prop1": "Proposition 1: properties of h (existence, monotonicity, logit form)",
    "thm3": "Theorem 3: every fixed point exceeds p_ref (success amplification)",
    "thm4": "Theorem 4: mirror GRPO's optimal policy and logit recurrence",
    "thm5": "Theorem 5: mirror iterates increase monotonically to 1; 0 is absorbing",
    "thm6": "Theorem 6: local convergence when |h'(p*)| < 1",
    "lemma1": "Lemma 1: h'(p*) at a fixed point and the bound beta > B(p*)",
    "thm8": "Theorem 8: optimal policy for a general anchor",
    "lemma2": "Lemma 2: two KL penalties equal one KL to the geometric mean",
    "lemma3": "Lemma 3: success probability of the geometric-mean anchor (Renyi terms)",
    "thm9": "Theorem 9: two-KL recurrence with the Renyi correction",
    "thm10": "Theorem 10: parametric policies stay within 2 delta* of the fixed point",
    "sec5": "Sec. 5: Dr. GRPO reaches its fixed point in one step; beta_eff equivalence",
    "table1_grpo": "Table 1, no-clip GRPO (mean+var) row",
    "table1_drgrpo": "Table 1, no-clip Dr. GRPO (mean-only) row",
    "table1_mirror": "Table 1, mirror GRPO (mean+var) row",
    "table1_mirror_drgrpo": "Table 1, mirror Dr. GRPO (mean-only) row",
    "table1_twokl": "Table 1, two-KL (mean+var) row",
    "table1_twokl_drgrpo": "Table 1, two-KL (mean-only) row",
    "fig1": "Figure 1: the two whitening weights against p",
    "fig2": "Figure 2: curves of h for several beta and p_ref (eps = 1e-5)",
    "fig3": "Figure 3: per-prompt success trajectories along GRPO training",
    "fig4": "Figure 4: the lower bound B(p*) on beta for local convergence",
    "fig5": "Figure 5: iterations of h for a grid of beta and p_ref",
    "appA": "Appendix A: mean success amplified by GRPO training (21% -> 37.5% on GSM8K)",
}


@dataclass(frozen=True)
class ClaimRecord:
    """The outcome of one check of one claim, as recorded by a chapter."""

    claim: str
    status: str
    where: str
    evidence: str


def status_of(passed: bool, kind: str = "holds") -> str:
    """Status from the outcome of a check and what kind of check it was.

    ``kind`` is ``"holds"`` (the statement as printed), ``"corrected"`` (a
    corrected statement, see the errata), ``"extended"`` (beyond the paper) or
    ``"not_reproducible"``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "not_reproducible":
        return NOT_REPRODUCIBLE
    if not passed:
        return FAILED
    return {"holds": VERIFIED, "corrected": CORRECTED, "extended": EXTENDED}[kind]


def record(claim: str, passed: bool, *, where: str, evidence: str,
           kind: str = "holds") -> None:
    """Record in the running notebook the outcome of a check of ``claim``.

    Parameters
    ----------
    claim : a key of :data:`CLAIMS`.
    passed : the outcome of the check, computed by the notebook.
    where : the page (and section) that performs the check.
    evidence : one sentence with the measured numbers.
    kind : see :func:`status_of`.
    """
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {sorted(CLAIMS)}, got {claim!r}")
    rec = ClaimRecord(claim, status_of(bool(passed), kind), where, evidence)
    from myst_nb import glue

    glue(f"{GLUE_PREFIX}{claim}__{_slug(where)}", json.dumps(asdict(rec)), display=False)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")[:40]


def records_in(notebook: nbformat.NotebookNode) -> list[ClaimRecord]:
    """Every claim record glued into an executed notebook."""
    out = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            scrap = output.get("metadata", {}).get("scrapbook", {})
            if scrap.get("name", "").startswith(GLUE_PREFIX):
                text = output["data"][scrap.get("mime_prefix", "") + "text/plain"]
                out.append(ClaimRecord(**json.loads(_unquote(text))))
    return out


def _unquote(text: str) -> str:
    """glue stores a string's repr as text/plain; undo that safely."""
    import ast

    return ast.literal_eval(text)


def collect(paths: Iterable[Path]) -> list[ClaimRecord]:
    """Claim records of the executed notebooks at ``paths`` (missing files are skipped)."""
    out = []
    for path in paths:
        path = Path(path)
        if path.exists():
            out.extend(records_in(nbformat.read(path, as_version=4)))
    return out


#: Order in which the statuses of one claim are listed (a failure first).
STATUS_ORDER = [FAILED, CORRECTED, VERIFIED, EXTENDED, NOT_REPRODUCIBLE]


def ledger(records: Iterable[ClaimRecord]) -> list[dict[str, str]]:
    """One row per claim of :data:`CLAIMS`.

    A claim checked in several places gets every distinct status, failure first
    (e.g. ``"verified; extended"``, or ``"extended; not reproducible here"`` for
    an experiment checked at toy scale only); ``primary`` is the first of them.
    """
    by_claim: dict[str, list[ClaimRecord]] = {}
    for rec in records:
        by_claim.setdefault(rec.claim, []).append(rec)
    rows = []
    for claim, description in CLAIMS.items():
        recs = by_claim.get(claim, [])
        statuses = sorted({r.status for r in recs}, key=STATUS_ORDER.index) or [NOT_CHECKED]
        rows.append({
            "claim": claim,
            "description": description,
            "primary": statuses[0],
            "status": "; ".join(statuses),
            "where": "; ".join(sorted({r.where for r in recs})),
            "evidence": " ".join(r.evidence for r in recs) if len(recs) == 1 else
                        " ".join(f"[{r.where}] {r.evidence}" for r in recs),
        })
    return rows
