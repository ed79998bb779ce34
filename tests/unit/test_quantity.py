"""Kubernetes quantities: parsing, formatting, resource-list arithmetic."""

import re
from fractions import Fraction

import pytest

from gangctl.api.quantity import (
    QUANTITY_PATTERN,
    ResourceList,
    fits,
    format_quantity,
    is_quantity,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("1.5", Fraction(3, 2)),
        ("4Gi", Fraction(4 * 2**30)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("2e-3", Fraction(2, 1000)),
        ("100M", Fraction(100 * 10**6)),
        ("8k", Fraction(8000)),
        ("1Ki", Fraction(1024)),
        ("0.5Gi", Fraction(2**29)),
        ("250u", Fraction(250, 10**6)),
        ("10n", Fraction(10, 10**9)),
        ("1E", Fraction(10**18)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("+3", Fraction(3)),
        ("-1", Fraction(-1)),
        ("0", Fraction(0)),
        (3, Fraction(3)),
        (2.0, Fraction(2)),
    ],
)
def test_parse(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "1K", "1Gb", "1.2.3", "e3", "1e", "1e3.5", " 1", "1 ", "1Gi ", "m", "--1", "1ki", "0x10", "1\n"],
)
def test_malformed_raises_naming_the_string(bad):
    with pytest.raises(ValueError) as err:
        parse_quantity(bad)
    assert repr(bad) in str(err.value)
    assert not is_quantity(bad)


@pytest.mark.parametrize("bad", [True, None, [1], float("nan")])
def test_non_quantity_types_raise(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


@pytest.mark.parametrize(
    "text",
    ["500m", "2", "1.5", "4Gi", "1e3", "100M", "8k", "+1", "-2.5Mi", ".5", "5.", "1E-3", "10n", "3u", "7E"],
)
def test_pattern_accepts_what_the_parser_accepts(text):
    assert re.search(QUANTITY_PATTERN, text)
    parse_quantity(text)


@pytest.mark.parametrize("text", ["", "abc", "1K", "1Gb", "1.2.3", "1e", "1e3.5", " 1", "1ki", "Gi"])
def test_pattern_rejects_what_the_parser_rejects(text):
    assert not re.search(QUANTITY_PATTERN, text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction(1, 2), "500m"),
        (Fraction(2), "2"),
        (Fraction(3, 2), "1500m"),
        (Fraction(4 * 2**30), "4294967296"),
        (Fraction(1, 4000), "250u"),
        (Fraction(1, 3), "333333334n"),
        (0, "0"),
    ],
)
def test_format(value, text):
    assert format_quantity(value) == text


def test_format_round_trips():
    for text in ["500m", "2", "4Gi", "1e3", "100M", "250u"]:
        assert parse_quantity(format_quantity(parse_quantity(text))) == parse_quantity(text)


def test_resource_list_add_scale_fits():
    per_node = ResourceList({"cpu": "500m", "memory": "4Gi", "nvidia.com/gpu": 1})
    gang = per_node.scale(4)
    assert gang.to_dict() == {"cpu": "2", "memory": str(16 * 2**30), "nvidia.com/gpu": "4"}
    assert per_node.add({"cpu": "1500m", "ephemeral-storage": "1G"}).to_dict() == {
        "cpu": "2",
        "memory": str(4 * 2**30),
        "nvidia.com/gpu": "1",
        "ephemeral-storage": "1000000000",
    }
    free = {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": "4"}
    assert ResourceList.fits(gang, free)
    assert fits(gang, free)
    assert not ResourceList.fits(gang.add({"cpu": "1m"}), free)
    assert not fits({"nvidia.com/gpu": 1}, {"cpu": 8})  # absent in free means none free
    assert fits({}, {})


def test_resource_list_shortfall_and_subtract():
    req = ResourceList({"cpu": 4, "nvidia.com/gpu": 8})
    assert req.shortfall({"cpu": "4", "nvidia.com/gpu": 6}) == {"nvidia.com/gpu": 2}
    assert ResourceList({"cpu": 1}).subtract({"cpu": "250m"}) == {"cpu": Fraction(3, 4)}
    assert req.get_amount("memory") == 0


def test_resource_list_error_names_the_resource():
    with pytest.raises(ValueError, match=r"memory: invalid quantity '4GB'"):
        ResourceList({"cpu": "1", "memory": "4GB"})
