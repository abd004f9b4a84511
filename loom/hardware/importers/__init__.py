"""Cluster importers: one module per `FORMAT` of `--cluster FORMAT:PATH`.

Each module registers a function `str -> Topology` in
`loom.hardware.clusters.IMPORTERS`; `clusters.py` lists the modules as the
registry's built-ins so they are imported on first lookup. Formats are
documented in docs/CLUSTERS.md.
"""
