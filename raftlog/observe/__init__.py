"""What an operator sees of a node: the Prometheus metrics endpoint and health checks.

``registry.py`` builds one ``prometheus_client`` registry per node from collectors that read
the node's parts at scrape time (``requests``, ``cluster``, ``storage``, ``replication``,
``quorum``, ``groups``, ``txn``, ``runtime``); ``http.py`` serves it, with ``/health/live``
and ``/health/ready``, on ``metrics.listener``. Nothing here is on a hot path: the parts
record into ``raftlog.metrics.recorders`` and this package only reads.
"""
