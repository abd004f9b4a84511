"""Scheduling policies: one module each, registered by name in POLICIES."""
