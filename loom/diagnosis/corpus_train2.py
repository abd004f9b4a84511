"""Training templates, second set: failure phrasings from production clusters the first set lacks.

Registered by importing (loom/diagnosis/corpus.py imports this module at its end).
"""

from __future__ import annotations
