"""Applying AlterUserScram: one user's SCRAM credentials, set and deleted by mechanism. Pure.

The same rules as the controller's answer to AlterUserScramCredentials (Kafka's
``ScramControlManager``), checked again here in log order so the log never holds a credential
a client could not have been given: a known mechanism, 4096..16384 iterations, keys of the
mechanism's digest size, a non-empty salt, and a deletion only of a credential that exists.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from raftlog.metadata import errors
from raftlog.metadata.apply_support import reject, with_item, without_item
from raftlog.metadata.image import MetadataImage, ScramCredentialImage, frozen_mapping
from raftlog.metadata.records import AlterUserScram, BootstrapScramUsers

# Kafka's mechanism names and digest sizes (ScramMechanism: type 1 and 2 on the wire).
SCRAM_KEY_BYTES: Final = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}
SCRAM_ITERATIONS_MIN: Final = 4096
SCRAM_ITERATIONS_MAX: Final = 16384
SCRAM_USER_LENGTH_MAX: Final = 1024
SCRAM_SALT_BYTES_MAX: Final = 1024
# The cluster's own principals (raftlog.security.session) authenticate with raft.secret only.
RESERVED_USER_PREFIX: Final = "__raftlog-"


def credential_problem(credential: ScramCredentialImage) -> tuple[int, str] | None:
    """Why ``credential`` cannot be stored (Kafka error code and message), or None."""
    key_bytes = SCRAM_KEY_BYTES.get(credential.mechanism)
    if key_bytes is None:
        return (errors.UNSUPPORTED_SASL_MECHANISM,
                f"Unknown SCRAM mechanism {credential.mechanism!r}")
    if credential.iterations < SCRAM_ITERATIONS_MIN:
        return errors.UNACCEPTABLE_CREDENTIAL, (
            f"Too few iterations ({credential.iterations} < {SCRAM_ITERATIONS_MIN})")
    if credential.iterations > SCRAM_ITERATIONS_MAX:
        return errors.UNACCEPTABLE_CREDENTIAL, (
            f"Too many iterations ({credential.iterations} > {SCRAM_ITERATIONS_MAX})")
    if not 0 < len(credential.salt) <= SCRAM_SALT_BYTES_MAX:
        return errors.UNACCEPTABLE_CREDENTIAL, "The salt must hold 1 to 1024 bytes"
    if len(credential.stored_key) != key_bytes or len(credential.server_key) != key_bytes:
        return errors.UNACCEPTABLE_CREDENTIAL, "Keys of the wrong size for the mechanism"
    return None


def user_problem(user: str) -> str | None:
    """Why ``user`` cannot name a SCRAM user, or None."""
    if not user:
        return "Username must not be empty"
    if len(user) > SCRAM_USER_LENGTH_MAX:
        return f"Username longer than {SCRAM_USER_LENGTH_MAX} characters"
    if user.startswith(RESERVED_USER_PREFIX):
        return f"User names starting with {RESERVED_USER_PREFIX} are the cluster's own"
    return None


def bootstrap_scram_users(image: MetadataImage, record: BootstrapScramUsers, offset: int
                          ) -> tuple[MetadataImage, int]:
    """BootstrapScramUsers: every user, atomically, on a log that never changed a SCRAM user;
    a no-op otherwise. Returns how many users it added."""
    if image.scram_version != -1:
        return image, 0
    users = [user.user for user in record.users]
    if not users or len(set(users)) != len(users) or any(u.deletions for u in record.users):
        reject(errors.INVALID_REQUEST, "bootstrap users must be distinct upserts")
    next_image = image
    for user in record.users:
        next_image, _ = alter_user_scram(next_image, user, offset)
    return next_image, len(users)


def alter_user_scram(image: MetadataImage, record: AlterUserScram, offset: int
                     ) -> tuple[MetadataImage, None]:
    """AlterUserScram: deletions first, then upserts (a mechanism may not appear twice)."""
    problem = user_problem(record.user)
    if problem is not None:
        reject(errors.UNACCEPTABLE_CREDENTIAL, problem)
    mechanisms = [c.mechanism for c in record.upserts] + list(record.deletions)
    if len(set(mechanisms)) != len(mechanisms):
        reject(errors.INVALID_REQUEST, "a mechanism appears twice for one user")
    if not mechanisms:
        reject(errors.INVALID_REQUEST, "AlterUserScram changes nothing")
    current = dict(image.scram_users.get(record.user, {}))
    for mechanism in record.deletions:
        if mechanism not in current:
            reject(errors.RESOURCE_NOT_FOUND,
                   f"Attempt to delete a user credential that does not exist ({mechanism})")
        del current[mechanism]
    for credential in record.upserts:
        found = credential_problem(credential)
        if found is not None:
            reject(*found)
        current[credential.mechanism] = credential
    if current:
        users = with_item(image.scram_users, record.user, frozen_mapping(current))
    else:
        users = without_item(image.scram_users, record.user)
    return dataclasses.replace(image, scram_users=users, scram_version=offset), None
