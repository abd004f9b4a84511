"""Fuzz cases for trace and topology files: one valid seed per format, one mutation per case.

Built deterministically at import time (a seeded `random.Random` only picks
which data row to mutate). Used by test_fuzz_inputs.py.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

HUGE_INT = str(10**30)
BINARY = bytes(random.Random(1234).randrange(256) for _ in range(300)) + b"\x00\xff\xfe\x80,\n\x89PNG\r\n"
UNICODE = "\u2603\u00e9\u4e2d\U0001f600\u202e"


@dataclass
class Case:
    id: str
    kind: str  # "trace" or "cluster"
    fmt: str
    content: str | bytes
    query: str = ""
    expect: str = "any"  # "ok", "err" or "any" (either, but never a traceback)
    line: int | None = None  # when it raises, the error must name this line
    fields: tuple[str, ...] = ()  # when it raises, the error must name one of these fields
    words: str | None = None  # when it raises, the message must contain this
    suffix: str = ".csv"
    marks: list = field(default_factory=list)


def _csv(rows: list[list[str]]) -> str:
    return "".join(",".join(r) + "\n" for r in rows)


# ====================================================================== traces
@dataclass(frozen=True)
class C:
    """What the loader expects of a column (mirrors docs/TRACES.md)."""

    kind: str  # str, float, int, datetime, bool, enum, gputype, ignored
    required: bool = True
    min: float | None = None  # lower bound (inclusive unless strict)
    strict: bool = False


TRACE_SEEDS: dict[str, tuple[list[str], list[list[str]], dict[str, C], str | None]] = {
    # format: (header, rows, column rules, id column)
    "rfold": (
        ["#job id", "arrival time (sec)", "topology", "shape", "size", "duration (sec)"],
        [["0", "0", "CLOS", "1", "1", "50"], ["1", "10", "CLOS", "2", "2", "60"], ["2", "20", "CLOS", "8", "8", "0"],
         ["3", "30", "CLOS", "1", "0.5", "7"]],
        {"#job id": C("str"), "arrival time (sec)": C("float", min=0), "topology": C("ignored"),
         "shape": C("ignored"), "size": C("float", min=0, strict=True), "duration (sec)": C("float", min=0)},
        "#job id",
    ),
    "sia-philly": (
        ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"],
        [["2017-10-09 07:01:55", "66.0", "1", "66.0", "11cb48"], ["2017-10-09 06:13:03", "0", "2", "0", "6214e9"],
         ["2017-10-09 08:00:00", "120", "8", "960", "11cb48"]],
        {"timestamp": C("datetime"), "duration": C("float", min=0), "num_gpus": C("int", min=1),
         "gpu_time": C("float", required=False), "cluster": C("str", required=False)},
        None,
    ),
    "alibaba-pods": (
        ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
         "creation_time", "deletion_time", "scheduled_time"],
        [["p0", "12000", "16384", "1", "1000", "", "LS", "Running", "0", "100", "0"],
         ["p1", "6000", "12288", "1", "460", "T4", "BE", "Succeeded", "10", "200", "50"],
         ["p2", "6000", "12288", "2", "1000", "V100M16|V100M32", "Burstable", "Failed", "20", "300", "30"],
         ["p3", "6000", "12288", "4", "1000", "G2", "LS", "Running", "25", "300", "40"]],
        {"name": C("str"), "cpu_milli": C("int", required=False, min=0), "memory_mib": C("int", required=False, min=0),
         "num_gpu": C("int", min=0), "gpu_milli": C("int", required=False, min=0),
         "gpu_spec": C("gputype", required=False), "qos": C("str", required=False),
         "pod_phase": C("str", required=False), "creation_time": C("float", min=0),
         "deletion_time": C("float"), "scheduled_time": C("float", required=False)},
        "name",
    ),
    "arena": (
        ["job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu", "gpu_type"],
        [["a", "10", "100", "bert__2.6B", "50.5", "256", "4", "a40"], ["b", "5", "7", "moe__10B", "", "", "1", "A100"],
         ["c", "20", "3000", "gpt__7B", "9000", "64", "8", "v100"]],
        {"job_id": C("str"), "submission_time": C("float", min=0), "num_iteration": C("int", min=1),
         "model_name": C("str"), "deadline": C("float", required=False), "batch_size": C("int", required=False, min=1),
         "num_gpu": C("int", min=1), "gpu_type": C("gputype")},
        "job_id",
    ),
    "acme": (
        ["job_id", "user", "node_num", "gpu_num", "cpu_num", "mem_per_pod_GB", "shared_mem_per_pod", "type", "state",
         "submit_time", "start_time", "end_time", "fail_time", "stop_time", "duration", "queue", "gpu_time"],
        [["j1", "u1", "8", "64", "960", "1000", "100.0", "Pretrain", "COMPLETED", "2023-05-17 11:00:58+00:00",
          "2023-05-17 11:01:08+00:00", "2023-05-17 11:01:16+00:00", "", "", "18", "10.0", "1152.0"],
         ["j2", "u2", "1", "8", "1", "1", "1", "Evaluation", "FAILED", "2023-05-17 11:00:00+00:00",
          "2023-05-17 11:00:00+00:00", "2023-05-17 12:00:00+00:00", "", "", "", "", ""],
         ["j3", "u3", "1", "1", "1", "1", "1", "SFT", "NODE_FAIL", "2023-05-17 11:30:00+00:00",
          "2023-05-17 11:30:00+00:00", "2023-05-17 11:30:00+00:00", "", "", "", "", ""]],
        {"job_id": C("str"), "user": C("str", required=False), "node_num": C("ignored"), "gpu_num": C("int", min=0),
         "cpu_num": C("ignored"), "mem_per_pod_GB": C("ignored"), "shared_mem_per_pod": C("ignored"),
         "type": C("str", required=False), "state": C("str", required=False), "submit_time": C("datetime"),
         "start_time": C("datetime", required=False), "end_time": C("datetime", required=False),
         "fail_time": C("ignored"), "stop_time": C("ignored"), "duration": C("ignored"), "queue": C("ignored"),
         "gpu_time": C("ignored")},
        "job_id",
    ),
    "csv": (
        ["job_id", "submit_time", "gpus", "duration", "job_class", "vc", "preemptible", "priority", "gpu_fraction",
         "iterations"],
        [["a", "0", "8", "3600", "pretrain", "team-a", "true", "3", "", "100"],
         ["b", "30", "1", "0", "eval", "team-b", "no", "", "0.5", ""],
         ["c", "60", "2", "10", "", "", "", "-2", "1", "5"]],
        {"job_id": C("str"), "submit_time": C("float"), "gpus": C("int", min=1), "duration": C("float", min=0),
         "job_class": C("enum", required=False), "vc": C("str", required=False),
         "preemptible": C("bool", required=False), "priority": C("int", required=False),
         "gpu_fraction": C("float", required=False, min=0, strict=True), "iterations": C("int", required=False, min=1)},
        "job_id",
    ),
}

# A change in one column can fail a check reported on another (e.g. a huge
# scheduled_time makes deletion_time − scheduled_time negative).
RELATED = {
    ("alibaba-pods", "scheduled_time"): ("deletion_time",),
    ("alibaba-pods", "num_gpu"): ("gpu_milli",),
    ("arena", "submission_time"): ("deadline",),
    ("acme", "submit_time"): ("start_time",),
    ("acme", "start_time"): ("end_time",),
}

CELL_VALUES = ["abc", "", "1.5.3", "NaN", "inf", "-1", "0", "1.5", "1e308", "1e309", HUGE_INT, UNICODE, " 7 "]


def _cell_expect(fmt: str, col: str, rule: C, value: str) -> str:
    """ok / err / any for one cell mutation (any: the rule is not pinned down by the docs)."""
    v = value.strip()
    if rule.kind == "ignored":
        return "ok"
    if v == "":
        return "err" if rule.required else "ok"
    if rule.kind == "str":
        return "ok"
    if rule.kind == "gputype":
        return "err"  # none of CELL_VALUES is a GPU model
    if rule.kind == "enum":
        return "err"
    if rule.kind == "bool":
        return "ok" if v in ("0",) else "err"
    if rule.kind == "datetime":
        return "err"
    # numbers
    try:
        x = float(v)
    except ValueError:
        return "err"
    if x != x or x in (float("inf"), float("-inf")):
        return "err"
    if rule.kind == "int" and x != int(x):
        return "err"
    if rule.min is not None and (x < rule.min or (rule.strict and x <= rule.min)):
        return "err"
    if rule.kind == "int" and abs(x) >= 2**63:
        return "any"  # does not fit a 64-bit integer: an error or a clamp, but located
    if (fmt, col) in {("alibaba-pods", "scheduled_time"), ("alibaba-pods", "deletion_time"),
                      ("arena", "deadline"), ("arena", "submission_time"), ("csv", "gpu_fraction"),
                      ("alibaba-pods", "num_gpu"), ("alibaba-pods", "gpu_milli")}:
        return "any"  # cross-column rules (duration, deadline, gpu_fraction ≤ 1, gpu_milli ≤ 1000)
    return "ok"


def _trace_cases() -> list[Case]:
    cases: list[Case] = []
    rng = random.Random(20261122)
    for fmt, (header, rows, rules, idcol) in TRACE_SEEDS.items():
        def add(name, content, **kw):
            cases.append(Case(f"{fmt}-{name}", "trace", fmt, content, **kw))

        add("seed", _csv([header, *rows]), expect="ok")
        # --- cell mutations: every checked column × a handful of bad values
        for col, rule in rules.items():
            if rule.kind == "ignored":
                continue
            ci = header.index(col)
            values = CELL_VALUES if rule.kind in ("float", "int") else ["abc", "", "1.5.3", "-1", HUGE_INT, UNICODE]
            for v in values:
                r = rng.randrange(len(rows))
                new = [list(x) for x in rows]
                new[r][ci] = f'"{v}"' if "," in v else v
                exp = _cell_expect(fmt, col, rule, v)
                if idcol and col == idcol and v == "":
                    exp = "err"
                fields = (col, *RELATED.get((fmt, col), ()))
                slug = re.sub(r"[^a-z0-9]+", "_", col.lower()).strip("_")
                vslug = {"": "empty", UNICODE: "unicode", HUGE_INT: "1e30int", " 7 ": "padded"}.get(v, v)
                add(f"cell-{slug}-{vslug}", _csv([header, *new]), expect=exp, line=r + 2, fields=fields)
        # --- structure
        add("empty-file", "", expect="err", line=1, words="empty")
        add("header-only", _csv([header]), expect="any", line=1)
        add("whitespace-padded", _csv([[f" {h} " for h in header]] + [[f" {c} " if c else c for c in r] for r in rows]),
            expect="ok")
        add("crlf", _csv([header, *rows]).replace("\n", "\r\n"), expect="ok")
        add("trailing-blank-lines", _csv([header, *rows]) + "\n\n\n", expect="ok")
        add("blank-line-mid-file", _csv([header, rows[0]]) + "\n" + _csv(rows[1:]), expect="any", line=3)
        add("binary-blob", BINARY, expect="err")
        add("binary-after-header", _csv([header]).encode() + BINARY, expect="err")
        add("unicode-garbage-file", UNICODE * 20 + "\n" + UNICODE + "\n", expect="err", line=1, words="missing columns")
        add("unicode-garbage-ragged", UNICODE * 20 + "\n" + UNICODE + "," + UNICODE + "\n", expect="err", line=2)
        add("one-column-file", "job_id\nx\n", expect="err", line=1, words="missing columns")
        for k in range(1, 3):  # truncated rows: drop trailing fields
            r = rng.randrange(len(rows))
            cut = rng.randrange(1, len(header) - 1)
            new = [list(x) for x in rows]
            removed = header[cut:]
            new[r] = new[r][:cut]
            must = any(rules[c].required and rules[c].kind != "ignored" for c in removed)
            add(f"truncated-row-{k}", _csv([header, *new]), expect="err" if must else "any", line=r + 2)
        r = rng.randrange(len(rows))
        new = [list(x) for x in rows]
        new[r] = new[r][:1]
        add("truncated-row-to-one-field", _csv([header, *new]), expect="err", line=r + 2)
        text = _csv([header, *rows])
        add("truncated-mid-row-eof", text[: text.rindex(",") - 1], expect="any", line=len(rows) + 1)
        r = rng.randrange(len(rows))
        new = [list(x) for x in rows]
        new[r] = new[r] + ["extra", "9"]
        add("row-with-extra-fields", _csv([header, *new]), expect="err", line=r + 2)
        add("extra-column", _csv([header + ["zz_extra"], *[x + ["1"] for x in rows]]),
            expect="err" if fmt == "csv" else "ok", line=1, fields=("zz_extra",))
        add("header-missing-last-name", _csv([header[:-1], *rows]), expect="err")
        # the generic csv format refuses unknown columns, so a repeated one must be refused naming it
        add("duplicate-header-column", _csv([header + [header[0]], *[x + [x[0]] for x in rows]]),
            expect="err" if fmt == "csv" else "any", line=1, fields=(header[0],))
        for col, rule in rules.items():  # drop each required column entirely
            if not rule.required or rule.kind == "ignored":
                continue
            ci = header.index(col)
            slug = re.sub(r"[^a-z0-9]+", "_", col.lower()).strip("_")
            add(f"drop-column-{slug}", _csv([[h for i, h in enumerate(header) if i != ci],
                                             *[[c for i, c in enumerate(x) if i != ci] for x in rows]]),
                expect="err", line=1, words=col)
        if idcol is not None:
            r1, r2 = 0, len(rows) - 1
            new = [list(x) for x in rows]
            new[r2][header.index(idcol)] = new[r1][header.index(idcol)]
            add("duplicate-id", _csv([header, *new]), expect="err", line=r2 + 2, fields=(idcol,),
                words="duplicate")
        else:
            add("duplicate-row", _csv([header, *rows, rows[0]]), expect="ok")
    return cases


# =================================================================== clusters
YAML_OK = """\
name: lab
description: two spines
tiers:
  - {name: spine, bandwidth_gbps: 400, latency_us: 2}
  - {name: leaf, bandwidth_gbps: 400, latency_us: 1, oversubscription: 2}
minipod_tier: spine
nodes:
  - {path: [s0, l0], count: 3, gpu_type: H100, gpus: 8, prefix: n}
  - {path: [s1, l0], count: 2, gpu_type: A100, gpus: 4, prefix: n}
  - {name: special, path: [s1, l1], gpu_type: T4, gpus: 2}
"""
TIERS_OK = "host,spine,leaf,gpu_type,gpus\na1,s0,l0,H100,8\na2,s0,l1,H100,8\na3,s1,l0,A100-40GB,4\n"
SLURM_OK = """\
# two racks of 4, one spine
SwitchName=s0 Nodes=rack[1]-n[01-04]
SwitchName=s1 Nodes=rack2-n[01-02],rack2-n[03-04] LinkSpeed=100
switchname=spine Switches=s[0-1]
"""
PHILLY_OK = "machineId,number of GPUs,single GPU mem\nm2,8,24GB\nm1,2,12GB\nm10,8,24GB\n"
ALI_NODES_OK = ("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0002,96000,786432,8,G2\n"
                "openb-node-0010,64000,262144,2,T4\nopenb-node-0001,32000,131072,0,\n"
                "openb-node-0003,96000,786432,8,V100M32\n")
PAI_OK = "m1,CPU,96,512,0\nm2,V100,96,512,8\nm3,P100,64,256,2\nm4,MISC,96,512,8\n"
ZJ_HEAD = "accessport,serverIP,nicname,portname,switchIP,switchname,sysname\n"
ZJ_ROW = "p,1.1.1.1,ens1,p,2.2.2.2,NH-DC-NM129-{r}0{k}-ROCE-Leaf-{n}.GPU.S9825,{s}\n"
ZJ_OK = (ZJ_HEAD + "".join(ZJ_ROW.format(r="B", k=k, n=k, s=s) for s in ("GPU-1", "GPU-2") for k in (1, 2))
         + "".join(ZJ_ROW.format(r="D", k=k, n=k + 4, s="GPU-3") for k in (1, 2)))

GPU_COUNTS = ["-1", "abc", "1.5", "", "1e3", "0x10", HUGE_INT, UNICODE, " 8 "]
GPU_TYPES = ["H1000", "", "abc", UNICODE, "h100", "A100", "-1"]


def _count_expect(v: str, zero_ok: bool = True) -> str:
    s = v.strip()
    if s.isascii() and s.isdigit():
        if len(s) > 18:
            return "any"  # does not fit 64 bits
        return "ok" if (int(s) > 0 or zero_ok) else "err"
    return "err"


def _type_expect(v: str) -> str:
    return "ok" if v.strip() in ("h100", "A100") else "err"


def _cluster_cases() -> list[Case]:
    cases: list[Case] = []

    def add(fmt, name, content, query="", suffix=".csv", **kw):
        cases.append(Case(f"{fmt}-{name}", "cluster", fmt, content, query=query, suffix=suffix, **kw))

    # ------------------------------------------------------------------- yaml
    y = lambda name, text, **kw: add("yaml", name, text, suffix=".yaml", **kw)  # noqa: E731
    y("seed", YAML_OK, expect="ok")
    y("empty-file", "", expect="err", words="empty")
    y("only-comment", "# nothing\n", expect="err")
    y("binary-blob", BINARY, expect="err")
    y("unicode-garbage", UNICODE * 10 + "\n", expect="err")
    y("not-a-mapping-list", "- a\n- b\n", expect="err")
    y("not-a-mapping-scalar", "42\n", expect="err")
    y("invalid-yaml", "name: [\n", expect="err", words="invalid YAML")
    y("tab-indent", YAML_OK.replace("  - {name: spine", "\t- {name: spine"), expect="err")
    y("two-documents", YAML_OK + "---\n" + YAML_OK, expect="err")
    y("python-tag", YAML_OK.replace("name: lab", "name: !!python/object:os.system x"), expect="err", line=1)
    for key, line in (("name", 1), ("tiers", 3), ("nodes", 7)):
        text = re.sub(rf"(?ms)^{key}:.*?(?=^\w)", "", YAML_OK) if key != "nodes" else YAML_OK.split("nodes:")[0]
        y(f"missing-{key}", text, expect="err", fields=(key,))
    y("duplicate-top-key", YAML_OK + "name: again\n", expect="err", line=11, fields=("name",))
    y("unknown-top-key", YAML_OK + "racks: 3\n", expect="err", line=11, fields=("racks",))
    y("tiers-not-a-list", YAML_OK.replace("tiers:\n", "tiers: spine\nx_tiers:\n"), expect="err")
    y("tiers-empty", re.sub(r"(?ms)^tiers:.*?(?=^minipod)", "tiers: []\n", YAML_OK), expect="err")
    y("nodes-empty", YAML_OK.split("nodes:")[0] + "nodes: []\n", expect="err", fields=("nodes",))
    y("nodes-mapping", YAML_OK.split("nodes:")[0] + "nodes: {a: 1}\n", expect="err", fields=("nodes",))
    y("node-entry-scalar", YAML_OK + "  - just-a-string\n", expect="err", line=11, fields=("nodes[3]",))
    y("duplicate-host-single", YAML_OK.replace("name: special", "name: n002"), expect="err", line=10,
      fields=("nodes[2].name",))
    y("duplicate-host-group", YAML_OK + "  - {path: [s1, l1], count: 2, gpu_type: T4, gpus: 2, prefix: n, start: 4}\n",
      expect="err", line=11)
    y("duplicate-tier", YAML_OK.replace("{name: leaf,", "{name: spine,"), expect="err", line=5)
    y("path-too-short", YAML_OK.replace("path: [s1, l1]", "path: [s1]"), expect="err", line=10,
      fields=("nodes[2].path",))
    y("path-too-long", YAML_OK.replace("path: [s1, l1]", "path: [s1, l1, x]"), expect="err", line=10,
      fields=("nodes[2].path",))
    y("path-not-list", YAML_OK.replace("path: [s1, l1]", "path: s1"), expect="err", line=10)
    y("path-slash", YAML_OK.replace("path: [s1, l1]", "path: [s1, l/1]"), expect="err", line=10)
    y("path-nested-list", YAML_OK.replace("path: [s1, l1]", "path: [[s1], l1]"), expect="err", line=10)
    y("minipod-unknown", YAML_OK.replace("minipod_tier: spine", "minipod_tier: pod"), expect="err", line=6,
      fields=("minipod_tier",))
    y("name-is-list", YAML_OK.replace("name: lab", "name: [a, b]"), expect="err", line=1, fields=("name",))
    y("name-is-number", YAML_OK.replace("name: lab", "name: 12"), expect="err", line=1, fields=("name",))
    y("name-empty", YAML_OK.replace("name: lab", "name: ''"), expect="err", line=1, fields=("name",))
    for i, v in enumerate(["-4", "abc", "4.5", "1e308", HUGE_INT, "true", "null", "[1]", "'8'"]):
        slug = "1e30int" if v == HUGE_INT else re.sub(r"[^a-z0-9]", "_", v)
        y(f"gpus-{i}-{slug}", YAML_OK.replace("gpus: 4,", f"gpus: {v},"), line=9,
          fields=("nodes[1].gpus",), expect="any" if v == HUGE_INT else "err")
    for i, v in enumerate(["0", "-3", "three", "2.5", "null"]):
        y(f"count-{i}-{re.sub(r'[^a-z0-9]', '_', v)}", YAML_OK.replace("count: 3,", f"count: {v},"), line=8,
          fields=("nodes[0].count",), expect="err")
    for i, v in enumerate(GPU_TYPES):
        y(f"gpu-type-{i}", YAML_OK.replace("gpu_type: T4", f"gpu_type: '{v}'"), line=10,
          fields=("nodes[2].gpu_type",), expect=_type_expect(v))
    # YAML 1.1: `1e308` (no dot) is a string, `1.0e+308` a float
    for i, v in enumerate(["0", "-400", "abc", ".nan", ".inf", "1e308", "null", "1.0e+308", "1.0e+309"]):
        old = "bandwidth_gbps: 400, latency_us: 1"
        text = YAML_OK.replace(old, f"bandwidth_gbps: {v}, latency_us: 1")
        y(f"bandwidth-{i}", text, line=5, fields=("tiers[1].bandwidth_gbps",),
          expect="ok" if v == "1.0e+308" else "err")
    y("latency-negative", YAML_OK.replace("latency_us: 2", "latency_us: -2"), line=4,
      fields=("tiers[0].latency_us",), expect="err")
    y("oversub-zero", YAML_OK.replace("oversubscription: 2", "oversubscription: 0"), line=5, expect="err")
    y("tier-unknown-key", YAML_OK.replace("oversubscription: 2", "oversub: 2"), line=5,
      fields=("tiers[1].oversub",), expect="err")
    y("tier-missing-name", YAML_OK.replace("{name: leaf, ", "{"), line=5, expect="err")
    y("node-missing-gpus", YAML_OK.replace(", gpus: 2}", "}"), line=10, fields=("nodes[2].gpus",), expect="err")
    y("width-negative", YAML_OK.replace("prefix: n}", "prefix: n, width: -1}", 1), line=8, expect="err")
    y("start-negative", YAML_OK.replace("prefix: n}", "prefix: n, start: -5}", 1), line=8, expect="err")
    y("width-huge", YAML_OK.replace("prefix: n}", "prefix: n, width: 100000}", 1), line=8, expect="any")
    y("width-1e30", YAML_OK.replace("prefix: n}", f"prefix: n, width: {HUGE_INT}}}", 1), line=8, expect="any")
    y("group-unknown-key", YAML_OK.replace("prefix: n}", "prefix: n, racks: 2}", 1), line=8, expect="err")
    # an alias repeats the group; its numbering continues (n006…n008), so this is valid
    y("alias-anchor", YAML_OK.replace("{path: [s0, l0]", "&g {path: [s0, l0]") + "  - *g\n", expect="ok")

    # -------------------------------------------------------------- tiers-csv
    t = lambda name, text, query="", **kw: add("tiers-csv", name, text, query, **kw)  # noqa: E731
    rows = TIERS_OK.splitlines()
    t("seed", TIERS_OK, expect="ok")
    t("empty-file", "", expect="err", words="empty")
    t("blank-lines-only", "\n\n  \n", expect="err")
    t("header-only", rows[0] + "\n", expect="err")
    t("binary-blob", BINARY, expect="err")
    t("host-column-only", "host\na1\n", expect="err", line=1)
    t("only-attr-columns", "host,gpu_type,gpus\na1,H100,8\n", expect="err", line=1)
    t("empty-header-cell", TIERS_OK.replace("host,spine,leaf", "host,,leaf"), expect="err", line=1)
    t("duplicate-column", TIERS_OK.replace("host,spine", "host,leaf"), expect="err", line=1)
    t("duplicate-host", TIERS_OK.replace("a3,s1", "a1,s1"), expect="err", line=4, fields=("host",))
    t("duplicate-host-padded", TIERS_OK.replace("a3,s1", " a1 ,s1"), expect="err", line=4, fields=("host",))
    t("empty-host", TIERS_OK.replace("a2,s0", ",s0"), expect="err", line=3, fields=("host",))
    t("empty-switch", TIERS_OK.replace("a2,s0,l1", "a2,s0,"), expect="err", line=3, fields=("leaf",))
    t("slash-switch", TIERS_OK.replace("a2,s0,l1", "a2,s0,l/1"), expect="err", line=3, fields=("leaf",))
    for k in range(1, 5):  # truncated rows
        row = rows[2].split(",")[:k]
        t(f"truncated-row-{k}", "\n".join([*rows[:2], ",".join(row), rows[3]]) + "\n", expect="err", line=3)
    t("extra-field", TIERS_OK.replace("a2,s0,l1,H100,8", "a2,s0,l1,H100,8,9"), expect="err", line=3)
    t("no-gpu-columns-no-query", "host,leaf\nx,l0\ny,l0\n", expect="err", line=2, fields=("gpu_type",))
    t("no-gpu-columns-query", "host,leaf\nx,l0\ny,l0\n", "?gpu_type=H100&gpus_per_node=8", expect="ok")
    t("query-unknown-key", TIERS_OK, "?gpu=8", expect="err", fields=("gpu",))
    t("query-bad-gpus", TIERS_OK, "?gpus_per_node=-8", expect="err", fields=("gpus_per_node",))
    t("query-bad-type", TIERS_OK, "?gpu_type=X9", expect="err", fields=("gpu_type",))
    t("query-not-kv", TIERS_OK, "?gpu_type", expect="err", fields=("query",))
    t("query-twice", TIERS_OK, "?name=a&name=b", expect="err", fields=("name",))
    for i, v in enumerate(GPU_COUNTS):
        q = "?gpus_per_node=8" if v.strip() == "" else ""
        t(f"gpus-{i}", TIERS_OK.replace("A100-40GB,4", f"A100-40GB,{v}"), q, line=4, fields=("gpus",),
          expect="ok" if q else _count_expect(v))
    for i, v in enumerate(GPU_TYPES):
        t(f"gpu-type-{i}", TIERS_OK.replace("H100,8\na2", f"{v},8\na2"), line=2, fields=("gpu_type",),
          expect=_type_expect(v))
    t("unicode-host", TIERS_OK.replace("a2,", UNICODE + ","), expect="ok")
    t("quoted-comma-host", TIERS_OK.replace("a2,", '"a,2",'), expect="ok")
    t("unterminated-quote", TIERS_OK.replace("a2,", '"a2,'), expect="err")
    t("three-tiers-inconsistent", "host,core,spine,leaf,gpus\na,c,s,l,8\nb,c,s,,8\n", "?gpu_type=H100", expect="err",
      line=3, fields=("leaf",))

    # ------------------------------------------------------------------ slurm
    s = lambda name, text, query="?gpu_type=H100", **kw: add("slurm", name, text, query, suffix=".conf", **kw)  # noqa
    s("seed", SLURM_OK, expect="ok")
    s("empty-file", "", expect="err", words="empty")
    s("comments-only", "# nothing\n\n", expect="err", words="empty")
    s("binary-blob", BINARY, expect="err")
    s("unicode-garbage", UNICODE + "\n", expect="err", line=1)
    s("no-gpu-type", SLURM_OK, "", expect="err", fields=("gpu_type",))
    s("unknown-gpu-type", SLURM_OK, "?gpu_type=H1000", expect="err", fields=("gpu_type",))
    s("negative-gpus", SLURM_OK, "?gpu_type=H100&gpus_per_node=-8", expect="err", fields=("gpus_per_node",))
    s("nonint-gpus", SLURM_OK, "?gpu_type=H100&gpus_per_node=1.5", expect="err", fields=("gpus_per_node",))
    s("huge-gpus", SLURM_OK, f"?gpu_type=H100&gpus_per_node={HUGE_INT}", expect="any")
    s("cycle", SLURM_OK + "SwitchName=a Switches=b\nSwitchName=b Switches=a\n", expect="err", fields=("Switches",),
      words="cycle")
    s("cycle-three", SLURM_OK + "SwitchName=a Switches=b\nSwitchName=b Switches=c\nSwitchName=c Switches=a\n",
      expect="err", fields=("Switches",), words="cycle")
    s("self-parent", SLURM_OK + "SwitchName=a Switches=a\n", expect="err", line=5, fields=("Switches",))
    s("unknown-child", SLURM_OK.replace("s[0-1]", "s[0-2]"), expect="err", line=4, fields=("Switches",),
      words="unknown switch 's2'")
    s("two-parents", SLURM_OK + "SwitchName=spine2 Switches=s1\n", expect="err", line=5, fields=("Switches",))
    s("node-in-two-leaves", SLURM_OK.replace("rack2-n[01-02],", "rack1-n01,rack2-n[01-02],"), expect="err",
      line=3, fields=("Nodes",))
    s("node-twice-in-leaf", SLURM_OK.replace("rack[1]-n[01-04]", "rack[1]-n[01-04],rack1-n02"), expect="err",
      line=2, fields=("Nodes",))
    s("inconsistent-depth", SLURM_OK + "SwitchName=s9 Nodes=x1\n", expect="err", line=5, fields=("Switches",))
    s("duplicate-switch", SLURM_OK + "SwitchName=s0 Nodes=y\n", expect="err", line=5, fields=("SwitchName",))
    s("both-nodes-and-switches", SLURM_OK.replace("LinkSpeed=100", "Switches=s0"), expect="err", line=3)
    s("neither", SLURM_OK + "SwitchName=lonely\n", expect="err", line=5, fields=("SwitchName",))
    s("no-switchname", SLURM_OK + "Nodes=x[1-2]\n", expect="err", line=5, fields=("SwitchName",))
    s("unknown-key", SLURM_OK.replace("LinkSpeed", "Speed"), expect="err", line=3, fields=("Speed",))
    s("key-twice", SLURM_OK.replace("LinkSpeed=100", "Nodes=z"), expect="err", line=3, fields=("Nodes",))
    s("not-key-value", SLURM_OK.replace("LinkSpeed=100", "LinkSpeed"), expect="err", line=3)
    s("bad-switch-name", SLURM_OK + "SwitchName=a/b Nodes=q\n", expect="err", line=5, fields=("SwitchName",))
    s("empty-switch-name", SLURM_OK + "SwitchName= Nodes=q\n", expect="err", line=5, fields=("SwitchName",))
    for i, expr in enumerate(["node[1-", "node[b-a]", "node[01-3", "node[3-1]", "node[]", "node]1[", "n[[1-2]]",
                              "node[1-2],,x", "node[-1-3]", "node[1-2", "node[1--2]", UNICODE + "[1-2"]):
        s(f"bad-hostlist-{i}", SLURM_OK.replace("rack[1]-n[01-04]", expr), expect="err", line=2, fields=("Nodes",))
    s("bad-hostlist-switches", SLURM_OK.replace("s[0-1]", "s[0-"), expect="err", line=4, fields=("Switches",))
    s("range-too-large", SLURM_OK.replace("rack[1]-n[01-04]", "n[0-2000000]"), expect="err", line=2,
      fields=("Nodes",))
    s("continuation", SLURM_OK.replace("Nodes=rack2", "\\\n  Nodes=rack2"), expect="ok")
    s("continuation-at-eof", SLURM_OK + "SwitchName=x \\", expect="err")
    s("nodes-query-missing", SLURM_OK, "?gpu_type=H100&nodes=rack[1-3]-n01", expect="err", fields=("nodes",))
    s("nodes-query-bad", SLURM_OK, "?gpu_type=H100&nodes=rack[1-", expect="err", fields=("nodes",))

    # ----------------------------------------------------------------- philly
    p = lambda name, text, **kw: add("philly", name, text, suffix="", **kw)  # noqa: E731
    p("seed", PHILLY_OK, expect="ok")
    p("empty-file", "", expect="err")
    p("header-only", PHILLY_OK.splitlines()[0] + "\n", expect="err")
    p("binary-blob", BINARY, expect="err")
    p("duplicate-host", PHILLY_OK + "m2,8,24GB\n", expect="err", line=5)
    p("truncated-row", PHILLY_OK.replace("m1,2,12GB", "m1,2"), expect="err", line=3)
    p("extra-field", PHILLY_OK.replace("m1,2,12GB", "m1,2,12GB,x"), expect="err", line=3)
    p("bad-id", PHILLY_OK.replace("m1,", "x1,"), expect="err", line=3, fields=("machineId",))
    p("unknown-memory", PHILLY_OK.replace("m1,2,12GB", "m1,2,16GB"), expect="err", line=3,
      fields=("single GPU mem",))
    for i, v in enumerate(GPU_COUNTS):
        p(f"gpus-{i}", PHILLY_OK.replace("m1,2,", f"m1,{v},"), line=3, fields=("number of GPUs",),
          expect=_count_expect(v, zero_ok=False))

    # ---------------------------------------------------------- alibaba-nodes
    a = lambda name, text, **kw: add("alibaba-nodes", name, text, **kw)  # noqa: E731
    a("seed", ALI_NODES_OK, expect="ok")
    a("empty-file", "", expect="err", words="empty")
    a("header-only", ALI_NODES_OK.splitlines()[0] + "\n", expect="err")
    a("binary-blob", BINARY, expect="err")
    a("cpu-only", ALI_NODES_OK.splitlines()[0] + "\nx,1,1,0,\n", expect="err")
    for col in ("sn", "gpu", "model"):
        a(f"missing-column-{col}", ALI_NODES_OK.replace(f",{col}," if col != "model" else ",model",
                                                        "," if col != "model" else "", 1)
          if col != "sn" else ALI_NODES_OK.replace("sn,", "serial,", 1), expect="err", line=1, fields=(col,))
    a("unknown-column", ALI_NODES_OK.replace(",model", ",gpu_model"), expect="err", line=1)
    a("duplicate-host", ALI_NODES_OK.replace("0003,", "0002,"), expect="err", line=5, fields=("sn",))
    a("truncated-row", ALI_NODES_OK.replace("64000,262144,2,T4", "64000,262144"), expect="err", line=3)
    a("empty-sn", ALI_NODES_OK.replace("openb-node-0010", ""), expect="err", line=3, fields=("sn",))
    for i, v in enumerate(GPU_COUNTS):
        a(f"gpu-{i}", ALI_NODES_OK.replace("262144,2,T4", f"262144,{v},T4"), line=3, fields=("gpu",),
          expect=_count_expect(v))
    a("gpu-float-8.0", ALI_NODES_OK.replace("262144,2,T4", "262144,2.0,T4"), expect="ok")
    for i, v in enumerate(GPU_TYPES):
        a(f"model-{i}", ALI_NODES_OK.replace("8,G2", f"8,{v}"), line=2, fields=("model",), expect=_type_expect(v))

    # ----------------------------------------------------------- pai-machines
    m = lambda name, text, suffix=".csv", **kw: add("pai-machines", name, text, suffix=suffix, **kw)  # noqa: E731
    m("seed", PAI_OK, expect="ok")
    m("with-header", "machine,gpu_type,cap_cpu,cap_mem,cap_gpu\n" + PAI_OK, expect="ok")
    m("empty-file", "", expect="err")
    m("only-cpu", "m1,CPU,96,512,0\n", expect="err")
    m("binary-blob", BINARY, expect="err")
    m("binary-tar", BINARY, suffix=".tar.gz", expect="err")
    m("duplicate-host", PAI_OK + "m2,T4,1,1,2\n", expect="err", line=5, fields=("machine",))
    m("truncated-row", PAI_OK.replace("m3,P100,64,256,2", "m3,P100,64"), expect="err", line=3)
    m("extra-field", PAI_OK.replace("m3,P100,64,256,2", "m3,P100,64,256,2,1"), expect="err", line=3)
    for i, v in enumerate(GPU_COUNTS):
        m(f"cap-gpu-{i}", PAI_OK.replace("256,2\n", f"256,{v}\n"), line=3, fields=("cap_gpu",),
          expect=_count_expect(v))
    for i, v in enumerate(GPU_TYPES):
        m(f"gpu-type-{i}", PAI_OK.replace("m3,P100", f"m3,{v}"), line=3, fields=("gpu_type",),
          expect=_type_expect(v))

    # ------------------------------------------------------------ zhejianglab
    z = lambda name, text, query="", **kw: add("zhejianglab", name, text, query, **kw)  # noqa: E731
    z("seed", ZJ_OK, expect="ok")
    z("empty-file", "", expect="err", words="empty")
    z("header-only", ZJ_HEAD, expect="err")
    z("binary-blob", BINARY, expect="err")
    z("missing-sysname", ZJ_OK.replace(",sysname", ",server"), expect="err", line=1, fields=("sysname",))
    z("missing-switchname", ZJ_OK.replace(",switchname,", ",switch,"), expect="err", line=1,
      fields=("switchname",))
    z("truncated-row", ZJ_OK.replace("S9825,GPU-2", "S9825", 1), expect="err", line=4)
    z("empty-sysname", ZJ_OK.replace("S9825,GPU-3", "S9825,", 1), expect="err", line=6, fields=("sysname",))
    z("bad-switchname", ZJ_OK.replace("ROCE-Leaf-5", "Spine-5"), expect="err", line=6, fields=("switchname",))
    z("two-rows", ZJ_OK + ZJ_ROW.format(r="F", k=1, n=9, s="GPU-1"), expect="err", line=2, fields=("switchname",))
    z("unknown-gpu-type", ZJ_OK, "?gpu_type=H1000", expect="err", fields=("gpu_type",))
    z("negative-gpus", ZJ_OK, "?gpus_per_node=-1", expect="err", fields=("gpus_per_node",))
    z("zero-gpus", ZJ_OK, "?gpus_per_node=0", expect="err", fields=("gpus_per_node",))
    z("huge-gpus", ZJ_OK, f"?gpus_per_node={HUGE_INT}", expect="any")
    z("huge-leaf-number", ZJ_OK.replace("Leaf-5", "Leaf-" + "9" * 40), expect="any")
    z("unicode-server", ZJ_OK.replace("GPU-3", UNICODE), expect="ok")
    return cases


# ============================================================ known loom bugs
# Case id → reason: cases that fail today because of a real loom bug (strict
# xfail). Empty: the bugs these cases found (NaN / huge integers in trace
# columns, unlocated gpu_spec errors, GPU-count overflow, duplicate header
# columns, huge YAML widths and counts, huge Slurm hostlists) are fixed.
KNOWN_BUGS: dict[str, str] = {}

TRACE_CASES = _trace_cases()
CLUSTER_CASES = _cluster_cases()
ALL_CASES = TRACE_CASES + CLUSTER_CASES
