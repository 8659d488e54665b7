"""LEB128 varints, written: unsigned, and zigzag for signed. `cursor.py` reads them back.

Always the minimal encoding, so one module has exactly one byte string and the reader can
reject padded forms.
"""

from __future__ import annotations


def uvarint(value: int) -> bytes:
    """7 bits per byte, low bits first, high bit set on every byte but the last."""
    if value < 0:
        raise ValueError(f"uvarint of a negative number: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> int:
    """0, -1, 1, -2, … → 0, 1, 2, 3, …: small magnitudes stay short whatever their sign."""
    return value * 2 if value >= 0 else -value * 2 - 1


def unzigzag(value: int) -> int:
    return value >> 1 if not value & 1 else -(value >> 1) - 1


def svarint(value: int) -> bytes:
    return uvarint(zigzag(value))
