"""The `loom` command."""
