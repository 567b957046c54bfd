"""The project's own Kafka client connection (tools, followers, coordinators)."""
