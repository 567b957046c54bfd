"""The principal of a TLS client: its certificate's subject DN, mapped by
``ssl.principal.mapping.rules`` as Kafka's ``SslPrincipalMapper`` does. A pure core.

Kafka's default principal builder names a client ``User:<DN>`` where the DN is the RFC 2253
form of the certificate's subject (``CN=alice,OU=eng,O=acme``: most specific attribute
first). The rules rewrite that name: a comma-separated list of ``DEFAULT`` (the DN as it is)
and ``RULE:pattern/replacement/[LU]`` (when ``pattern`` matches the whole DN, the DN with
every match replaced by ``replacement``, in which ``$1`` names a group, then lower- or
upper-cased with ``L``/``U``). The first rule that applies wins; when none does, the client
has no principal and Kafka refuses the connection, as raftlog does. ``/`` and ``,`` inside a
pattern or replacement are written ``\\/`` and ``\\,``.

Not Kafka's byte for byte: attributes RFC 4514 has no keyword for (``emailAddress``) appear as
their dotted OID with the value as text, where Java's X500Principal writes ``#`` and the hex
of the value's DER encoding.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cryptography import x509

# One rule in the list (Kafka's RULE_SPLITTER): DEFAULT, RULE:p/r/[LU], or anything else
# (group 7: an invalid rule), then a comma or newline or the end.
_SPLITTER: Final = re.compile(
    r"\s*(DEFAULT|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?).*?|(.*?))\s*(?:[,\n]\s*|$)",
    re.DOTALL,
)
_RULE: Final = re.compile(r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)",
                          re.DOTALL)


class PrincipalMappingError(ValueError):
    """The rules do not parse, or no rule applies to a DN."""


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: Callable[[re.Match[str]], str] | None
    case: str  # "", "L" or "U"
    text: str

    def apply(self, dn: str) -> str | None:
        if self.pattern is None or self.replacement is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        result = self.pattern.sub(self.replacement, dn)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


class PrincipalMapper:
    """``ssl.principal.mapping.rules`` parsed once; ``name_of(dn)`` applies them."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules = _parse_rules(rules)

    def name_of(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise PrincipalMappingError(
            f"no rule of ssl.principal.mapping.rules applies to {dn!r}"
            f" (rules: {[rule.text for rule in self.rules]})")


def _parse_rules(text: str) -> tuple[_Rule, ...]:
    rules: list[_Rule] = []
    position = 0
    stripped = text.strip()
    while position < len(stripped):
        match = _SPLITTER.match(stripped, position)
        if match is None or match.end() == position:
            raise PrincipalMappingError(f"invalid rule at {stripped[position:]!r}")
        position = match.end()
        if match.group(5):
            raise PrincipalMappingError(f"invalid rule {match.group(5)!r}")
        rules.append(_parse_rule(match.group(1)))
    if not rules:
        raise PrincipalMappingError("no rules (use DEFAULT)")
    return tuple(rules)


def _parse_rule(text: str) -> _Rule:
    match = _RULE.fullmatch(text)
    if match is None:
        # Kafka's splitter lets trailing text after the [LU] flag through, then the rule
        # pattern refuses it.
        raise PrincipalMappingError(f"invalid rule {text!r}")
    if match.group(1):
        return _Rule(None, None, "", text)
    pattern_text = match.group(2).replace("\\,", ",")
    try:
        pattern = re.compile(pattern_text)
    except re.error as exc:
        raise PrincipalMappingError(f"invalid pattern in rule {text!r}: {exc}") from exc
    replacement = _java_replacement(match.group(3).replace("\\,", ",").replace("\\/", "/"))
    return _Rule(pattern, replacement, match.group(4), text)


def _java_replacement(text: str) -> Callable[[re.Match[str]], str]:
    """Java's ``Matcher.replaceAll`` replacement: ``$n`` is group n, a backslash makes the
    next character literal."""
    parts: list[str | int] = []
    literal: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            literal.append(text[index + 1])
            index += 2
        elif char == "$" and index + 1 < len(text) and text[index + 1].isdigit():
            end = index + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(int(text[index + 1:end]))
            index = end
        else:
            literal.append(char)
            index += 1
    if literal:
        parts.append("".join(literal))

    def replace(match: re.Match[str]) -> str:
        out = []
        for part in parts:
            if isinstance(part, int):
                if part > (match.re.groups or 0):
                    raise PrincipalMappingError(f"no group {part} in {match.re.pattern!r}")
                out.append(match.group(part) or "")
            else:
                out.append(part)
        return "".join(out)

    return replace


def subject_dn(certificate_der: bytes) -> str:
    """The RFC 2253/4514 form of a DER certificate's subject (most specific first)."""
    return x509.load_der_x509_certificate(certificate_der).subject.rfc4514_string()
