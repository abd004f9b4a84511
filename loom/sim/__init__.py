"""The discrete-event simulator: the backend that replays traces against the core."""
