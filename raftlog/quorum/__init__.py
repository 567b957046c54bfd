"""The metadata quorum: the one-voter local log and the Raft quorum over pysyncobj with its storage
and transport.
"""
