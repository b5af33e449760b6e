"""Figures for people, the one rule the console and the ledger's refusals write numbers by
(controlplane.console.templatetags.console_format wraps it for templates): thousands separators, at most two
decimals for a quantity of 0.01 or more, three significant digits below that (a price per token
is 0.00681, or 6.81 x 10⁻⁵ under a thousandth, never 0.00 or 6.81e-05), and a unit in the singular
for exactly one ("1 GPU", "8 GPUs"). `exact` is the value as stored, for a title to show where
the figure shown is rounded. Pure: no Django."""

import math
from decimal import Decimal
from fractions import Fraction

Number = int | float | Fraction | Decimal

# Units said the same for one and many: model units, rates ("MU/min"), times and sizes.
INVARIANT_UNITS = {"MU", "s", "ms", "min", "h", "%", "GiB", "MiB"}

TIMES = "\N{MULTIPLICATION SIGN}"
SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")

# Below this a figure is written in powers of ten: 0.000068 is hard to read, 6.8 x 10⁻⁵ is not.
SCIENTIFIC_BELOW = 0.001


def shown(value: Number | None, places: int = 2) -> str:
    """`value` as people read it: 2880000 -> "2,880,000", 3388.235294 -> "3,388.24", 2.5 -> "2.5",
    0.0523 -> "0.05", 0.00681 -> "0.00681", 0.0000681 -> "6.81 x 10⁻⁵" (a multiplication sign
    for the x), None -> "—"."""
    if value is None:
        return "—"
    number = float(value)
    if not math.isfinite(number):
        return str(number)
    if _whole(value):
        return f"{int(value):,}"
    size = abs(number)
    if size >= 0.01:
        return _trimmed(f"{number:,.{places}f}")
    if size >= SCIENTIFIC_BELOW:
        return _trimmed(f"{number:.{2 - math.floor(math.log10(size))}f}")
    mantissa, exponent = f"{number:.2e}".split("e")
    return f"{_trimmed(mantissa)} {TIMES} 10{str(int(exponent)).translate(SUPERSCRIPT)}"


def exact(value: Number | None) -> str:
    """The value as stored, for a title: 57600/17 -> "3388.235294117647 (57600/17)"."""
    if value is None:
        return ""
    if isinstance(value, Fraction) and value.denominator != 1:
        return f"{float(value)!r} ({value.numerator}/{value.denominator})"
    if _whole(value):
        return str(int(value))
    return repr(float(value))


def rounded(value: Number | None, places: int = 2) -> bool:
    """Whether `shown` loses anything of the value (then a title says it exactly)."""
    return value is not None and shown(value, places).replace(",", "") != exact(value)


def with_unit(value: Number | None, unit: str, places: int = 2) -> str:
    """The figure and its unit, singular for exactly one: "1 GPU", "8 GPUs", "3,388.24 MU/min"."""
    text = shown(value, places)
    return f"{text} {unit_for(text, unit)}"


def unit_for(text: str, unit: str) -> str:
    """The unit after a figure shown as `text`: singular after "1" (0.999 shows "1 GPU")."""
    if text in ("1", "—") or "/" in unit or unit in INVARIANT_UNITS:
        return unit
    return unit[:-1] + "ies" if unit.endswith("y") else unit + "s"


def _whole(value: Number) -> bool:
    if isinstance(value, int):
        return True
    if isinstance(value, Fraction):
        return value.denominator == 1
    return float(value).is_integer()


def _trimmed(text: str) -> str:
    """Trailing zeros say nothing: "2.50" -> "2.5", "3.00" -> "3"."""
    return text.rstrip("0").rstrip(".") if "." in text else text
