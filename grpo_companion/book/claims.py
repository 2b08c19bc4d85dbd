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
``checked (vacuous here)``
    a bound was checked and holds, but only because it says nothing at the
    measured values (e.g. Theorem 10's ``2 delta*`` when ``2 delta* >= 1``):
    not evidence for the claim, and not against it.
``failed``
    the check did not pass.
``holds in the toys`` / ``fails in the toys``
    for the claims of *other* papers held against this book's exactly computable toys
    (:data:`OTHER_PAPERS`, chapter "Beyond the paper"): whether the claim, as the row
    states it, is what the exact computation or the enumerated transformer shows. A failure
    here is a finding about the claim, not a failed check of the book.
``not checked``
    no executed chapter recorded this claim.

A claim has one truth. Several chapters may check it, and their statuses are
listed together when they are compatible (``"verified; extended"``), but
``verified`` (the statement holds as printed) and ``verified with correction``
(it needs a correction) contradict each other: :func:`ledger` refuses such a
claim with :class:`LedgerConflict`, which fails the build. A chapter whose own
check passes for a claim corrected elsewhere records it with
``kind="corrected"``: the correction found anywhere governs the row.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

GLUE_PREFIX = "claim__"

VERIFIED = "verified"
CORRECTED = "verified with correction"
EXTENDED = "extended"
NOT_REPRODUCIBLE = "not reproducible here"
VACUOUS = "checked (vacuous here)"
FAILED = "failed"
NOT_CHECKED = "not checked"
HOLDS_IN_TOYS = "holds in the toys"
FAILS_IN_TOYS = "fails in the toys"
KINDS = ("holds", "corrected", "extended", "vacuous", "not_reproducible", "toy")

#: Every claim of the paper that the book tracks: identifier -> short description, as MyST
#: (inline math between dollars, code in backticks; one line, no table pipe).
CLAIMS: dict[str, str] = {
    "eq3": r"Eq. (3): whitening a 0/1 reward gives $+\sqrt{(1-p)/p}$ and $-\sqrt{p/(1-p)}$",
    "eq4": r"Eq. (4): smoothed weights $w^+ = (1-p)/\sqrt{p(1-p)+\varepsilon}$, "
           r"$w^- = p/\sqrt{p(1-p)+\varepsilon}$",
    "eq5": "Eq. (5) and Sec. 2.2: GRPO's objective is a weighted contrastive loss "
           "(with and without clipping)",
    "thm1": "Theorem 1: closed-form optimal policy with KL to the reference",
    "thm2": r"Theorem 2: the success probability follows $p_n = h(p_{n-1})$",
    "prop1": "Proposition 1: properties of $h$ (existence, monotonicity, logit form)",
    "remark1": r"Remark 1: with $\varepsilon = 0$, $h$ loses continuity at 0 and 1 and fixed "
               "points are no longer guaranteed",
    "thm3": r"Theorem 3: every fixed point exceeds $p_{\mathrm{ref}}$ (success amplification)",
    "sec31": r"Sec. 3.1: for $p_{\mathrm{ref}} \in \{0, 1\}$ the fixed point is 0 or 1 and its "
             r"stability needs a condition on $\beta$",
    "thm4": "Theorem 4: mirror GRPO's optimal policy and logit recurrence",
    "thm5": "Theorem 5: mirror iterates increase monotonically to 1; 0 is absorbing",
    "thm6": r"Theorem 6: local convergence when $\lvert h'(p^*)\rvert < 1$",
    "lemma1": r"Lemma 1: $h'(p^*)$ at a fixed point and the bound $\beta > B(p^*)$",
    "remark2": "Remark 2: bounds uniform over prompts $q$ take the supremum over $q$ of the "
               "per-prompt bounds",
    "appC2": r"App. C.2, practical implications: staged GRPO that resets $\pi_{\mathrm{ref}}$ "
             "to the last iterate amplifies success with respect to each new reference",
    "thm7": r"Theorem 7: one-dimensional local contraction lemma ($\lvert f'(x^*)\rvert < 1$ "
            "gives a contracting interval around $x^*$)",
    "thm8": "Theorem 8: optimal policy for a general anchor",
    "lemma2": "Lemma 2: two KL penalties equal one KL to the geometric mean",
    "lemma3": "Lemma 3: success probability of the geometric-mean anchor (Rényi terms)",
    "thm9": "Theorem 9: two-KL recurrence with the Rényi correction",
    "thm9_amplification": r"App. E, after Theorem 9: $D_S \le D_F$ at every step implies "
                          r"$L_n \ge L_{\mathrm{ref}}$ (amplification with two KL penalties)",
    "thm10": r"Theorem 10: parametric policies stay within $2\delta^*$ of the fixed point",
    "sec5": "Sec. 5: Dr. GRPO reaches its fixed point in one step; mirror Dr. GRPO's logits "
            r"grow by $1/\beta$ per step",
    "sec5_beta_eff": "Sec. 5 and the practical takeaways: mean+variance normalisation is "
                     r"mean-only normalisation with an adaptive $\beta_{\mathrm{eff}}$",
    "table1_grpo": "Table 1, no-clip GRPO (mean+var) row",
    "table1_drgrpo": "Table 1, no-clip Dr. GRPO (mean-only) row",
    "table1_mirror": "Table 1, mirror GRPO (mean+var) row",
    "table1_mirror_drgrpo": "Table 1, mirror Dr. GRPO (mean-only) row",
    "table1_twokl": "Table 1, two-KL (mean+var) row",
    "table1_twokl_drgrpo": "Table 1, two-KL (mean-only) row",
    "fig1": "Figure 1: the two whitening weights against $p$",
    "fig2": r"Figure 2: curves of $h$ for several $\beta$ and $p_{\mathrm{ref}}$ "
            r"($\varepsilon = 10^{-5}$)",
    "fig3": "Figure 3: per-prompt success trajectories along GRPO training",
    "fig4": r"Figure 4: the lower bound $B(p^*)$ on $\beta$ for local convergence",
    "fig5": r"Figure 5: iterations of $h$ for a grid of $\beta$ and $p_{\mathrm{ref}}$",
    "appA": "Appendix A: mean success amplified by GRPO training (21% to 37.5% on GSM8K)",
    "toy_fig3": "The book's toy analog of Figure 3 (not a claim of the paper): in a 2-layer "
                "transformer trained with plain $k_3$, each prompt's exact success follows the "
                r"relaxed $k_3$ recurrence from its own $p_{\mathrm{ref}}$ better than "
                "prompt-blind baselines",
    "toy_fig3_zero": "The book's toy analog of Figure 3's prompts that the reference never solves "
                     r"(not a claim of the paper): such a prompt stays at $p_{\mathrm{ref}}$ "
                     "until one of its groups of $G$ samples holds a success, as the "
                     "finite-group weights say",
    "logs_loss": "The book's answer to 'the loss is 0' (not a claim of the paper): at ratio 1 "
                 r"TRL's loss is $-\sum_i A_i \ell_i / \sum_i \ell_i + \beta\,\mathrm{KL}$, so "
                 "its value says nothing of the gradient",
    "logs_zero_std": "The book's prediction of `frac_reward_zero_std` (not a claim of the "
                     "paper): the mean of $p^G + (1-p)^G$ over the prompts' current PoS",
    "logs_kl_uniform": "The book's answer to 'uniform groups still get a KL gradient' (not a "
                       "claim of the paper): it is the anchor of eq. 6; removing it moves "
                       "the fixed points",
    "logs_clip": "The book's answer to '`clip_ratio` is always 0' (not a claim of the paper): "
                 "with `num_iterations = 1` every ratio is 1 when the loss is evaluated",
    "logs_beta0": r"The book's $\beta = 0$ rate (not a claim of the paper): every prompt with "
                  r"$p_{\mathrm{ref}} > 0$ goes to PoS 1, and $1 - p$ falls like "
                  r"$1/(\eta c t)$ under gradient flow",
    "logs_scale": "The book's comparison of `scale_rewards` 'group' and 'none' (not a claim of "
                  "the paper): which reference PoS gains most at the fixed point",
    "logs_entropy": "The book's answer on entropy among correct outputs (not a claim of the "
                    "paper): sampled GRPO drifts the ratios of verified outputs, the KL "
                    r"anchor restores them, $\beta = 0$ does not",
    # ---- other papers' claims (and the book's own extension to clipping), held against the
    # toys in the chapter "Beyond the paper"; each statement is the claim as tested there
    "beyond_clipped": "Clipped GRPO (the book's extension): the exact clipped round has the "
                      "unclipped recurrence's fixed points; the clip changes the path, and "
                      "with it which stable fixed point is reached",
    "beyond_clip_mu10": r"Clipped GRPO (the book's expectation): chapter 7's lower settling "
                        r"point with clipping and $\mu = 10$ is a finite-sample effect, "
                        "shrinking as $G$ grows and absent without sampling",
    "beyond_passk": "Yue et al. (arXiv 2504.13837): after RL training pass@k rises at $k = 1$ "
                    "but falls below the base model's at large $k$ (a crossover)",
    "beyond_rank": "He, Fried and Welleck (arXiv 2506.02355): GRPO raises the already likely "
                   "correct outputs more than the unlikely ones (rank bias)",
    "beyond_negative": "Zhu et al. (arXiv 2506.01347): training on negative samples alone "
                       "trades pass@1 for pass@k: below full GRPO at $k = 1$, above it at "
                       "large $k$",
    "beyond_entropy_identity": "Cui et al. (arXiv 2505.22617): a softmax policy step changes "
                               r"the entropy by $-\mathrm{Cov}_\pi(\log \pi, \Delta z)$ to "
                               "first order",
    "beyond_entropy_law": r"Cui et al. (arXiv 2505.22617): success and entropy follow "
                          r"$R = -a e^H + b$ with $a > 0$ along training (the book's test: "
                          r"better than a line in $H$ by 3 standard errors)",
    "beyond_clip_bias": "Shao et al. (arXiv 2506.10947): with rewards independent of the "
                        r"output, clipping and $\mu > 1$ push the high-prior output up",
    "beyond_arcsin": "Davis and Recht (arXiv 2510.13651): GRPO's expected update is gradient "
                     r"ascent on $2 \arcsin \sqrt{p}$",
}


#: The book's own results among :data:`CLAIMS`, beyond the paper: its toy analog of Figure 3
#: and its answers to practitioners' questions about GRPO logs (chapter 12). The ledger
#: lists them apart, so that their outcome is not read as the paper's.
BOOK_OWN: frozenset[str] = frozenset(
    {"toy_fig3", "toy_fig3_zero"} | {c for c in CLAIMS if c.startswith("logs_")})

#: Claims of other papers (and the book's own clipped-GRPO results) held against the toys in
#: the chapter "Beyond the paper": their own table, statuses of ``kind="toy"``.
OTHER_PAPERS: frozenset[str] = frozenset(c for c in CLAIMS if c.startswith("beyond_"))


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
    corrected statement, see the errata), ``"extended"`` (beyond the paper),
    ``"vacuous"`` (a bound that holds only because it is uninformative at the
    measured values), ``"not_reproducible"``, or ``"toy"`` (another paper's claim held
    against the toys: ``passed`` says whether it holds there).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "not_reproducible":
        return NOT_REPRODUCIBLE
    if kind == "toy":
        return HOLDS_IN_TOYS if passed else FAILS_IN_TOYS
    if not passed:
        return FAILED
    return {"holds": VERIFIED, "corrected": CORRECTED, "extended": EXTENDED,
            "vacuous": VACUOUS}[kind]


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
    if (kind == "toy") != (claim in OTHER_PAPERS):
        raise ValueError(f"kind must be 'toy' exactly for the claims held against the toys "
                         f"(OTHER_PAPERS), got kind={kind!r} for claim {claim!r}")
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
STATUS_ORDER = [FAILED, CORRECTED, VERIFIED, EXTENDED, VACUOUS, NOT_REPRODUCIBLE,
                FAILS_IN_TOYS, HOLDS_IN_TOYS]

#: Pairs of statuses that cannot both be true of one claim: it holds as printed, or it
#: needs a correction. (``extended`` and ``not reproducible here`` are about other
#: statements, a generalisation or the full-scale experiment, and go with either.)
INCOMPATIBLE = (frozenset({VERIFIED, CORRECTED}),)


class LedgerConflict(ValueError):
    """Two chapters recorded incompatible statuses for one claim."""


def check_consistent(records: Iterable[ClaimRecord]) -> None:
    """Raise :class:`LedgerConflict` if some claim has two incompatible statuses.

    The message names the claim and, for each status, the pages that recorded
    it, so that the chapter to fix can be found from the build log.
    """
    by_claim: dict[str, dict[str, set[str]]] = {}
    for rec in records:
        by_claim.setdefault(rec.claim, {}).setdefault(rec.status, set()).add(rec.where)
    problems = []
    for claim, statuses in by_claim.items():
        for pair in INCOMPATIBLE:
            if pair <= statuses.keys():
                sources = "; ".join(f"{status!r} in {', '.join(sorted(statuses[status]))}"
                                    for status in sorted(pair, key=STATUS_ORDER.index))
                problems.append(f"{claim}: {sources}")
    if problems:
        raise LedgerConflict(
            "incompatible statuses recorded for one claim (a correction found anywhere "
            "governs the claim: record it with kind='corrected' everywhere): "
            + " | ".join(problems))


def earlier_notebooks(stage: Path, page: str) -> list[Path]:
    """Executed notebooks of the pages listed before ``page`` in ``stage/_toc.yml``.

    The ledger page reads only these: a page after it in the table of contents
    is executed after it, so its notebook in the staged tree (if any) is left
    over from an earlier build and must not count. Without a ``_toc.yml`` (a page
    executed on its own, outside a book) there is nothing before it: ``[]``.
    """
    import yaml

    from grpo_companion.book.pipeline import documents_of

    stage = Path(stage)
    if not (stage / "_toc.yml").exists():
        return []
    docs = documents_of(yaml.safe_load((stage / "_toc.yml").read_text()))
    if page not in docs:
        raise ValueError(f"page must be listed in {stage / '_toc.yml'}, got {page!r}")
    return [stage / f"{doc}.ipynb" for doc in docs[:docs.index(page)]
            if (stage / f"{doc}.ipynb").exists()]


def ledger(records: Iterable[ClaimRecord]) -> list[dict[str, str]]:
    """One row per claim of :data:`CLAIMS`; ``origin`` is ``"book"`` for :data:`BOOK_OWN`,
    ``"other"`` for :data:`OTHER_PAPERS` and ``"paper"`` for the rest.

    A claim checked in several places gets every distinct status, failure first
    (e.g. ``"verified; extended"``, or ``"extended; not reproducible here"`` for
    an experiment checked at toy scale only); ``primary`` is the first of them.
    Incompatible statuses raise :class:`LedgerConflict` (see :func:`check_consistent`).
    """
    records = list(records)
    check_consistent(records)
    by_claim: dict[str, list[ClaimRecord]] = {}
    for rec in records:
        by_claim.setdefault(rec.claim, []).append(rec)
    rows = []
    for claim, description in CLAIMS.items():
        recs = by_claim.get(claim, [])
        statuses = sorted({r.status for r in recs}, key=STATUS_ORDER.index) or [NOT_CHECKED]
        rows.append({
            "claim": claim,
            "origin": ("book" if claim in BOOK_OWN else
                       "other" if claim in OTHER_PAPERS else "paper"),
            "description": description,
            "primary": statuses[0],
            "status": "; ".join(statuses),
            "where": "; ".join(sorted({r.where for r in recs})),
            "evidence": " ".join(r.evidence for r in recs) if len(recs) == 1 else
                        " ".join(f"[{r.where}] {r.evidence}" for r in recs),
        })
    return rows


# ------------------------------------------------------------------------ rendering as MyST

#: The errata page, and the label of its item ``n`` (``(errata-item-n)=`` in chapters/errata.md).
ERRATA_DOC = "/chapters/errata"
ERRATA_ITEM_LABEL = "errata-item-{}"
_NUMBERS = r"\d+(?:(?:, | and | or )\d+)*"
_ERRATA_MENTION = re.compile(
    rf"(?P<lead>\berrata,? items? )(?P<nums1>{_NUMBERS})"
    rf"|(?P<items>\bitems? )(?P<nums2>{_NUMBERS})(?P<tail> of the errata)"
    r"|(?P<bare>\berrata\b)")
#: Characters that mean something in MyST inline text (a table cell): escaped in plain text.
_MARKUP = re.compile(r"([\\`*_\[\]<>|$#{}~&!])")
_CHAPTER = re.compile(r"Chapter (\d+)\b")


def statement_myst(text: str) -> str:
    """A claim's description (MyST with inline math) checked to fit one table cell.

    Raises ``ValueError`` for a pipe, which would split the cell (write ``\\lvert``), and for
    an odd number of dollar signs, which would leave math open.
    """
    text = re.sub(r"\s+", " ", str(text)).strip()
    if "|" in text:
        raise ValueError(f"a claim's statement has a table pipe: {text!r}")
    if text.count("$") % 2:
        raise ValueError(f"a claim's statement leaves inline math open: {text!r}")
    return text


def myst_escape(text: str) -> str:
    """``text`` as literal MyST inline text (markup characters backslash-escaped, one line)."""
    return _MARKUP.sub(r"\\\1", re.sub(r"\s+", " ", str(text)))


_INLINE_MATH = re.compile(r"(\$[^$|\n]+\$)")


def escape_outside_math(text: str) -> str:
    """:func:`myst_escape` on ``text`` except its inline math (``$...$`` with no pipe, which
    would split a table cell), which stays math."""
    parts = _INLINE_MATH.split(re.sub(r"\s+", " ", str(text)))
    return "".join(part if i % 2 else myst_escape(part) for i, part in enumerate(parts))


def _item_links(numbers: str) -> str:
    return re.sub(r"\d+", lambda m: f"{{ref}}`{m[0]} <{ERRATA_ITEM_LABEL.format(m[0])}>`",
                  numbers)


def errata_links(text: str) -> str:
    """``text`` as MyST in which mentions of the errata are links: ``errata items 19 and 22``
    and ``item 16 of the errata`` link each item, a bare ``errata`` links the page; inline
    math stays math (:func:`escape_outside_math`)."""
    out, last = [], 0
    for match in _ERRATA_MENTION.finditer(text):
        out.append(escape_outside_math(text[last:match.start()]))
        if match["bare"]:
            out.append(f"{{doc}}`errata <{ERRATA_DOC}>`")
        elif match["lead"]:
            out.append(escape_outside_math(match["lead"]) + _item_links(match["nums1"]))
        else:
            out.append(escape_outside_math(match["items"]) + _item_links(match["nums2"])
                       + escape_outside_math(match["tail"]))
        last = match.end()
    out.append(escape_outside_math(text[last:]))
    return "".join(out)


def page_of(where: str, titles: Mapping[str, str]) -> str | None:
    """The document that a record's ``where`` names: ``"Chapter 8, ..."`` is the page whose file
    name starts with ``08_``; otherwise the page whose title ``where`` contains. None if none."""
    match = _CHAPTER.match(where.strip())
    if match:
        prefix = f"{int(match[1]):02d}_"
        for doc in titles:
            if doc.rsplit("/", 1)[-1].startswith(prefix):
                return doc
        return None
    for doc, title in titles.items():
        if title and title.lower() in where.lower():
            return doc
    return None


def where_links(where: str, titles: Mapping[str, str]) -> str:
    """A ledger row's "checked in" cell as MyST: each place (the places are separated by
    semicolons) a link to its page when :func:`page_of` finds it, plain text otherwise."""
    cells = []
    for place in filter(None, (p.strip() for p in where.split(";"))):
        doc = page_of(place, titles)
        shown = re.sub(r"[<>`]", "", " ".join(place.split()))
        cells.append(f"{{doc}}`{shown} </{doc}>`" if doc else myst_escape(place))
    return "; ".join(cells)


def page_titles(notebooks: Mapping[str, Path]) -> dict[str, str]:
    """Document -> the title (the first level-one heading) of its executed notebook."""
    titles = {}
    for doc, path in notebooks.items():
        nb = nbformat.read(path, as_version=4)
        heading = next((line[2:].strip() for cell in nb.cells if cell.cell_type == "markdown"
                        for line in cell.source.splitlines() if line.startswith("# ")), "")
        titles[doc] = heading
    return titles


def ledger_markdown(rows: Iterable[Mapping[str, str]], titles: Mapping[str, str],
                    colours: Mapping[str, str]) -> str:
    """Ledger rows (of :func:`ledger`) as a MyST table whose "checked in" cells link the pages
    (:func:`where_links`) and whose evidence links the errata items it cites
    (:func:`errata_links`); each status in ``colours[row["primary"]]``."""
    lines = ["```{table}", ":class: claims-ledger", ":widths: auto", "",
             "| claim | statement | status | checked in | evidence |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        status = (f"<span class=\"ledger-status\" style=\"color:{colours[r['primary']]};"
                  f"font-weight:600\">{html.escape(r['status'])}</span>")
        lines.append(f"| `{r['claim']}` | {statement_myst(r['description'])} | {status} | "
                     f"{where_links(r['where'], titles)} | {errata_links(r['evidence'])} |")
    lines.append("```")
    return "\n".join(lines) + "\n"
