"""Kubernetes resource quantities ("500m", "4Gi", "1e3") as exact Fractions, and resource lists."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from fractions import Fraction

# The quantity grammar of k8s.io/apimachinery/pkg/api/resource (ParseQuantity), anchored for Go's RE2:
#   <signedNumber><suffix>, suffix = Ki|Mi|Gi|Ti|Pi|Ei | n|u|m|""|k|M|G|T|P|E | (e|E)<signed integer>
# This is the pattern controller-gen emits for resource.Quantity, except that the exponent is an
# integer, as ParseQuantity requires ("1e3.5" is rejected by it).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
)

_QUANTITY_RE = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: str | int | float | Fraction) -> Fraction:
    """Parse a Kubernetes quantity exactly; raise ValueError naming the bad value."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}: a boolean is not a quantity")
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"invalid quantity {value!r}: not a finite number")
        return Fraction(repr(value))
    if not isinstance(value, str):
        raise ValueError(f"invalid quantity {value!r}: expected a string or a number")
    match = _QUANTITY_RE.fullmatch(value)
    if match is None:
        raise ValueError(
            f"invalid quantity {value!r}: expected a number with an optional suffix "
            "(m, k, M, G, Ki, Mi, Gi, e3, ...), e.g. '500m', '2', '4Gi'"
        )
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def is_quantity(value: object) -> bool:
    """True when value parses as a quantity."""
    try:
        parse_quantity(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def format_quantity(value: Fraction | int) -> str:
    """Canonical short form: "2", "500m", "250u", "1n" (fractions below 1n are rounded up, as k8s does)."""
    value = Fraction(value)
    for suffix, scale in (("", 1), ("m", 10**3), ("u", 10**6), ("n", 10**9)):
        scaled = value * scale
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return f"{math.ceil(value * 10**9)}n"


def format_amount(resource: str, value: Fraction | int) -> str:
    """An amount as a person reads it in Kubernetes: bytes (memory, storage, hugepages) in the largest
    binary suffix that divides them ("4Gi", "1536Mi"), anything else in the canonical short form
    ("500m" CPU, "8" GPUs)."""
    value = Fraction(value)
    if resource in ("memory", "ephemeral-storage", "storage") or resource.startswith("hugepages-"):
        for suffix, scale in sorted(_BINARY.items(), key=lambda item: -item[1]):
            if value and abs(value) >= scale and (value / scale).denominator == 1:
                return f"{value / scale}{suffix}"
    return format_quantity(value)


class ResourceList(Mapping[str, Fraction]):
    """An immutable map of resource name to exact amount, e.g. {"cpu": 1/2, "nvidia.com/gpu": 8}."""

    __slots__ = ("_amounts",)

    def __init__(self, amounts: Mapping[str, str | int | float | Fraction] | None = None) -> None:
        parsed: dict[str, Fraction] = {}
        for name, raw in (amounts or {}).items():
            try:
                parsed[name] = parse_quantity(raw)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
        self._amounts = parsed

    def __getitem__(self, name: str) -> Fraction:
        return self._amounts[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __repr__(self) -> str:
        return f"ResourceList({self.to_dict()!r})"

    def get_amount(self, name: str) -> Fraction:
        """The amount of name, 0 when absent."""
        return self._amounts.get(name, Fraction(0))

    def add(self, other: Mapping[str, Fraction | int | str]) -> ResourceList:
        """Sum, key by key."""
        other = other if isinstance(other, ResourceList) else ResourceList(other)
        total = dict(self._amounts)
        for name, amount in other.items():
            total[name] = total.get(name, Fraction(0)) + amount
        return ResourceList(total)

    def subtract(self, other: Mapping[str, Fraction | int | str]) -> ResourceList:
        """Difference, key by key (may go negative)."""
        other = other if isinstance(other, ResourceList) else ResourceList(other)
        return self.add(ResourceList({name: -amount for name, amount in other.items()}))

    def scale(self, n: int | Fraction) -> ResourceList:
        """Every amount multiplied by n (e.g. per-node requests times the number of nodes)."""
        return ResourceList({name: amount * n for name, amount in self._amounts.items()})

    def shortfall(self, free: Mapping[str, Fraction | int | str]) -> ResourceList:
        """What is missing from free to hold self: only the positive deficits."""
        free = free if isinstance(free, ResourceList) else ResourceList(free)
        return ResourceList(
            {
                name: amount - free.get_amount(name)
                for name, amount in self._amounts.items()
                if amount > free.get_amount(name)
            }
        )

    @staticmethod
    def fits(req: Mapping[str, Fraction | int | str], free: Mapping[str, Fraction | int | str]) -> bool:
        """True when every requested amount is at most what is free (absent in free means 0)."""
        req = req if isinstance(req, ResourceList) else ResourceList(req)
        return not req.shortfall(free)

    def to_dict(self) -> dict[str, str]:
        """Canonical strings, ready for a Kubernetes object."""
        return {name: format_quantity(amount) for name, amount in self._amounts.items()}


def fits(req: Mapping[str, Fraction | int | str], free: Mapping[str, Fraction | int | str]) -> bool:
    """Module-level alias of ResourceList.fits."""
    return ResourceList.fits(req, free)
