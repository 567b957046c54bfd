"""Kafka's wire protocol: the codec (``codec`` with ``declarations``, ``primitives`` and
``compiler``), the schemas of every API and the one table of them by key (``api_table``), the
one error-code enum, the envelope, internal topic names and partitioning. Pure.
"""
