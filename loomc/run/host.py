"""Host imports of the control VM: the host functions and conversions control code can call.

`HostFunctions(context).table(names)` gives the interpreter, for each name in a
`VmProgram.host_names`, the implementation and the Python types of its parameters
(from `CONTROL_HOST`, so the checker and the VM agree on signatures). The VM checks
those types before the call; each function here checks what an `any` parameter holds.
The exact semantics are in docs/language.md §18.

Functions raise `VmRuntimeError` (or `VmMemoryExceeded`) without a position; the
interpreter adds the `path:line:col` of the calling instruction. `fail` raises
`PolicyFailure`, which reaches the client.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from loomc import strict_json
from loomc.check.intrinsics import CONTROL_CONVERSIONS, CONTROL_HOST
from loomc.run.errors import PolicyFailure, VmBudgetExceeded, VmMemoryExceeded, VmRuntimeError

# Control ints are Python ints bounded to |x| < 2**INT_BITS: wide enough for u64 and i64
# arithmetic without wrapping, narrow enough that no operation on them is slow.
INT_BITS = 4096
INT_LIMIT = 1 << INT_BITS
# How deep a list or map may nest for ==, contains, str() and json_encode (a cycle is infinitely deep).
MAX_NESTING = 256

TYPE_NAMES: dict[type, str] = {
    type(None): "null", bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes", list: "list",
    dict: "map",
}
PY_TYPES: dict[str, type | None] = {name: t for t, name in TYPE_NAMES.items()}
PY_TYPES["any"] = None


@dataclass
class HostContext:
    """What the host lends a VM: limits. One context may serve many VMs and threads.

    `instruction_budget` is the default per `Vm.call` (a call may pass its own).
    `max_value_bytes` bounds every value control code builds: a str counts one byte per
    character, bytes one per byte, a list or map eight per element or entry.
    """

    instruction_budget: int = 1_000_000
    max_value_bytes: int = 16 * 1024 * 1024
    max_call_depth: int = 200
    max_regex_pattern_chars: int = 1000
    # Building a str, bytes or list of n bytes costs n >> alloc_fuel_shift more instructions,
    # so the instruction budget also bounds what one call allocates in total: 256 bytes an
    # instruction, 256 MiB for the default budget, even if every value is kept.
    alloc_fuel_shift: int = 8

    @property
    def max_chars(self) -> int:
        return self.max_value_bytes

    @property
    def max_items(self) -> int:
        return max(self.max_value_bytes // 8, 1)


def type_name(v: Any) -> str:
    """`type_of`: a control type name, or "handle" for an opaque host object (a tokenizer)."""
    return TYPE_NAMES.get(type(v), "handle")


def too_large(what: str, size: int, limit: int, unit: str = "elements") -> VmMemoryExceeded:
    return VmMemoryExceeded(f"{what} would hold {size} {unit}; the limit is {limit}")


def int_overflow(r: int) -> VmRuntimeError:
    return VmRuntimeError(f"integer overflow: a {r.bit_length()}-bit result; control ints have at most {INT_BITS} bits")


def show(v: Any, limit: int = 80) -> str:
    """A short, control-syntax rendering of a value for error messages and failed expects."""
    text = _show(v, limit + 1, 0)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(v: Any, budget: int, depth: int) -> str:
    t = type(v)
    if v is None:
        return "null"
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return str(v) if v.bit_length() < 200 else f"<{v.bit_length()}-bit int>"
    if t is float or t is str:
        return json.dumps(v) if t is str else repr(v)
    if t is bytes:
        return "b" + json.dumps(v[:budget].decode("latin-1"))
    if depth > 8:
        return "..."
    parts: list[str] = []
    used = 0
    items = v.items() if t is dict else (v if t is list else None)
    if items is None:
        return f"<{type(v).__name__}>"
    for item in items:
        s = (json.dumps(item[0]) + ": " + _show(item[1], budget - used, depth + 1)) if t is dict \
            else _show(item, budget - used, depth + 1)
        parts.append(s)
        used += len(s) + 2
        if used > budget:
            break
    body = ", ".join(parts)
    return ("{" + body + "}") if t is dict else ("[" + body + "]")


def values_equal(a: Any, b: Any) -> bool:
    """`==`: structural and type-strict. 1 == 1.0 is false; NaN equals nothing; map order is ignored."""
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is list or ta is dict:
        return _deep_equal(a, b, 0, [0])
    return a == b


def _deep_equal(a: Any, b: Any, depth: int, steps: list[int]) -> bool:
    if a is b and type(a) is not float:
        return True
    ta = type(a)
    if ta is not type(b):
        return False
    if ta is not list and ta is not dict:
        return a == b
    if depth >= MAX_NESTING:
        raise VmRuntimeError(f"values nested more than {MAX_NESTING} deep (or cyclic) cannot be compared")
    if len(a) != len(b):
        return False
    steps[0] += len(a)
    if steps[0] > 1_000_000:
        raise VmBudgetExceeded("comparing these values visits more than 1000000 elements")
    if ta is list:
        return all(_deep_equal(x, y, depth + 1, steps) for x, y in zip(a, b))
    return all(k in b and _deep_equal(v, b[k], depth + 1, steps) for k, v in a.items())


_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


class HostFunctions:
    """The host imports, bound to one `HostContext`. Method `h_NAME` implements `NAME`."""

    def __init__(self, context: HostContext):
        self.context = context
        self.max_chars = context.max_chars
        self.max_items = context.max_items

    def table(self, names: tuple[str, ...]) -> list[tuple[Callable[..., Any], tuple[type | None, ...]]]:
        out = []
        for name in names:
            impl = getattr(self, "h_" + name, None)
            if name in CONTROL_CONVERSIONS:
                params: tuple[str, ...] = ("any",)
            elif name in CONTROL_HOST:
                params = CONTROL_HOST[name][0]
            else:
                impl = None
            if impl is None:
                raise VmRuntimeError(f"the program calls host function '{name}', which this runtime does not have")
            out.append((impl, tuple(PY_TYPES[p] for p in params)))
        return out

    # ---- sizes ------------------------------------------------------------------------

    def check_chars(self, what: str, n: int, unit: str = "characters") -> None:
        if n > self.max_chars:
            raise too_large(what, n, self.max_chars, unit)

    def check_items(self, what: str, n: int) -> None:
        if n > self.max_items:
            raise too_large(what, n, self.max_items)

    # ---- conversions ------------------------------------------------------------------

    def h_int(self, x: Any) -> int:
        t = type(x)
        if t is int:
            return x
        if t is bool:
            return int(x)
        if t is float:
            if not math.isfinite(x):
                raise VmRuntimeError(f"int() of {x!r}: not a finite number")
            r = int(x)  # truncates toward zero, like i64(2.7) in a config
            if not -INT_LIMIT < r < INT_LIMIT:
                raise int_overflow(r)
            return r
        if t is str:
            if len(x) > INT_BITS // 3 or not _INT_TEXT.fullmatch(x):
                raise VmRuntimeError(f"int() of {show(x)}: expected decimal digits with an optional sign")
            r = int(x)
            if not -INT_LIMIT < r < INT_LIMIT:
                raise int_overflow(r)
            return r
        raise VmRuntimeError(f"int() of {type_name(x)}: expected int, float, bool or str")

    def h_float(self, x: Any) -> float:
        t = type(x)
        if t is float:
            return x
        if t is int or t is bool:
            try:
                return float(x)
            except OverflowError:
                raise VmRuntimeError(f"float() of a {x.bit_length()}-bit int: too large for a float") from None
        if t is str:
            if len(x) > 400 or not _FLOAT_TEXT.fullmatch(x):
                raise VmRuntimeError(f"float() of {show(x)}: expected a decimal number such as 1.5 or -2e3")
            r = float(x)
            if math.isinf(r):
                raise VmRuntimeError(f"float() of {show(x)}: out of range")
            return r
        raise VmRuntimeError(f"float() of {type_name(x)}: expected int, float, bool or str")

    def h_str(self, x: Any) -> str:
        t = type(x)
        if t is str:
            return x
        if x is None:
            return "null"
        if t is bool:
            return "true" if x else "false"
        if t is int:
            return str(x)  # bounded to INT_BITS, well within Python's digit limit
        if t is float:
            return repr(x)  # shortest text that reads back as the same float: 0.1, 1.0, 1e+20, inf, nan
        if t is list or t is dict:
            return self.h_json_encode(x)
        if t is bytes:
            raise VmRuntimeError("str() of bytes: use decode_utf8(b)")
        raise VmRuntimeError(f"str() of {type_name(x)}")

    def h_bool(self, x: Any) -> bool:
        t = type(x)
        if t is bool:
            return x
        if t in (type(None), int, float, str, bytes, list, dict):
            return bool(x)  # null, 0, 0.0, "" and empty containers are false
        raise VmRuntimeError(f"bool() of {type_name(x)}")

    # ---- values -----------------------------------------------------------------------

    def h_len(self, x: Any) -> int:
        t = type(x)
        if t is str or t is list or t is dict or t is bytes:
            return len(x)
        raise VmRuntimeError(f"len() of {type_name(x)}: expected str, bytes, list or map")

    def h_type_of(self, x: Any) -> str:
        return type_name(x)

    def h_keys(self, m: dict) -> list:
        return list(m)

    def h_values(self, m: dict) -> list:
        return list(m.values())

    def h_has(self, m: dict, key: str) -> bool:
        return key in m

    def h_contains(self, haystack: Any, needle: Any) -> bool:
        t = type(haystack)
        if t is str:
            if type(needle) is not str:
                raise VmRuntimeError(f"contains(str, {type_name(needle)}): a str contains only strs")
            return needle in haystack
        if t is list:
            tn = type(needle)
            if tn is not list and tn is not dict:
                return any(type(x) is tn and x == needle for x in haystack)
            return any(values_equal(x, needle) for x in haystack)
        if t is dict:
            if type(needle) is not str:
                raise VmRuntimeError(f"contains(map, {type_name(needle)}): map keys are strs")
            return needle in haystack
        if t is bytes:
            if type(needle) is int:
                return 0 <= needle <= 255 and needle in haystack
            if type(needle) is bytes:
                return needle in haystack
            raise VmRuntimeError(f"contains(bytes, {type_name(needle)}): expected int or bytes")
        raise VmRuntimeError(f"contains() of {type_name(haystack)}: expected str, list, map or bytes")

    def h_slice(self, x: Any, start: int, end: int) -> Any:
        t = type(x)
        if t is not str and t is not list and t is not bytes:
            raise VmRuntimeError(f"slice() of {type_name(x)}: expected str, bytes or list")
        n = len(x)
        start = min(max(start, 0), n)
        end = min(max(end, start), n)
        return x[start:end]

    def h_append(self, xs: list, x: Any) -> None:
        if len(xs) >= self.max_items:
            raise too_large("a list", len(xs) + 1, self.max_items)
        xs.append(x)

    def h_min(self, a: Any, b: Any) -> Any:
        self._ordered("min", a, b)
        return b if b < a else a

    def h_max(self, a: Any, b: Any) -> Any:
        self._ordered("max", a, b)
        return b if b > a else a

    @staticmethod
    def _ordered(name: str, a: Any, b: Any) -> None:
        ta = type(a)
        if ta is not type(b) or ta not in (int, float, str):
            raise VmRuntimeError(f"{name}({type_name(a)}, {type_name(b)}): expected two ints, two floats or two strs")

    def h_abs(self, x: Any) -> Any:
        if type(x) is int or type(x) is float:
            return abs(x)
        raise VmRuntimeError(f"abs() of {type_name(x)}: expected int or float")

    def h_approx(self, a: float, b: float, tolerance: float) -> bool:
        return a == b or abs(a - b) <= tolerance

    def h_fail(self, status: int, message: str) -> None:
        if not 400 <= status <= 599:
            raise VmRuntimeError(f"fail() status must be in 400..599, got {status}")
        raise PolicyFailure(status, message)

    # ---- strings and bytes --------------------------------------------------------------

    def h_startswith(self, s: str, prefix: str) -> bool:
        return s.startswith(prefix)

    def h_endswith(self, s: str, suffix: str) -> bool:
        return s.endswith(suffix)

    def h_find(self, s: str, sub: str) -> int:
        return s.find(sub)

    def h_split(self, s: str, sep: str) -> list:
        if not sep:
            raise VmRuntimeError("split() with an empty separator")
        self.check_items("split()'s result", s.count(sep) + 1)
        return s.split(sep)

    def h_join(self, parts: list, sep: str) -> str:
        total = len(sep) * max(len(parts) - 1, 0)
        for p in parts:
            if type(p) is not str:
                raise VmRuntimeError(f"join() of a list holding {type_name(p)}: every element must be a str")
            total += len(p)
        self.check_chars("join()'s result", total)
        return sep.join(parts)

    def h_replace(self, s: str, old: str, new: str) -> str:
        count = s.count(old)  # "" occurs len(s) + 1 times
        self.check_chars("replace()'s result", len(s) + count * (len(new) - len(old)))
        return s.replace(old, new)

    def h_strip(self, s: str) -> str:
        return s.strip()

    def h_lower(self, s: str) -> str:
        r = s.lower()
        self.check_chars("lower()'s result", len(r))
        return r

    def h_upper(self, s: str) -> str:
        r = s.upper()
        self.check_chars("upper()'s result", len(r))
        return r

    def h_encode_utf8(self, s: str) -> bytes:
        r = s.encode("utf-8", "replace")  # a lone surrogate becomes "?"
        self.check_chars("encode_utf8()'s result", len(r), "bytes")
        return r

    def h_decode_utf8(self, b: bytes) -> str:
        return b.decode("utf-8", "replace")  # invalid sequences become U+FFFD

    def h_regex_match(self, pattern: str, s: str) -> Any:
        limit = self.context.max_regex_pattern_chars
        if len(pattern) > limit:
            raise VmRuntimeError(f"regex_match() pattern has {len(pattern)} characters; at most {limit} are allowed")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise VmRuntimeError(f"regex_match() pattern is invalid: {exc}") from None
        m = compiled.search(s)
        if m is None:
            return None
        return [m.group(0), *m.groups()]

    # ---- JSON -------------------------------------------------------------------------

    def h_json_encode(self, x: Any) -> str:
        self._json_ready(x, 0, [0, 0])
        try:
            r = json.dumps(x, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (ValueError, RecursionError) as exc:  # pragma: no cover - _json_ready rejects these first
            raise VmRuntimeError(f"json_encode(): {exc}") from None
        self.check_chars("json_encode()'s result", len(r))
        return r

    def _json_ready(self, x: Any, depth: int, counts: list[int]) -> None:
        """Reject what JSON cannot say, and bound the work before json.dumps does it."""
        t = type(x)
        counts[0] += 1
        if t is str:
            counts[1] += len(x)
        elif t is float:
            if not math.isfinite(x):
                raise VmRuntimeError(f"json_encode(): {x!r} is not JSON")
        elif t is list or t is dict:
            if depth >= MAX_NESTING:
                raise VmRuntimeError(f"json_encode(): values nested more than {MAX_NESTING} deep (or cyclic)")
            for k in x:
                if t is dict:
                    counts[1] += len(k)
                    self._json_ready(x[k], depth + 1, counts)
                else:
                    self._json_ready(k, depth + 1, counts)
        elif t is not int and t is not bool and x is not None:
            raise VmRuntimeError(f"json_encode(): {type_name(x)} is not JSON")
        if counts[0] > self.max_items or counts[1] > self.max_chars:
            raise too_large("json_encode()'s result", max(counts[0], counts[1]), self.max_chars, "characters")

    def h_json_decode(self, s: str) -> Any:
        """Strict JSON, or null: NaN/Infinity, duplicate keys, numbers out of range, lone
        surrogates and trailing text are all invalid. Null rather than an error because the
        text is usually the client's or the model's, and control code has no try/catch."""
        try:
            return strict_json.loads(s, int_limit=INT_LIMIT)
        except strict_json.StrictJsonError:
            return None

    # ---- tokenizers -------------------------------------------------------------------

    @staticmethod
    def _tokenizer(handle: Any, name: str) -> Any:
        if type(handle) in TYPE_NAMES or not (hasattr(handle, "encode") and hasattr(handle, "decode")):
            raise VmRuntimeError(f"{name}() needs a tokenizer handle from the host, got {type_name(handle)}")
        return handle

    def h_tokenize(self, handle: Any, text: str) -> list:
        """Token ids of `text`. Added tokens written in the text (`<|im_start|>`) are matched;
        the tokenizer's post-processor adds nothing (no BOS/EOS): templates write their own."""
        tok = self._tokenizer(handle, "tokenize")
        try:
            ids = tok.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # noqa: BLE001 - the tokenizer library's own errors
            raise VmRuntimeError(f"tokenize() failed: {exc}") from None
        return list(ids)

    def h_detokenize(self, handle: Any, ids: list) -> str:
        """Text of token ids, special tokens included (the policy decides what to hide)."""
        tok = self._tokenizer(handle, "detokenize")
        for i in ids:
            if type(i) is not int or not 0 <= i < 1 << 32:
                raise VmRuntimeError(f"detokenize() ids must be ints in 0..2^32, got {show(i)}")
        try:
            return tok.decode(ids, skip_special_tokens=False)
        except Exception as exc:  # noqa: BLE001
            raise VmRuntimeError(f"detokenize() failed: {exc}") from None


__all__ = ["HostContext", "HostFunctions", "INT_BITS", "INT_LIMIT", "MAX_NESTING", "PY_TYPES", "show", "type_name",
           "values_equal"]
