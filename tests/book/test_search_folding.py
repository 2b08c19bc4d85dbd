"""The accent folding of the book's search (grpo_companion.book.search_folding), without a
build: the rule itself, the index's stemmer and the registration with Sphinx."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sphinx.search import languages
from sphinx.search.en import SearchEnglish

from grpo_companion.book import search_folding
from grpo_companion.book.search_folding import FoldedEnglish, fold_accents


@pytest.mark.parametrize(("text", "folded"), [
    ("Rényi", "Renyi"),
    ("Re\u0301nyi", "Renyi"),  # already decomposed: the mark is dropped all the same
    ("Schrödinger", "Schrodinger"),
    ("naïve façade", "naive facade"),
    ("ﬁxed", "fixed"),  # a ligature: compatibility decomposition
    ("x²", "x2"),
    ("β, ß, ø", "β, ß, ø"),  # letters with no decomposition are kept
    ("", ""),
    ("plain ASCII stays", "plain ASCII stays"),
])
def test_fold_accents_examples(text: str, folded: str) -> None:
    assert fold_accents(text) == folded


@given(st.text())
def test_fold_accents_leaves_no_combining_mark_and_is_idempotent(text: str) -> None:
    folded = fold_accents(text)
    assert not any(unicodedata.category(c).startswith("M") for c in folded)
    assert fold_accents(folded) == folded


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_fold_accents_keeps_ascii(text: str) -> None:
    assert fold_accents(text) == text


@pytest.mark.parametrize("bad", [None, b"R\xc3\xa9nyi", 3])
def test_fold_accents_rejects_what_is_not_text(bad: object) -> None:
    with pytest.raises(ValueError, match="text must be a str"):
        fold_accents(bad)  # type: ignore[arg-type]


def test_index_stems_accented_and_plain_words_alike() -> None:
    folded, english = FoldedEnglish({}), SearchEnglish({})
    assert folded.stem("Rényi") == folded.stem("Renyi") == english.stem("Renyi") == "renyi"
    assert folded.stem("Divergences") == english.stem("Divergences")
    assert english.stem("Rényi") != english.stem("Renyi")  # what the extension changes


def test_browser_half_folds_before_the_porter_stemmer() -> None:
    code = FoldedEnglish.js_stemmer_code
    assert code.startswith(SearchEnglish.js_stemmer_code)  # Sphinx's stemmer, then the wrap
    assert 'normalize("NFKD")' in code and "\\p{M}" in code
    assert code.rstrip().endswith("})(Stemmer);")


class _Config:
    def __init__(self, language: str | None, html_search_language: str | None = None) -> None:
        self.language = language
        self.html_search_language = html_search_language


class _App:
    def __init__(self) -> None:
        self.languages: list[type] = []
        self.handlers: dict[str, object] = {}

    def add_search_language(self, cls: type) -> None:
        self.languages.append(cls)
        languages[cls.lang] = cls  # what Sphinx's own add_search_language does

    def connect(self, event: str, handler: object) -> None:
        self.handlers[event] = handler


@pytest.mark.parametrize(("language", "search", "chosen"), [
    ("en", None, "en_folded"),
    (None, None, "en_folded"),
    ("en_GB", None, "en_folded"),
    ("en", "en", "en_folded"),
    ("fr", None, None),  # another language keeps its own stemmer
    ("en", "de", "de"),  # an explicit search language is respected
])
def test_setup_registers_and_chooses_the_folded_language(language, search, chosen) -> None:
    app = _App()
    meta = search_folding.setup(app)
    assert app.languages == [FoldedEnglish] and meta["parallel_read_safe"]
    assert languages[FoldedEnglish.lang] is FoldedEnglish
    config = _Config(language, search)
    app.handlers["config-inited"](app, config)
    assert config.html_search_language == chosen
