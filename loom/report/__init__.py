"""Metrics, tables and reports from simulation results."""
