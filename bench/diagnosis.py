"""Failure diagnosis (issue 20) on the corpus's held-out splits: rules alone vs rules + retrieval.

    PYTHONPATH=. python bench/diagnosis.py [--split test|blind|blind2|blind3|held-out|all-held-out] [--json OUT]
                                           [--learn-filters]

Splits (loom/diagnosis/corpus.py): `test` (19 templates never in the training split, but looked at
while the retrieval was designed), `blind` (15 templates written afterwards without reading the
rules, filters or retrieval code; measured once), `blind2` (20 more templates written the same
way, loom/diagnosis/corpus_blind2.py and corpus_blind2b.py; measured once), `blind3` (20 more,
corpus_blind3.py and corpus_blind3b.py, written while the rules were generalised after blind2,
by someone who did not read them; measured once), `held-out` (test + blind; the default) and
`all-held-out` (test + blind + blind2 + blind3).

Prints error-type accuracy (rules alone, rules + retrieval), the root-cause line hit rate (the
first reported line is a labelled root-cause line), per-class precision and recall, the
compression ratio (bytes in / bytes kept) and the time per log (rules only: no model; with
retrieval: after the model and store are loaded, whose one-off times are printed too).
`--learn-filters` first relearns loom/diagnosis/data/filters.json from the training split.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter

from loom.diagnosis import corpus, diagnose
from loom.diagnosis import retrieval as rt
from loom.diagnosis.compress import compress, relearn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--learn-filters", action="store_true")
    ap.add_argument("--split", choices=("test", "blind", "blind2", "blind3", "held-out", "all-held-out"), default="held-out")
    args = ap.parse_args()
    splits = {"held-out": ("test", "blind"), "all-held-out": ("test", "blind", "blind2", "blind3")}.get(args.split, (args.split,))
    if args.learn_filters:
        print(f"filters: {len(relearn().templates)} learned from the training split")
    logs = [log for split in splits for log in corpus.generate(split)]
    expected = ["Unknown" if log.error_type == corpus.HEALTHY else log.error_type for log in logs]
    ratios = [compress(log.lines).ratio for log in logs]
    t0 = time.perf_counter()
    embed = rt.load_embedder()
    t1 = time.perf_counter()
    rt.default_store(embed)
    t2 = time.perf_counter()
    out = {"split": args.split, "logs": len(logs), "templates": sum(len(corpus.templates(x)) for x in splits),
           "train_templates": len(corpus.templates("train")), "lines_per_log": statistics.mean(len(x.lines) for x in logs),
           "model_load_s": t1 - t0, "store_s": t2 - t1, "compression_ratio_median": statistics.median(ratios)}
    for mode in ("rules", "rules+retrieval"):
        start = time.perf_counter()
        got = [diagnose(log.lines, retrieval=mode != "rules") for log in logs]
        out[mode] = _score(got, expected, logs, (time.perf_counter() - start) / len(logs))
    _print(out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def _score(got: list, expected: list[str], logs: list, per_log: float) -> dict:
    failed = [i for i, log in enumerate(logs) if log.root_cause]
    hits = sum(bool(set(got[i].root_cause_line_numbers[:1]) & logs[i].root_cause) for i in failed)
    tp, fp, fn = Counter(), Counter(), Counter()
    for d, e in zip(got, expected):
        if d.error_type == e:
            tp[e] += 1
        else:
            fp[d.error_type] += 1
            fn[e] += 1
    classes = sorted(set(expected) | set(fp))
    per_class = {c: {"precision": tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else 0.0,
                     "recall": tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else 0.0, "n": tp[c] + fn[c]}
                 for c in classes}
    return {"accuracy": sum(tp.values()) / len(expected), "root_cause_hit": hits / len(failed),
            "seconds_per_log": per_log, "sources": dict(Counter(d.source for d in got)), "per_class": per_class}


def _print(out: dict) -> None:
    print(f"{out['split']} split: {out['logs']} logs of {out['templates']} templates (training: {out['train_templates']} "
          f"templates), {out['lines_per_log']:.0f} lines per log on average")
    print(f"compression ratio (median, bytes in / bytes kept): {out['compression_ratio_median']:.0f}x")
    print(f"model load {out['model_load_s']:.1f} s, store (cache or build) {out['store_s']:.1f} s")
    for mode in ("rules", "rules+retrieval"):
        r = out[mode]
        print(f"{mode:<16} accuracy {r['accuracy']:.1%}  root-cause line {r['root_cause_hit']:.1%}  "
              f"{r['seconds_per_log'] * 1000:.0f} ms/log  sources {r['sources']}")
    print(f"{'class':<18}{'rules P/R':>14}{'+retrieval P/R':>18}{'n':>4}")
    a, b = out["rules"]["per_class"], out["rules+retrieval"]["per_class"]
    for c in sorted(set(a) | set(b)):
        pa, pb = a.get(c, {"precision": 0, "recall": 0, "n": 0}), b.get(c, {"precision": 0, "recall": 0, "n": 0})
        print(f"{c:<18}{pa['precision']:>7.2f}/{pa['recall']:.2f}{pb['precision']:>11.2f}/{pb['recall']:.2f}"
              f"{max(pa['n'], pb['n']):>4}")


if __name__ == "__main__":
    main()
