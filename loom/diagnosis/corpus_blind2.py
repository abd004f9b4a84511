"""Blind test templates, set 3 (split "blind2"): written without reading the rules, the filters or
the retrieval code, and measured once.

Registered by importing (loom/diagnosis/corpus.py imports this module at its end).
"""

from __future__ import annotations
