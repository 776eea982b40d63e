"""A Jinja sandbox with budgets, for chat templates that come with untrusted GGUF files.

`jinja2.sandbox.ImmutableSandboxedEnvironment` stops attribute escapes and mutation, but
not work: nested `range(100000)` loops run for hours, `s ~ s` doubles a string to
gigabytes, `'x'|center(2**31)` builds 2 GB in one C call. A render here has

- a time budget (`RENDER_SECONDS` plus `RENDER_SECONDS_PER_MESSAGE` per message: some
  real templates take 2 ms a message on a loaded CPU): a watchdog raises an exception
  inside the rendering thread when it is exceeded (checked between Python bytecodes, so
  it stops any loop; the single C calls that could run long are refused by the size
  checks below);
- an allocation budget (`RENDER_CHARS` plus `RENDER_CHARS_PER_INPUT` per character of
  input): the strings and sequences the template builds (`~`, `+`, `*`, `%`, filters,
  method and macro calls, captured blocks) are counted, and an operation that would
  exceed what is left is refused before it runs where its size is known in advance
  (repetition, padding widths, `indent`, `replace`, format widths, big integers);
- an output budget (`OUTPUT_CHARS` plus `OUTPUT_CHARS_PER_INPUT` per input character).

Exceeding one raises `BudgetError` (a `SecurityError`), or `RenderTimeout` for time;
`llamay.tok.chat.render_chat` turns both into `ChatTemplateError`.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import re
import threading
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_SECONDS = 2.0
RENDER_SECONDS_PER_MESSAGE = 0.01
RENDER_CHARS = 1 << 24
RENDER_CHARS_PER_INPUT = 64
OUTPUT_CHARS = 1 << 20
OUTPUT_CHARS_PER_INPUT = 4
MAX_EXPONENT = 4096
MAX_INT_BITS = 1 << 16  # integers a template may compute with (~20,000 digits)
MAX_ARGUMENT = 1 << 20  # an integer argument of a filter or call (a width, a count)


class BudgetError(SecurityError):
    """A render would exceed its allocation or output budget."""


class RenderTimeout(BaseException):  # noqa: N818 - raised into a thread, like KeyboardInterrupt
    """Raised inside the rendering thread when its time budget is spent (a BaseException,
    so a template's or Jinja's `except Exception` cannot swallow it)."""


class Budget:
    """What one render may still build, in characters (or sequence elements)."""

    def __init__(self, chars: int, output: int, known: dict[int, int] | None = None):
        self.left = chars
        self.output = output
        self.known = known or {}  # rendered sizes of the input's containers

    def check(self, n: int, what: str) -> None:
        if n > self.left:
            raise BudgetError(
                f"{what} would build {n} characters or elements, over what is left of "
                f"the render's budget ({self.left})"
            )

    def charge(self, n: int, what: str) -> None:
        self.check(n, what)
        self.left -= n


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("budget", default=None)


def _budget() -> Budget:
    b = _BUDGET.get()
    if b is None:  # rendered outside `budgeted`: the default budget, per call
        b = Budget(RENDER_CHARS, OUTPUT_CHARS)
    return b


def input_chars(*values: Any) -> int:
    """Characters of the strings in `values` (dicts, lists, nested), counted iteratively."""
    n, stack = 0, list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return n


@contextmanager
def budgeted(input_size: int, *inputs: Any):
    """The budget of one render of `inputs` (`input_size` characters) in this context."""
    token = _BUDGET.set(
        Budget(
            RENDER_CHARS + RENDER_CHARS_PER_INPUT * input_size,
            OUTPUT_CHARS + OUTPUT_CHARS_PER_INPUT * input_size,
            container_sizes(*inputs),
        )
    )
    try:
        yield _BUDGET.get()
    finally:
        _BUDGET.reset(token)


def time_budget(n_messages: int) -> float:
    return RENDER_SECONDS + RENDER_SECONDS_PER_MESSAGE * n_messages


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


@contextmanager
def time_limit(seconds: float):
    """Raise `RenderTimeout` in this thread if the block runs longer than `seconds`.

    A watchdog timer injects the exception (CPython's PyThreadState_SetAsyncExc). The
    lock makes it race-free: once the block is done no injection starts, and one that
    came just before is cleared if it has not fired yet."""
    ident = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def fire():
        with lock:
            if not state["done"]:
                state["fired"] = True
                _set_async_exc(ctypes.c_ulong(ident), ctypes.py_object(RenderTimeout))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        try:
            yield
        finally:
            with lock:
                state["done"] = True
                timer.cancel()
                if state["fired"]:
                    _set_async_exc(ctypes.c_ulong(ident), None)  # clear if still pending
    except RenderTimeout:
        pass
    if state["fired"]:
        raise RenderTimeout


# -- size estimates --------------------------------------------------------------------------

# A width or precision in a %-format or str.format spec ("%20s", "{:>20}", "{:.20f}").
_WIDTHS = re.compile(r"\d+")
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")  # "{:>{w}}": a width from the arguments


def _flat_args(args: tuple, kwargs: dict) -> list:
    """Arguments, with a %-format's tuple or mapping operand opened."""
    out: list = []
    for a in (*args, *kwargs.values()):
        out.extend(a.values() if isinstance(a, dict) else a if isinstance(a, tuple) else (a,))
    return out


def _size(x: Any) -> int:
    if isinstance(x, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(x)
    return 0


def _format_width(fmt: Any) -> int:
    """The largest number written in a format string: a bound on the width it pads to."""
    if not isinstance(fmt, str):
        return 0
    return max((int(m) if len(m) < 20 else 10**20 for m in _WIDTHS.findall(fmt)), default=0)


def rendered_size(
    x: Any, limit: int, known: dict[int, int] | None = None, record: dict | None = None
) -> int:
    """An upper bound on the length of `str(x)` (or its JSON), computed without building
    it and given up (returning more than `limit`) as soon as it exceeds `limit`. A
    container shared many times (`[big] * 100`, `l + l`) is walked once. `known`: sizes
    of containers walked before (the render's input, alive while it renders); `record`:
    where to keep the sizes walked."""
    memo: dict[int, int] = {} if record is None else record
    known = known or {}

    def size(v: Any, depth: int) -> int:
        if isinstance(v, str):
            return 6 * len(v) + 2  # quotes and escapes (\u0000: 6 characters) in a repr/JSON
        if isinstance(v, (int, float, bool)) or v is None:
            return 24 if not isinstance(v, int) or v.bit_length() < 64 else v.bit_length() // 3
        if not isinstance(v, (list, tuple, dict, set, frozenset)):
            return 64
        if depth > 64:
            return limit + 1
        key = id(v)
        if key in known:
            return known[key]
        if key in memo:
            return memo[key]
        total = 2
        items = v.items() if isinstance(v, dict) else ((e,) for e in v)
        for pair in items:
            for e in pair:
                total += size(e, depth + 1) + 2
            if total > limit:
                break
        memo[key] = total
        return total

    return size(x, 0)


def container_sizes(*values: Any) -> dict[int, int]:
    """The rendered size of every container in `values` (by id), each walked once."""
    out: dict[int, int] = {}
    for v in values:
        rendered_size(v, 1 << 62, record=out)
    return out


def _check_rendered(b: Budget, values: Iterable[Any], what: str) -> None:
    """Before values are turned into text: containers' rendered size within the budget."""
    for v in values:
        if isinstance(v, (list, tuple, dict, set, frozenset)):
            b.check(rendered_size(v, b.left, b.known), what)


def _replace_size(s: Any, old: Any, new: Any) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    hits = len(s) + 1 if old == "" else s.count(old)
    return len(s) + hits * max(len(new) - len(old), 0)


def _ints(values: Iterable[Any]) -> int:
    return max(
        (abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)), default=0
    )


# Filters that turn their value or arguments into text (a container's whole rendering).
_STRINGIFYING = frozenset("string tojson pprint join format urlencode xmlattr".split())

# Filters and str methods whose integer arguments are widths or counts of what they build.
_SIZED_BY_ARGUMENTS = frozenset(
    "center ljust rjust zfill indent wordwrap truncate expandtabs slice batch lipsum "
    "generate_lorem_ipsum tojson pprint".split()
)


def _estimate(name: str, value: Any, args: tuple, kwargs: dict) -> int:
    """Size an amplifying filter or str method would build, known before it runs."""
    n = _size(value)
    if name in _SIZED_BY_ARGUMENTS:
        k = _ints((*args, *kwargs.values()))
        if k > MAX_ARGUMENT:
            raise BudgetError(f"{name!r} with an argument of {k} (over {MAX_ARGUMENT})")
        n = max(n, k)
    if name in ("replace",) and len(args) >= 2:
        n = max(n, _replace_size(value, args[0], args[1]))
    elif name == "indent" and isinstance(value, str):
        width = args[0] if args else kwargs.get("width", 4)
        w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        n = max(n, len(value) + (value.count("\n") + 1) * max(w, 0))
    elif name in ("format", "format_map", "%"):
        width = _format_width(value)
        if isinstance(value, str) and ("*" in value or _NESTED_FIELD.search(value)):
            width = max(width, _ints(_flat_args(args, kwargs)))  # widths given as arguments
        if width > MAX_ARGUMENT:
            raise BudgetError(f"{name!r} with a width of {width} (over {MAX_ARGUMENT})")
        n = max(n, width + _size(value))
    elif name == "expandtabs" and isinstance(value, str):
        tab = _ints((*args, *kwargs.values())) or 8
        n = max(n, len(value) + value.count("\t") * tab)
    return n


# -- the environment -------------------------------------------------------------------------


class _BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` through the environment's bounded join (Jinja calls a module-level
    `str_join` for it, which no sandbox hook sees)."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.str_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _bounded_join(pieces: Iterable[Any], what: str) -> str:
    """ "".join with the budget checked as the pieces come (a block's or the output's)."""
    b = _budget()
    out, n = [], 0
    for p in pieces:
        if not isinstance(p, str):
            _check_rendered(b, (p,), what)
            p = str(p)
        n += len(p)
        b.check(n, what)
        out.append(p)
    b.charge(n, what)
    return "".join(out)


def _bounded_filter(name: str, fn):
    offset = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        b = _budget()
        value = args[offset] if len(args) > offset else None
        if name in _STRINGIFYING:
            _check_rendered(b, (*args[offset:], *kwargs.values()), f"filter {name!r}")
        b.check(_estimate(name, value, args[offset + 1 :], kwargs), f"filter {name!r}")
        out = fn(*args, **kwargs)
        b.charge(_size(out), f"filter {name!r}")
        return out

    return wrapper


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox plus the budgets of this module (see its docstring)."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset(["+", "*", "**", "%"])

    def __init__(self, **kw: Any):
        super().__init__(finalize=self._finalize_output, **kw)
        self.filters = {k: _bounded_filter(k, f) for k, f in self.filters.items()}

    def add_filter(self, name: str, fn) -> None:
        self.filters[name] = _bounded_filter(name, fn)

    def unsafe_undefined(self, obj: Any, attribute: str):
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    @staticmethod
    def _finalize_output(value: Any) -> Any:
        """Each `{{ value }}` before Jinja turns it into text."""
        _check_rendered(_budget(), (value,), "output")
        return value

    @staticmethod
    def concat(pieces: Iterable[Any]) -> str:
        return _bounded_join(pieces, "a block")

    @staticmethod
    def str_join(pieces: Iterable[Any]) -> str:
        return _bounded_join(pieces, "'~'")

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        b = _budget()
        what = f"'{operator}'"
        big = isinstance(left, int) and isinstance(right, int)
        if operator == "*":
            if big:
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise BudgetError("chat template tried to compute a too large number")
            else:
                for seq, k in ((left, right), (right, left)):
                    if isinstance(k, int):
                        b.check(_size(seq) * max(k, 0), what)
        elif operator == "+":
            b.check(_size(left) + _size(right), what)
        elif operator == "**":
            if isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
                raise BudgetError("chat template tried to compute a too large power")
            if big and left.bit_length() * max(right, 0) > MAX_INT_BITS:
                raise BudgetError("chat template tried to compute a too large number")
        elif operator == "%" and isinstance(left, str):
            _check_rendered(b, (right,), what)
            b.check(_estimate("%", left, (right,), {}), what)
        out = super().call_binop(context, operator, left, right)
        b.charge(_size(out), what)
        return out

    def call(__self, __context, __obj, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        b = _budget()
        name = getattr(__obj, "__name__", type(__obj).__name__)
        owner = getattr(__obj, "__self__", None)
        if owner is None:  # the sandbox's str.format wrapper
            owner = getattr(getattr(__obj, "__wrapped__", None), "__self__", None)
        value = owner if isinstance(owner, str) else None
        what = f"call of {name!r}"
        if not isinstance(__obj, Macro):  # a macro's output is charged as its body joins
            if value is not None:  # a str method (join, format...) renders its arguments
                _check_rendered(b, (*args, *kwargs.values()), what)
            b.check(_estimate(name, value, args, kwargs), what)
        out = super().call(__context, __obj, *args, **kwargs)
        if not isinstance(__obj, Macro):
            b.charge(_size(out), what)
        return out
