"""Failure diagnosis of training-job logs (issue 20): Acme's taxonomy, root cause first.

    from loom.diagnosis import diagnose, Diagnosis
    d = diagnose(Path("job.log"))          # or log text, or an iterable of lines
    d.error_type, d.recoverable, d.root_cause_lines, d.to_json()

See docs/DIAGNOSIS.md. Importing this package is light: the embedding model (torch,
sentence-transformers) loads only when retrieval is actually needed.
"""

from loom.diagnosis.diagnose import Diagnosis, diagnose

__all__ = ["Diagnosis", "diagnose"]
