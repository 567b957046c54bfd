"""The listener (trio): framing, request context, request memory, SASL, and the coordinator lookup
front door.
"""
