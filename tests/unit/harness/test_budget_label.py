"""One budget, however it is typed, is one label: the configuration keeps the
label `parse_budget_bytes` reports, so a run's id never depends on the typing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.budget import parse_budget_bytes
from harness.budget_label import budget_label
from harness.config import RunConfig
from harness.model_configs import preset

GEOM = preset("falcon-h1-7b")


@pytest.mark.parametrize("typed, label", [
    ("b83", "b83"), ("B83", "b83"), ("b083", "b83"), (" b83 ", "b83"),
    ("252p", "252p"), ("252P", "252p"), ("0252p", "252p"),
    ("12GiB", "12GiB"), ("12gib", "12GiB"), ("12 GIB", "12GiB"), ("1.5gb", "1.5GB"),
    ("123456789b", "123456789B"),
    # one number, one spelling: zeros before it or after its point name the same bytes
    ("12.0GiB", "12GiB"), ("012 gib", "12GiB"), ("1.50GB", "1.5GB"), ("00.50GiB", "0.5GiB"),
    ("120.000MB", "120MB"), ("100GiB", "100GiB"),
])
def test_each_typing_of_a_budget_has_one_label(typed, label):
    assert budget_label(typed) == label
    assert parse_budget_bytes(typed, GEOM, "s2")[1] == label


def test_text_in_no_budget_form_is_left_for_the_parser_to_refuse():
    assert budget_label(" bogus ") == "bogus"
    assert budget_label("b\uff18\uff13") == "b\uff18\uff13"      # fullwidth digits are not 83
    long = "b" + "9" * 5000                 # never read as a number: the parser refuses it
    assert budget_label(long) == long


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["b", "B"]),
       st.integers(min_value=0, max_value=3))
def test_the_label_is_the_parsers_for_every_checkpoint_count(n, letter, zeros):
    typed = f"{letter}{'0' * zeros}{n}"
    assert budget_label(typed) == parse_budget_bytes(typed, GEOM, "s1")[1] == f"b{n}"


def test_a_configuration_typed_two_ways_is_one_configuration():
    a = RunConfig(org="S2", budget="B083")
    b = RunConfig(org="s2", budget="b83")
    assert (a.org, a.budget) == ("s2", "b83")
    assert a == b and a.to_dict() == b.to_dict()


@given(st.integers(min_value=1, max_value=10**4), st.integers(min_value=0, max_value=3),
       st.integers(min_value=0, max_value=3), st.sampled_from(["GiB", "gib", " MB", "KiB"]))
def test_a_size_padded_with_zeros_is_the_same_label_and_bytes(n, lead, trail, unit):
    plain, padded = f"{n}{unit}", f"{'0' * lead}{n}{'.' + '0' * trail if trail else ''}{unit}"
    assert budget_label(padded) == budget_label(plain)
    assert parse_budget_bytes(padded, GEOM, "s2") == parse_budget_bytes(plain, GEOM, "s2")
