"""Kafka's wire protocol: the codec, the schemas of every API, the one error-code enum, the
envelope, internal topic names and partitioning. Pure.
"""
