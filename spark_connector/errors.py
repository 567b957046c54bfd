"""The connector's exceptions. Each message names the option, topic or address at fault, because
Spark wraps them (PythonException, AnalysisException, StreamingQueryException) and only the
message text survives the trip through the JVM."""

from __future__ import annotations


class RaftLogSparkError(Exception):
    """Base class of every error the connector raises on purpose."""


class RaftLogOptionError(RaftLogSparkError, ValueError):
    """An option is unknown, malformed, or not valid for this kind of query."""

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        super().__init__(f"raftlog: option '{option}': {problem}")


class RaftLogConnectionError(RaftLogSparkError, ConnectionError):
    """The cluster named by kafka.bootstrap.servers could not be reached in time."""


class RaftLogTopicError(RaftLogSparkError, LookupError):
    """A subscribed or assigned topic or partition does not exist."""


class RaftLogDataLossError(RaftLogSparkError, RuntimeError):
    """Offsets the query needs are gone (retention, deleted topic, truncation)."""

    HINT = (" If you want the query to continue anyway (losing those records), set the option"
            " 'failOnDataLoss' to 'false'.")

    def __init__(self, message: str) -> None:
        super().__init__(f"raftlog: {message}.{self.HINT}")


class RaftLogReadError(RaftLogSparkError, RuntimeError):
    """An executor could not read an offset range."""


class RaftLogWriteError(RaftLogSparkError, RuntimeError):
    """An executor could not publish its rows."""
