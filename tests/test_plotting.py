"""Every registered normalisation has a colour: fixed for the built-ins, assigned in
registration order for the ones a reader adds."""

from __future__ import annotations

import pytest

from grpo_companion import plotting, theory
from grpo_companion.plotting import EXTRA_PALETTE, VARIANT_COLORS, variant_color
from grpo_companion.theory.normalizations import NORMALIZATIONS


def _centred(succ, fail, n, cal, ops):
    return fail, succ


@pytest.fixture
def fresh_colours(monkeypatch):
    """An empty assignment table, so the test does not depend on earlier registrations."""
    monkeypatch.setattr(plotting, "_ASSIGNED", {})


def test_built_in_normalisations_have_their_fixed_colours():
    for name in ("mean_std", "mean_only", "rloo", "max_abs"):
        assert name in NORMALIZATIONS
        assert variant_color(name) == VARIANT_COLORS[name]
    assert variant_color("mean_only") == "#2ca02c"  # unchanged since the first chapters
    assert variant_color("mean_std") == variant_color("reference")  # GRPO is GRPO
    assert len(set(EXTRA_PALETTE)) == len(EXTRA_PALETTE)
    assert not set(EXTRA_PALETTE) & set(VARIANT_COLORS.values())


def test_every_registered_normalisation_has_a_colour(fresh_colours):
    for name in NORMALIZATIONS:
        assert variant_color(name).startswith("#")


def test_later_registrations_get_palette_colours_in_registration_order(fresh_colours):
    names = ["colour_test_a", "colour_test_b", "colour_test_c"]
    for name in names:
        theory.register_normalization(name, _centred, summary="for the colour test")
    try:
        before = [n for n in NORMALIZATIONS if n not in VARIANT_COLORS and n not in names]
        # asked for in another order than registered: the colours follow registration
        got = {name: variant_color(name) for name in reversed(names)}
        offset = len(before)
        for i, name in enumerate(names):
            assert got[name] == EXTRA_PALETTE[(offset + i) % len(EXTRA_PALETTE)]
        assert len(set(got.values())) == len(names)
        assert variant_color("colour_test_b") == got["colour_test_b"]  # stable
        theory.unregister_normalization("colour_test_a")
        assert variant_color("colour_test_c") == got["colour_test_c"]  # others keep theirs
        with pytest.raises(ValueError, match="registered normalisation"):
            variant_color("colour_test_a")  # no longer registered
    finally:
        for name in names:
            if name in NORMALIZATIONS:
                theory.unregister_normalization(name)


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="got 'no_such_variant'"):
        variant_color("no_such_variant")
