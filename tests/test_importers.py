"""Cluster importers (loom/hardware/importers/) and the named trace clusters."""

from __future__ import annotations

import io
import tarfile
import textwrap
from pathlib import Path

import pytest
import yaml

from loom.errors import LoomInputError
from loom.hardware.clusters import CLUSTERS, IMPORTERS, load_cluster
from loom.hardware.gpus import load_gpu_specs
from loom.hardware.importers._common import gpu_aliases
from loom.hardware.importers.slurm import expand_hostlist
from loom.paths import shared_traces_dir


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def load(fmt: str, path: Path, query: str = ""):
    return IMPORTERS.get(fmt)(f"{path}{query}")


def error(fmt: str, path: Path, query: str = "") -> LoomInputError:
    with pytest.raises(LoomInputError) as info:
        load(fmt, path, query)
    err = info.value
    assert err.source is not None and str(path) in err.source
    return err


def test_all_formats_registered():
    assert {"yaml", "tiers-csv", "slurm", "philly", "alibaba-nodes", "pai-machines", "zhejianglab"} <= set(
        IMPORTERS.names())


def test_gpu_aliases_point_at_specs():
    specs = load_gpu_specs()
    for alias, target in gpu_aliases().items():
        assert target in specs, alias
    for anonymised in ("G2", "G3", "MISC"):
        assert "ASSUMED" in specs[anonymised].notes


# ----------------------------------------------------------------------- yaml
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


def test_yaml_valid(tmp_path):
    topo = load("yaml", write(tmp_path, "c.yaml", YAML_OK))
    assert topo.name == "lab" and topo.num_nodes == 6
    assert topo.node_names == ("n001", "n002", "n003", "n004", "n005", "special")
    assert topo.total_gpus == 3 * 8 + 2 * 4 + 2
    assert topo.gpus_by_type()["A100-80GB"] == (2, 8)  # alias
    assert topo.num_switches(1) == 3 and topo.tiers[1].oversubscription == 2
    assert topo.minipod_tier == 0


@pytest.mark.parametrize(
    ("old", "new", "line", "field"),
    [
        ("minipod_tier: spine", "minipod_tier: spine\nracks: 3", 7, "racks"),
        ("count: 3, gpu_type", "count: three, gpu_type", 8, "nodes[0].count"),
        ("gpus: 4, prefix", "gpus: -4, prefix", 9, "nodes[1].gpus"),
        ("path: [s1, l1]", "path: [s1]", 10, "nodes[2].path"),
        ("gpu_type: T4", "gpu_type: T5", 10, "nodes[2].gpu_type"),
        ("name: special", "name: n002", 10, "nodes[2].name"),
        ("bandwidth_gbps: 400, latency_us: 1", "bandwidth_gbps: 0, latency_us: 1", 5, "tiers[1].bandwidth_gbps"),
        ("oversubscription: 2", "oversub: 2", 5, "tiers[1].oversub"),
        ("minipod_tier: spine", "minipod_tier: pod", 6, "minipod_tier"),
    ],
)
def test_yaml_errors_are_located(tmp_path, old, new, line, field):
    err = error("yaml", write(tmp_path, "c.yaml", YAML_OK.replace(old, new)))
    assert (err.line, err.field) == (line, field)


def test_yaml_empty_and_missing(tmp_path):
    assert "empty" in error("yaml", write(tmp_path, "e.yaml", "")).message
    err = error("yaml", write(tmp_path, "m.yaml", "name: x\ntiers: [{name: leaf}]\n"))
    assert err.field == "nodes"
    err = error("yaml", write(tmp_path, "bad.yaml", "name: [\n"))
    assert "invalid YAML" in err.message


# ------------------------------------------------------------------ tiers-csv
CSV_OK = """\
host,spine,leaf,gpu_type,gpus
a1,s0,l0,H100,8
a2,s0,l1,,
a3,s1,l0,A100-40GB,4
"""


def test_tiers_csv_valid_with_defaults(tmp_path):
    path = write(tmp_path, "hosts.csv", CSV_OK)
    topo = load("tiers-csv", path, "?gpu_type=H800&gpus_per_node=2")
    assert [t.name for t in topo.tiers] == ["spine", "leaf"]
    assert topo.num_switches(1) == 3  # l0 under s0 and l0 under s1 are distinct
    assert topo.gpus_by_type() == {"H100": (1, 8), "H800": (1, 2), "A100-40GB": (1, 4)}
    assert topo.tiers[0].bandwidth_gbps == 400 and topo.tiers[0].oversubscription == 1
    via_cli_spec = load_cluster(f"tiers-csv:{path}?gpu_type=H800&gpus_per_node=2")
    assert via_cli_spec.total_gpus == 14


def test_tiers_csv_without_attribute_columns(tmp_path):
    path = write(tmp_path, "h.csv", "host,leaf\nx,l0\ny,l0\n")
    assert load("tiers-csv", path, "?gpu_type=H100&gpus_per_node=8").total_gpus == 16
    assert error("tiers-csv", path).field == "gpu_type"
    assert error("tiers-csv", path, "?gpu_type=H100").field == "gpus"
    assert error("tiers-csv", path, "?gpu_type=H100&gpu=8").field == "gpu"


@pytest.mark.parametrize(
    ("old", "new", "line", "field"),
    [
        ("a3,s1", "a1,s1", 4, "host"),
        ("H100,8", "H1000,8", 2, "gpu_type"),
        ("A100-40GB,4", "A100-40GB,four", 4, "gpus"),
        ("a2,s0,l1", "a2,s0,", 3, "leaf"),
        ("a2,s0,l1,,", "a2,s0,l1,", 3, None),
        ("host,spine", "host,host", 1, "host"),
    ],
)
def test_tiers_csv_errors(tmp_path, old, new, line, field):
    err = error("tiers-csv", write(tmp_path, "h.csv", CSV_OK.replace(old, new)), "?gpu_type=H100&gpus_per_node=8")
    assert (err.line, err.field) == (line, field)


def test_tiers_csv_empty_and_no_tiers(tmp_path):
    assert "empty" in error("tiers-csv", write(tmp_path, "e.csv", "")).message
    assert error("tiers-csv", write(tmp_path, "t.csv", "host,gpus\na,8\n")).field == "header"


# ---------------------------------------------------------------------- slurm
SLURM_OK = """\
# two racks of 4, one spine
SwitchName=s0 Nodes=rack[1]-n[01-04]
SwitchName=s1 Nodes=rack2-n[01-02],rack2-n[03-04] LinkSpeed=100
switchname=spine Switches=s[0-1]   # keys are case-insensitive
"""


def test_hostlist_expansion():
    assert expand_hostlist("node[001-003]") == ["node001", "node002", "node003"]
    assert expand_hostlist("a[1,3-4],b") == ["a1", "a3", "a4", "b"]
    assert expand_hostlist("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    for bad in ("n[1-", "n[3-1]", "n[a-b]", "n]1[", ""):
        with pytest.raises(ValueError):
            expand_hostlist(bad)


def test_slurm_valid(tmp_path):
    topo = load("slurm", write(tmp_path, "topology.conf", SLURM_OK), "?gpu_type=H100&gpus_per_node=8")
    assert topo.num_nodes == 8 and topo.total_gpus == 64
    assert [t.name for t in topo.tiers] == ["spine", "leaf"]
    assert topo.switch_names[1] == ("spine/s0", "spine/s1")
    assert topo.node_names[0] == "rack1-n01"


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (SLURM_OK.replace("s[0-1]", "s[0-2]"), 4, "Switches", "unknown switch 's2'"),
        (SLURM_OK.replace("s[0-1]", "s[0-2]") + "SwitchName=s2 Nodes=rack1-n04\n", 5, "Nodes", "both"),
        (SLURM_OK + "SwitchName=a Switches=b\nSwitchName=b Switches=a\n", None, "Switches", "cycle"),
        (SLURM_OK.replace("n[01-04]\n", "n[01-04\n"), 2, "Nodes", "bad hostlist"),
        (SLURM_OK + "SwitchName=s9 Nodes=x1\n", 5, "Switches", "same depth"),
        (SLURM_OK.replace("LinkSpeed", "Speed"), 3, "Speed", "unknown key"),
        (SLURM_OK + "SwitchName=s0 Nodes=y\n", 5, "SwitchName", "already defined"),
    ],
)
def test_slurm_errors(tmp_path, text, line, field, words):
    err = error("slurm", write(tmp_path, "topology.conf", text), "?gpu_type=H100")
    assert err.field == field and words in err.message
    if line is not None:
        assert err.line == line


def test_slurm_needs_gpu_type_and_reports_unswitched_nodes(tmp_path):
    path = write(tmp_path, "topology.conf", SLURM_OK)
    assert error("slurm", path).field == "gpu_type"
    assert error("slurm", path, "?gpu_type=X9").field == "gpu_type"
    err = error("slurm", path, "?gpu_type=H100&nodes=rack[1-3]-n01")
    assert err.field == "nodes" and "rack3-n01" in err.message
    assert "empty" in error("slurm", write(tmp_path, "e.conf", "# nothing\n"), "?gpu_type=H100").message


# ------------------------------------------------------------ philly, alibaba
def test_philly_format(tmp_path):
    path = write(tmp_path, "ml", "machineId,number of GPUs,single GPU mem\nm2,8,24GB\nm1,2,12GB\n")
    topo = load("philly", path)
    assert topo.num_nodes == 2 and topo.total_gpus == 10
    err = error("philly", write(tmp_path, "bad", "h\nm1,2,16GB\n"))
    assert (err.line, err.field) == (2, "single GPU mem")


ALIBABA_OK = """\
sn,cpu_milli,memory_mib,gpu,model
openb-node-0002,96000,786432,8,G2
openb-node-0010,64000,262144,2,T4
openb-node-0001,32000,131072,0,
openb-node-0003,96000,786432,8,V100M32
"""


def test_alibaba_nodes(tmp_path):
    topo = load("alibaba-nodes", write(tmp_path, "n.csv", ALIBABA_OK))
    assert topo.num_nodes == 3  # the CPU-only node is skipped
    assert topo.gpus_by_type() == {"G2": (1, 8), "T4": (1, 2), "V100": (1, 8)}
    assert topo.num_switches(1) == 3  # one pod per SKU


@pytest.mark.parametrize(
    ("old", "new", "line", "field"),
    [
        ("8,G2", "8,G9", 2, "model"),
        ("2,T4", "two,T4", 3, "gpu"),
        ("0003,", "0002,", 5, "sn"),
        (",model", ",gpu_model", 1, "model"),
    ],
)
def test_alibaba_nodes_errors(tmp_path, old, new, line, field):
    err = error("alibaba-nodes", write(tmp_path, "n.csv", ALIBABA_OK.replace(old, new)))
    assert (err.line, err.field) == (line, field)


def test_alibaba_nodes_empty(tmp_path):
    assert "empty" in error("alibaba-nodes", write(tmp_path, "n.csv", "")).message


def test_pai_machines_plain_and_tar(tmp_path):
    rows = "m1,CPU,96,512,0\nm2,V100,96,512,8\nm3,P100,64,256,2\nm4,MISC,96,512,8\n"
    plain = write(tmp_path, "pai_machine_spec.csv", rows)
    topo = load("pai-machines", plain)
    assert topo.gpus_by_type() == {"V100-16GB": (1, 8), "P100": (1, 2), "MISC": (1, 8)}
    archive = tmp_path / "spec.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = rows.encode()
        info = tarfile.TarInfo("pai_machine_spec.csv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert load("pai-machines", archive).total_gpus == 18
    err = error("pai-machines", write(tmp_path, "bad.csv", rows + "m5,K80,1,1,4\n"))
    assert (err.line, err.field) == (5, "gpu_type")
    err = error("pai-machines", write(tmp_path, "short.csv", "m1,T4,1,1\n"))
    assert err.line == 1


def test_zhejianglab_format(tmp_path):
    head = "accessport,serverIP,nicname,portname,switchIP,switchname,sysname\n"
    row = "p,1.1.1.1,ens1,p,2.2.2.2,NH-DC-NM129-{r}0{k}-ROCE-Leaf-{n}.GPU.S9825,{s}\n"
    text = head + "".join(row.format(r="B", k=k, n=k, s=s) for s in ("GPU-1", "GPU-2") for k in (1, 2))
    text += "".join(row.format(r="D", k=k, n=k + 4, s="GPU-3") for k in (1, 2))
    topo = load("zhejianglab", write(tmp_path, "z.csv", text))
    assert topo.num_nodes == 3 and topo.total_gpus == 24
    assert topo.switch_names[1] == ("spines/row-B", "spines/row-D")
    assert topo.switch_names[2] == ("spines/row-B/leaf-1", "spines/row-D/leaf-5")
    bad = text + row.format(r="F", k=1, n=9, s="GPU-1")
    err = error("zhejianglab", write(tmp_path, "b.csv", bad))
    assert (err.line, err.field) == (2, "switchname")
    err = error("zhejianglab", write(tmp_path, "c.csv", text.replace("ROCE-Leaf-5", "Spine-5")))
    assert (err.line, err.field) == (6, "switchname")


# --------------------------------------------------------------- named clusters
def test_unknown_format_is_an_input_error():
    with pytest.raises(LoomInputError, match="unknown cluster format"):
        load_cluster("nope:/tmp/x")


@pytest.mark.parametrize(
    ("name", "nodes", "gpus", "by_type"),
    [
        ("alibaba-v2023", 1213, 6212, {"G2": (549, 4392), "G3": (39, 312), "T4": (404, 842), "A10": (2, 2)}),
        ("alibaba-v2020", 1814, 6742, {"P100": (798, 1596), "T4": (497, 994), "MISC": (280, 2240),
                                       "V100-16GB": (104, 832), "V100": (135, 1080)}),
        ("arena-1280", 420, 1280, {"A100-40GB": (80, 320), "V100": (20, 320), "A40": (160, 320),
                                   "A10": (160, 320)}),
        ("acme-kalos", 302, 2416, {"A100-80GB": (302, 2416)}),
        ("acme-seren", 286, 2288, {"A100-80GB": (286, 2288)}),
        ("zhejianglab", 253, 2024, {"A100-80GB": (253, 2024)}),
    ],
)
def test_named_trace_clusters(name, nodes, gpus, by_type):
    try:
        shared_traces_dir()
    except LoomInputError:
        pytest.skip("shared traces not available")
    assert name in CLUSTERS
    topo = load_cluster(name)
    assert (topo.num_nodes, topo.total_gpus) == (nodes, gpus)
    assert {k: v for k, v in topo.gpus_by_type().items() if k in by_type} == by_type


def test_named_cluster_shapes():
    try:
        shared_traces_dir()
    except LoomInputError:
        pytest.skip("shared traces not available")
    kalos = load_cluster("acme-kalos")
    assert [t.name for t in kalos.tiers] == ["core", "minipod", "leaf"] and kalos.num_switches(1) == 3
    zj = load_cluster("zhejianglab")
    assert zj.num_switches(1) == 5  # rows B, D, F, H, J
    assert sorted(int((zj.switch_of[1] == i).sum()) for i in range(5)) == [24, 49, 60, 60, 60]
    assert load_cluster("arena-1280").num_switches(1) == 4  # one pod per GPU type


def test_yaml_spec_loads_with_plain_yaml_too(tmp_path):
    # the documented example is valid YAML for other tools as well
    assert yaml.safe_load(YAML_OK)["name"] == "lab"


def test_philly_revised_machine_list(tmp_path):
    from loom.hardware.clusters import load_cluster

    path = tmp_path / "revised.csv"
    path.write_text(",machineId,number of GPUs\n0,m0,8\n1,m1,4\n2,m2,0\n")
    topo = load_cluster(f"philly-revised:{path}?gpu_type=P100")
    assert topo.num_nodes == 2 and topo.gpus_by_type() == {"P100": (2, 12)}
    path.write_text(",machineId,number of GPUs\n0,m0,8\n1,m0,4\n")
    with pytest.raises(LoomInputError, match=r"line 3, field 'machineId': machine 'm0' appears twice"):
        load_cluster(f"philly-revised:{path}")
