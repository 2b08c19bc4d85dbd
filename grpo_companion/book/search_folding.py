"""Accent-insensitive search in the HTML book: a Sphinx extension.

Sphinx's search page (``searchtools.js``) looks the words of a reader's query up in
``searchindex.js``, which maps the stemmed words of every page to the pages that hold them.
Both sides compare words exactly, so "Renyi" does not find a page that writes "Rényi". This
extension folds accents on both sides with the same rule, :func:`fold_accents`:

- **the index** (Python): :class:`FoldedEnglish` is Sphinx's English search language whose
  ``stem`` folds each word before the Porter stemmer sees it. It is registered with Sphinx's
  public hook for search languages, ``app.add_search_language``, and made the book's
  ``html_search_language`` when the book's language is English;
- **the query** (the browser): the same class's ``js_stemmer_code``, which Sphinx writes into
  ``_static/language_data.js`` (loaded by the search page, before ``searchtools.js`` runs a
  query), wraps the Porter stemmer in the same folding. Sphinx applies it to each query word.

Register it in ``_config.yml`` under ``sphinx: extra_extensions`` as
``grpo_companion.book.search_folding``.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from sphinx.search.en import SearchEnglish

__all__ = ["FOLD_ACCENTS_JS", "FoldedEnglish", "fold_accents", "setup"]

#: The browser's half: fold each query word (as :func:`fold_accents` does), then let Sphinx's
#: Porter stemmer (the ``Stemmer`` defined just before this code) stem it.
FOLD_ACCENTS_JS = """
/* grpo_companion.book.search_folding: accents folded before stemming ("Renyi" finds "Rényi") */
var foldAccents = (word) => word.normalize("NFKD").replace(/\\p{M}/gu, "");
var Stemmer = ((PorterStemmer) => function () {
  const porter = new PorterStemmer();
  this.stemWord = (word) => porter.stemWord(foldAccents(word));
})(Stemmer);
"""


def fold_accents(text: str) -> str:
    """``text`` without its accents: Unicode's compatibility decomposition (NFKD) with every
    combining mark (general category ``M*``) dropped.

    "Rényi" becomes "Renyi", "Schrödinger" "Schrodinger", the ligature "ﬁ" "fi", "x²" "x2";
    letters with no decomposition (Greek, "ß", "ø") are kept as they are. The browser applies
    the same rule to a query (:data:`FOLD_ACCENTS_JS`: ``normalize("NFKD")`` and ``\\p{M}``).

    Parameters
    ----------
    text : str
        Any text.

    Returns
    -------
    str
        The folded text.

    Raises
    ------
    ValueError
        If ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str (any Unicode text); got {type(text).__name__} "
                         f"{text!r}")
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.category(c).startswith("M"))


class FoldedEnglish(SearchEnglish):
    """Sphinx's English search language with accents folded (:func:`fold_accents`) before
    stemming, in the index (:meth:`stem`) and in the browser (``js_stemmer_code``)."""

    lang = "en_folded"
    language_name = "English, accents folded"
    js_stemmer_code = SearchEnglish.js_stemmer_code + FOLD_ACCENTS_JS

    def stem(self, word: str) -> str:
        """The Porter stem of ``word`` lowercased, then folded (the browser's order)."""
        return super().stem(fold_accents(word.lower()))


def _search_folded(app: Any, config: Any) -> None:
    """Make :class:`FoldedEnglish` the search language of an English book."""
    language = config.html_search_language or config.language or "en"
    if language == "en" or language.startswith("en_"):
        config.html_search_language = FoldedEnglish.lang


def setup(app: Any) -> dict[str, Any]:
    """Register :class:`FoldedEnglish` and choose it for an English book (Sphinx's entry
    point)."""
    app.add_search_language(FoldedEnglish)
    app.connect("config-inited", _search_folded)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
