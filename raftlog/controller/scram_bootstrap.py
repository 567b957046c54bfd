"""SCRAM users at first start: ``raftlog format --add-scram`` (Kafka's ``kafka-storage format
--add-scram``, KIP-900).

``raftlog format --config server.properties --add-scram
'SCRAM-SHA-512=[name=admin,password=admin-secret]'`` salts each password (a random salt,
``iterations`` 4096 unless given) and writes the salted keys to
``<metadata.log.dir>/bootstrap-scram.json`` (mode 0600; never a password). Run it on every
controller before their first start. Whichever node becomes the controller proposes one
``BootstrapScramUsers`` record with them; the state machine applies it only to a log that never
changed a SCRAM user (else it is a no-op), so the cluster is bootstrapped exactly once, and a
user deleted later never comes back from another node's file.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import secrets
from pathlib import Path
from typing import Final

import trio

from raftlog.controller.service import ControllerService, ControllerUnavailableError
from raftlog.metadata.image import ScramCredentialImage
from raftlog.metadata.records import AlterUserScram, BootstrapScramUsers
from raftlog.metadata.scram_apply import credential_problem, user_problem
from raftlog.quorum.interface import Quorum
from raftlog.security.scram import ScramCredential

log = logging.getLogger(__name__)

BOOTSTRAP_FILE: Final = "bootstrap-scram.json"
ITERATIONS_DEFAULT: Final = 4096
RETRY_S: Final = 1.0
_ADD_SCRAM: Final = re.compile(r"(SCRAM-SHA-256|SCRAM-SHA-512)=\[(.*)\]")


class BootstrapError(ValueError):
    """An ``--add-scram`` value or a bootstrap file that cannot be used."""


def parse_add_scram(text: str) -> tuple[str, ScramCredentialImage]:
    """``MECHANISM=[name=N,password=P(,iterations=I)]`` as (user, credential)."""
    match = _ADD_SCRAM.fullmatch(text.strip())
    if match is None:
        raise BootstrapError(f"expected SCRAM-SHA-256|SCRAM-SHA-512=[name=...,password=...],"
                             f" got {text[:40]!r}")
    fields = {}
    for item in match.group(2).split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in ("name", "password", "iterations"):
            raise BootstrapError(f"unknown --add-scram field {key.strip()!r}")
        fields[key.strip()] = value.strip().strip('"')
    name, password = fields.get("name", ""), fields.get("password", "")
    iterations = fields.get("iterations", str(ITERATIONS_DEFAULT))
    if not iterations.isdigit() or not password:
        raise BootstrapError("--add-scram needs a password and numeric iterations")
    problem = user_problem(name)
    if problem is not None:
        raise BootstrapError(problem)
    mechanism = match.group(1)
    derived = ScramCredential.from_password(mechanism, password.encode(),
                                            secrets.token_bytes(32), int(iterations))
    credential = ScramCredentialImage(mechanism, derived.salt, derived.stored_key,
                                      derived.server_key, derived.iterations)
    found = credential_problem(credential)
    if found is not None:
        raise BootstrapError(found[1])
    return name, credential


def write_bootstrap(metadata_dir: Path, entries: list[tuple[str, ScramCredentialImage]]
                    ) -> Path:
    """The bootstrap file for ``entries`` (one user may have both mechanisms)."""
    users: dict[str, dict[str, ScramCredentialImage]] = {}
    for name, credential in entries:
        if credential.mechanism in users.setdefault(name, {}):
            raise BootstrapError(f"{name} {credential.mechanism} given twice")
        users[name][credential.mechanism] = credential
    plain = [{"name": name, "mechanism": c.mechanism, "iterations": c.iterations,
              "salt": _b64(c.salt), "stored_key": _b64(c.stored_key),
              "server_key": _b64(c.server_key)}
             for name, by_mechanism in users.items() for c in by_mechanism.values()]
    metadata_dir.mkdir(parents=True, exist_ok=True)
    path = metadata_dir / BOOTSTRAP_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(plain, out, indent=1)
    return path


def read_bootstrap(metadata_dir: Path) -> BootstrapScramUsers | None:
    """The record for the bootstrap file in ``metadata_dir``, None without one."""
    path = metadata_dir / BOOTSTRAP_FILE
    if not path.exists():
        return None
    try:
        plain = json.loads(path.read_text(encoding="utf-8"))
        by_user: dict[str, list[ScramCredentialImage]] = {}
        for item in plain:
            by_user.setdefault(item["name"], []).append(ScramCredentialImage(
                item["mechanism"], base64.b64decode(item["salt"]),
                base64.b64decode(item["stored_key"]), base64.b64decode(item["server_key"]),
                int(item["iterations"])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BootstrapError(f"{path}: {exc}") from exc
    return BootstrapScramUsers(tuple(AlterUserScram(name, tuple(credentials), ())
                                     for name, credentials in by_user.items()))


async def bootstrap_when_controller(quorum: Quorum, controller: ControllerService,
                                    record: BootstrapScramUsers) -> None:
    """Propose ``record`` once this node is the controller of a log without SCRAM changes;
    returns when the log has any (this record's or another's)."""
    while quorum.image.scram_version == -1:
        if not controller.active:
            await trio.sleep(RETRY_S)
            continue
        try:
            code, message = await controller.commit(record)
        except ControllerUnavailableError as exc:
            log.info("bootstrap SCRAM users not committed yet: %s", exc)
            await trio.sleep(RETRY_S)
            continue
        if code:
            log.error("bootstrap SCRAM users refused: %s", message)
            return
        log.info("bootstrap SCRAM users committed: %s", [u.user for u in record.users])
        return


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
