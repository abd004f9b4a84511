"""Placers: where a job's GPUs go. One module per placer, registered by name."""
