"""The rules of the chapters' parameters (grpo_companion.book.parameters): each accepts its
valid values and refuses the rest with a message naming the parameter and its range."""

from __future__ import annotations

import math

import pytest

from grpo_companion.book import parameters

VALID = [("quick", True), ("seed", 0), ("seed", 2**64 - 1), ("device", "cpu"),
         ("device", "cuda:1"), ("beta", 1e-3), ("p_ref", 0.5), ("group_size", 2), ("eps", 0.0),
         ("clip_eps", 0.2), ("mu", 1), ("alpha", 0.5), ("lr", 2e-4), ("temperature", 0.1),
         ("xi", -0.5), ("betas", [0.1, 3.0]), ("p_refs", (0.1,)), ("n_seeds", None),
         ("n_iterations", 1)]
INVALID = [("quick", 1, "quick must be True or False"),
           ("seed", -1, "seed must be an integer in [0, 2**64 - 1]"),
           ("device", "gpu", "device must be 'cpu', 'cuda' or 'cuda:N'"),
           ("beta", 0.0, "beta must be > 0 and finite"),
           ("beta", math.inf, "beta must be > 0 and finite"),
           ("beta", math.nan, "beta must be a number, got nan"),
           ("p_ref", 0.0, "p_ref must be in (0, 1)"),
           ("group_size", 1, "group_size must be an integer >= 2"),
           ("group_size", 4.0, "group_size must be an integer >= 2"),
           ("eps", -1e-9, "eps must be >= 0"),
           ("clip_eps", 1.0, "clip_eps must be in (0, 1)"),
           ("mu", 0, "mu must be an integer >= 1"),
           ("alpha", 1.0, "alpha must be in (0, 1)"),
           ("lr", -2e-4, "lr must be > 0"),
           ("temperature", 0, "temperature must be > 0"),
           ("xi", math.inf, "xi must be a finite real number"),
           ("betas", [], "betas must be a non-empty list"),
           ("betas", [0.1, 0.0], "betas[1] must be > 0"),
           ("n_seeds", 0, "n_seeds must be an integer >= 1, or None"),
           ("n_seeds", 2.5, "n_seeds must be an integer >= 1, or None"),
           ("gamma", 1, "parameter 'gamma' has no rule")]


@pytest.mark.parametrize(("name", "value"), VALID)
def test_valid_values_pass_unchanged(name, value):
    assert parameters.check_value(name, value) == value


@pytest.mark.parametrize(("name", "value", "message"), INVALID)
def test_invalid_values_name_the_parameter_and_its_range(name, value, message):
    with pytest.raises(ValueError) as err:
        parameters.check_value(name, value)
    assert message in str(err.value)


def test_every_rule_is_exercised_both_ways():
    """Each name of the table has a valid and an invalid case above, or is the list form of
    one that has (the list wrapper itself is tested through ``betas``): a rule added without
    tests fails here."""
    tested = {name for name, _ in VALID} & {name for name, _, _ in INVALID}
    untested = {name for name in parameters.RULES
                if name not in tested and not (name.endswith("s") and name[:-1] in tested)}
    assert untested == set()
    assert "betas" in tested
