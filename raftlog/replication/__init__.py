"""Partition replication: leader-side ISR management and follower fetchers."""
