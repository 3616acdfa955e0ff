"""Money, prices and time as the market counts them: int micro-units and microseconds."""
from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Union

MICRO_UNITS = 1_000_000
MICROS_PER_SECOND = 1_000_000
MICROS_PER_HOUR = 3600 * MICROS_PER_SECOND
INF_PRICE = 2**63 - 1  # "No price": nothing can be obtained.
_MAX_PRICE = 10**15     # The server's largest accepted price (a billion units per hour).


def units(amount: Union[int, float, str, Decimal], field: str = "price") -> int:
    """Converts units of money (``12.5``, ``"12.5"``) to exact micro-units.

    Raises ValueError naming ``field`` for NaN, infinities, negatives, more than six
    decimals and amounts above the market's largest price.
    """
    if isinstance(amount, float) and (math.isnan(amount) or math.isinf(amount)):
        raise ValueError(f"{field}: not a finite number: {amount}")
    try:
        d = Decimal(str(amount))
    except InvalidOperation:
        raise ValueError(f"{field}: not a number: {amount!r}") from None
    if not d.is_finite():
        raise ValueError(f"{field}: not a finite number: {amount}")
    if d < 0:
        raise ValueError(f"{field}: must not be negative: {amount}")
    micro = d * MICRO_UNITS
    if micro != micro.to_integral_value():
        raise ValueError(f"{field}: at most six decimals: {amount}")
    if micro > _MAX_PRICE:
        raise ValueError(f"{field}: above the largest price {_MAX_PRICE // MICRO_UNITS}: {amount}")
    return int(micro)


def format_money(micro: int) -> str:
    """Micro-units as units with up to six decimals (``12500000`` -> ``"12.5"``)."""
    if micro == INF_PRICE:
        return "inf"
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO_UNITS)
    if frac == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:06d}".rstrip("0")
