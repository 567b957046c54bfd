"""Applying CreateAcls and DeleteAcls: the ACL bindings of the image. Pure.

The controller checked the bindings when it answered CreateAcls; they are checked again here
in log order (``raftlog.security.acl.binding_problem``), so the log never holds a binding a
client could not have created. Both records are atomic: every binding is added (or removed)
or none is. A binding saying the same as a stored one is skipped (creating an existing ACL
succeeds in Kafka without a second copy); ids already deleted are ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from raftlog.metadata import errors
from raftlog.metadata.apply_support import reject
from raftlog.metadata.image import AclBindingImage, MetadataImage, frozen_mapping
from raftlog.metadata.records import CreateAcls, DeleteAcls
from raftlog.protocol.errors import ErrorCode
from raftlog.security.acl import binding_problem

# Bindings one image may hold: every node keeps them all in memory and in every snapshot.
ACL_BINDINGS_MAX: Final = 100_000
ACL_ID_LENGTH_MAX: Final = 64


def create_acls(image: MetadataImage, record: CreateAcls, offset: int
                ) -> tuple[MetadataImage, int]:
    """Adds the bindings; returns how many were new."""
    if not record.bindings:
        reject(errors.INVALID_REQUEST, "CreateAcls adds nothing")
    current = dict(image.acls)
    added = 0
    for binding in record.bindings:
        problem = binding_problem(binding)
        if problem is not None:
            reject(errors.INVALID_REQUEST, problem)
        if not 0 < len(binding.acl_id) <= ACL_ID_LENGTH_MAX or binding.acl_id in current:
            reject(errors.INVALID_REQUEST, f"ACL id {binding.acl_id!r} is taken or invalid")
        if any(binding.same_rule(existing) for existing in _same_resource(current, binding)):
            continue
        current[binding.acl_id] = binding
        added += 1
    if len(current) > ACL_BINDINGS_MAX:
        reject(int(ErrorCode.POLICY_VIOLATION),
               f"The cluster holds at most {ACL_BINDINGS_MAX} ACL bindings")
    if not added:
        return image, 0
    return dataclasses.replace(image, acls=frozen_mapping(current), acl_version=offset), added


def _same_resource(acls: dict[str, AclBindingImage], binding: AclBindingImage
                   ) -> list[AclBindingImage]:
    return [a for a in acls.values() if a.resource_name == binding.resource_name
            and a.resource_type == binding.resource_type]


def delete_acls(image: MetadataImage, record: DeleteAcls, offset: int
                ) -> tuple[MetadataImage, int]:
    """Removes the bindings with these ids; returns how many were there."""
    gone = [acl_id for acl_id in record.acl_ids if acl_id in image.acls]
    if not gone:
        return image, 0
    current = dict(image.acls)
    for acl_id in gone:
        del current[acl_id]
    return (dataclasses.replace(image, acls=frozen_mapping(current), acl_version=offset),
            len(gone))
