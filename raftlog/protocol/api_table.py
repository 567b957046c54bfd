"""The one table of every API this broker can decode, by key.

Built here, explicitly, from all the schema modules (``schemas``, ``schemas_group``,
``schemas_txn``, ``schemas_security``, ``schemas_quota``), so its content never depends on
which of them happen to have been imported: the listener looks requests up in it and the
controller looks up the request inside an Envelope. Whether an API is *served* is the
handlers' business (a key without a handler closes the connection); this table only says how
to parse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from raftlog.protocol.codec import Api
from raftlog.protocol.schemas import ALL_APIS
from raftlog.protocol.schemas_group import GROUP_APIS
from raftlog.protocol.schemas_quota import QUOTA_APIS
from raftlog.protocol.schemas_security import ACL_APIS, SCRAM_ADMIN_APIS, SECURITY_APIS
from raftlog.protocol.schemas_txn import TXN_APIS

EVERY_API: tuple[Api, ...] = (*ALL_APIS, *GROUP_APIS, *TXN_APIS, *SECURITY_APIS,
                             *SCRAM_ADMIN_APIS, *ACL_APIS, *QUOTA_APIS)

APIS_BY_KEY: Mapping[int, Api] = MappingProxyType({api.key: api for api in EVERY_API})
assert len(APIS_BY_KEY) == len(EVERY_API), "an API key is declared twice"
