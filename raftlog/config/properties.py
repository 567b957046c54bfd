"""Java ``.properties`` syntax and the typed parsers every config value goes through.

``load_properties`` and ``parse_properties`` read the file format (continuations, escapes,
``key=value`` or ``key: value``); ``parse_int``/``parse_bool``/``parse_choice``/``parse_list``
turn one value into a Python value or raise :class:`ConfigError` naming the property.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

INT_MAX: Final = 2**31 - 1
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
MS_PER_MINUTE: Final = 60_000
MS_PER_HOUR: Final = 3_600_000


class ConfigError(ValueError):
    """A property is missing or has an invalid value; ``property_name`` says which."""

    def __init__(self, property_name: str, message: str) -> None:
        super().__init__(f"{property_name}: {message}")
        self.property_name = property_name


# --- Java .properties syntax ----------------------------------------------------------------

_WHITESPACE: Final = " \t\f"
_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def load_properties(path: Path | str) -> dict[str, str]:
    """Read a ``.properties`` file (UTF-8) into a dict; later keys win, as in Java.

    Raises:
        ConfigError: the file cannot be read or has a malformed ``\\uXXXX`` escape.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read properties file: {exc}") from exc
    return parse_properties(text)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text: ``#``/``!`` comments, ``key=value``, ``key: value`` or
    ``key value``, backslash line continuations and escapes. Values are whitespace-trimmed."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].lstrip(_WHITESPACE)
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and index < len(lines):
            line = line[:-1] + lines[index].lstrip(_WHITESPACE)
            index += 1
        if _continues(line):
            line = line[:-1]  # A continuation at end of file continues into nothing, as in Java.
        key, value = _split_property(line)
        result[key] = value.strip()
    return result


def _continues(line: str) -> bool:
    # An odd number of trailing backslashes: the last one is not itself escaped.
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_property(line: str) -> tuple[str, str]:
    position = 0
    while position < len(line) and line[position] not in "=:" + _WHITESPACE:
        position += 2 if line[position] == "\\" else 1
    key_end = min(position, len(line))
    while position < len(line) and line[position] in _WHITESPACE:
        position += 1
    if position < len(line) and line[position] in "=:":
        position += 1
    while position < len(line) and line[position] in _WHITESPACE:
        position += 1
    return _unescape(line[:key_end]), _unescape(line[position:])


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char != "\\" or position + 1 == len(text):
            out.append(char)
            position += 1
            continue
        escaped = text[position + 1]
        if escaped == "u":
            out.append(_unicode_escape(text[position + 2 : position + 6]))
            position += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        position += 2
    return "".join(out)


def _unicode_escape(digits: str) -> str:
    if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        raise ConfigError("<properties>", f"malformed \\uxxxx escape: \\u{digits}")
    return chr(int(digits, 16))


# --- Typed value parsers --------------------------------------------------------------------


def parse_int(name: str, text: str, minimum: int = LONG_MIN, maximum: int = LONG_MAX) -> int:
    """Parse a Kafka INT/LONG value within ``[minimum, maximum]``."""
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise ConfigError(name, f"expected an integer, got {text!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(name, f"value {value} outside [{minimum}, {maximum}]")
    return value


def parse_bool(name: str, text: str) -> bool:
    """Parse a Kafka BOOLEAN ("true"/"false", any case)."""
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(name, f"expected true or false, got {text!r}")
    return lowered == "true"


def parse_choice(name: str, text: str, choices: frozenset[str]) -> str:
    """Parse a value that must be one of ``choices`` (case-sensitive, as Kafka's ValidString)."""
    value = text.strip()
    if value not in choices:
        raise ConfigError(name, f"expected one of {sorted(choices)}, got {text!r}")
    return value


def parse_list(text: str) -> tuple[str, ...]:
    """Split a Kafka LIST value on commas, trimming items and dropping empty ones."""
    return tuple(item.strip() for item in text.split(",") if item.strip())

