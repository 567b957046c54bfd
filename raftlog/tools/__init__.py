"""Command-line tools: topics, console produce/consume, consumer groups, transactions, cluster up,
demo.
"""
