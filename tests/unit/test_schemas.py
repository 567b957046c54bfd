"""Cross-checks the project's declared schemas against Kafka's message JSON.

For every implemented version of every API, the set of fields present (with their types,
nullability and tags) must equal the set the upstream JSON declares for that version. The
JSON lives in ``../shared/kafka-protocol/message`` beside the checkout; the test is skipped
where that directory is absent (an installed wheel, say).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from raftlog.protocol.codec import Api, Field, VersionRange
from raftlog.protocol.schemas import ALL_APIS
from raftlog.protocol.schemas_group import GROUP_APIS
from raftlog.protocol.schemas_quota import QUOTA_APIS
from raftlog.protocol.schemas_security import ACL_APIS, SCRAM_ADMIN_APIS, SECURITY_APIS
from raftlog.protocol.schemas_txn import TXN_APIS

MESSAGE_DIR = Path(__file__).resolve().parents[3] / "shared" / "kafka-protocol" / "message"
PRIMITIVES = {
    "bool",
    "int8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "float64",
    "string",
    "bytes",
    "records",
    "uuid",
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _load(name: str) -> dict[str, Any]:
    text = (MESSAGE_DIR / f"{name}.json").read_text()
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _json_shape(
    fields: list[dict[str, Any]], version: int, flexible: bool,
    common: dict[str, list[dict[str, Any]]] | None = None,
) -> set[tuple[Any, ...]]:
    common = common or {}
    shape: set[tuple[Any, ...]] = set()
    for f in fields:
        if "fields" not in f and f["type"].removeprefix("[]") in common:
            f = {**f, "fields": common[f["type"].removeprefix("[]")]}
        if version not in VersionRange.parse(f["versions"]):
            continue
        nullable = version in VersionRange.parse(f.get("nullableVersions"))
        tagged = (
            flexible
            and "tag" in f
            and version in VersionRange.parse(f.get("taggedVersions", f["versions"]))
        )
        kind = f["type"]
        inner: frozenset[tuple[Any, ...]] = frozenset()
        if "fields" in f:
            inner = frozenset(_json_shape(f["fields"], version, flexible, common))
            kind = "[]struct" if kind.startswith("[]") else "struct"
        else:
            assert kind.removeprefix("[]") in PRIMITIVES, kind
        shape.add((_snake(f["name"]), kind, nullable, f.get("tag") if tagged else None, inner))
    return shape


def _our_shape(
    fields: list[Field] | tuple[Field, ...], version: int, flexible: bool
) -> set[tuple[Any, ...]]:
    shape: set[tuple[Any, ...]] = set()
    for f in fields:
        if version not in f.version_range:
            continue
        inner: frozenset[tuple[Any, ...]] = frozenset()
        kind: str
        if isinstance(f.type, list):
            kind, inner = "[]struct", frozenset(_our_shape(f.type, version, flexible))
        elif isinstance(f.type, tuple):
            kind, inner = "struct", frozenset(_our_shape(f.type, version, flexible))
        else:
            kind = f.type
        tag = f.tag if flexible and f.is_tagged(version) else None
        shape.add((f.name, kind, f.is_nullable(version), tag, inner))
    return shape


@pytest.mark.skipif(not MESSAGE_DIR.is_dir(), reason="shared/kafka-protocol not present")
@pytest.mark.parametrize("api",
                         (*ALL_APIS, *GROUP_APIS, *TXN_APIS, *SECURITY_APIS, *SCRAM_ADMIN_APIS,
                          *ACL_APIS, *QUOTA_APIS),
                         ids=lambda api: api.name)
def test_schema_matches_kafka_json(api: Api) -> None:
    for kind in ("Request", "Response"):
        upstream = _load(f"{api.name}{kind}")
        assert upstream["apiKey"] == api.key
        assert api.flexible == upstream["flexibleVersions"]
        valid = VersionRange.parse(upstream["validVersions"])
        ours = api.request if kind == "Request" else api.response
        for version in range(api.min_version, api.max_version + 1):
            assert version in valid
            flexible = api.is_flexible(version)
            common = {c["name"]: c["fields"] for c in upstream.get("commonStructs", [])}
            expected = _json_shape(upstream["fields"], version, flexible, common)
            assert _our_shape(ours, version, flexible) == expected, f"{api.name}{kind} v{version}"
