"""Final-answer extraction and normalised comparison for competition math (MATH, AIME).

Semantics follow the Hendrycks MATH answer checker (``strip_string`` / ``is_equiv``, as
used by verl's ``reward_score/math.py``), extended with exact numeric equality:

* `last_boxed_only_string` finds the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested
  braces matched) or ``\\boxed 5`` form; `remove_boxed` returns its content.
* `normalize_math_answer` strips what does not change the value: spacing commands
  (``\\!``, ``\\,``, ``\\;``, ``\\ ``, spaces; a ``\\\\`` row break is kept, so
  ``\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}`` becomes
  ``\\begin{pmatrix}1\\\\-2\\end{pmatrix}``), ``\\left`` / ``\\right``,
  ``\\displaystyle``, degree signs (``^\\circ``), dollars, percent signs, a trailing
  unit in ``\\text{ cm}`` / ``\\mbox{...}``, a trailing ``.``, a short ``x =`` prefix,
  thousands separators; it writes ``\\dfrac`` / ``\\tfrac`` as ``\\frac``, ``\\frac12``
  as ``\\frac{1}{2}``, ``\\sqrt3`` as ``\\sqrt{3}`` and ``.5`` as ``0.5``.
* `math_equal(a, b)`: the normalised strings are equal, or both parse (`parse_number`) to
  the same rational number: ``0.5 == \\frac12 == 1/2 == \\frac{2}{4}``, ``-\\frac{1}{2} ==
  \\frac{-1}{2}``, ``1,000 == 1000``. Numbers compare exactly (`fractions.Fraction`), so
  ``0.333`` is not ``1/3``.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) of `text`, braces
    included; None when there is none or its braces never close."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    if text.startswith(" ", i):  # "\boxed 5$" form: up to the next "$" or end
        rest = text[i + 1 :]
        token = rest.split("$", 1)[0].strip()
        return f"{cmd} {token}" if token else None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[start : j + 1]
    return None


def remove_boxed(boxed: str) -> str:
    """``\\boxed{x}`` -> ``x`` (also ``\\fbox{x}`` and ``\\boxed x``)."""
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1 : -1]
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1 :]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last box of `text`, or None."""
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed)


# ---- normalisation -----------------------------------------------------------------------

# A TeX row break ``\\`` is matched first and kept, so the second backslash of
# ``\\ `` is never read as the spacing command ``\ `` (verl's ``math_dapo`` normaliser does).
_SPACING = re.compile(r"\\\\|\\[!,;: ]|\\quad(?![a-zA-Z])|\\qquad(?![a-zA-Z])")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])|\\displaystyle(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°")
_TRAILING_UNIT = re.compile(r"^(.+?)\s*\\(?:text|mbox|mathrm)\s*\{[^{}]*\}(?:\^\{?\d\}?)?\s*$")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{((?:[^{}]|\{[^{}]*\})*)\}")  # one brace level inside
_SHORT_LHS = re.compile(r"[a-zA-Z][a-zA-Z0-9_]?")
_SQRT_SHORT = re.compile(r"\\sqrt([^{\[\\])")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _read_arg(s: str, i: int) -> tuple[str, int] | None:
    """One TeX argument at `s[i]`: a brace group (content, end) or a single character."""
    if i >= len(s):
        return None
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return s[i + 1 : j], j + 1
    return None


def _fix_fracs(s: str) -> str:
    """``\\frac12`` / ``\\frac1{2}`` / ``\\frac{1}2`` -> ``\\frac{1}{2}`` (after spaces
    are removed); malformed fractions are left as they are."""
    out: list[str] = []
    i = 0
    while True:
        j = s.find("\\frac", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i : j + 5])
        k = j + 5
        num = _read_arg(s, k)
        den = _read_arg(s, num[1]) if num else None
        if num is None or den is None:
            out.append(s[k:])
            return "".join(out)
        out.append("{" + _fix_fracs(num[0]) + "}{" + _fix_fracs(den[0]) + "}")
        i = den[1]


def _space_or_row_break(m: re.Match) -> str:
    return m.group() if m.group() == "\\\\" else " "


def normalize_math_answer(answer: str) -> str:
    """Canonical string form of a final answer (see the module docstring)."""
    s = str(answer).strip().replace("\n", "")
    s = _SPACING.sub(_space_or_row_break, s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LEFT_RIGHT.sub("", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("{,}", "")
    m = _TRAILING_UNIT.match(s)
    if m and m.group(1).strip():
        s = m.group(1)
    s = _TEXT_WRAP.sub(r"\1", s)
    s = s.strip()
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        if _SHORT_LHS.fullmatch(lhs.strip()) and rhs.strip():
            s = rhs
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    s = s.rstrip(".")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", s)  # ".5" -> "0.5", "{.5}" -> "{0.5}"
    if len(s) > 2 and s.startswith("{") and s.endswith("}") and _read_arg(s, 0) == (s[1:-1], len(s)):
        s = s[1:-1]
    return s


# ---- numbers ----------------------------------------------------------------------------

_NUM = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_DECIMAL = re.compile(_NUM)
_TEX_FRAC = re.compile(rf"(-?)\\frac\{{({_NUM})\}}\{{({_NUM})\}}")
_SLASH = re.compile(rf"({_NUM})/({_NUM})")


def parse_number(normalized: str) -> Fraction | None:
    """The rational value of a normalised answer that is a plain number, ``a/b`` or
    ``\\frac{a}{b}`` (signs allowed); None for anything else or a zero denominator."""
    try:
        if _DECIMAL.fullmatch(normalized):
            return Fraction(normalized)
        m = _TEX_FRAC.fullmatch(normalized)
        if m:
            den = Fraction(m.group(3))
            if den == 0:
                return None
            value = Fraction(m.group(2)) / den
            return -value if m.group(1) else value
        m = _SLASH.fullmatch(normalized)
        if m:
            den = Fraction(m.group(2))
            return None if den == 0 else Fraction(m.group(1)) / den
    except (ValueError, ZeroDivisionError):
        return None
    return None


def canonical_answer(answer: str) -> str:
    """The normalised answer, with numbers in one canonical form (``"1/2"``, ``"3"``), so
    equal answers are equal strings (what majority voting compares)."""
    s = normalize_math_answer(answer)
    value = parse_number(s)
    return s if value is None else str(value)


def math_equal(prediction: str | None, reference: str | None) -> bool:
    """True when two final answers are the same after normalisation, or the same number."""
    if prediction is None or reference is None:
        return False
    a, b = normalize_math_answer(prediction), normalize_math_answer(reference)
    if a == b:
        return bool(a)
    x, y = parse_number(a), parse_number(b)
    return x is not None and x == y
