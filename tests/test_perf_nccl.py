"""loom.perf.nccl: nccl-tests parsing and measured communication costs."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from loom.errors import LoomInputError
from loom.paths import shared_traces_dir
from loom.perf.calibration import load_calibration
from loom.perf.comm import BusBandwidthComm, GroupShape, Links
from loom.perf.nccl import MeasuredComm, NcclTable, parse_nccl_tests

GIB = 2**30
LINKS = Links(intra_node_gbps=450.0, nic_gbps=50.0)

HEADER = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 5 iters: 20
#
# Using devices
#  Rank  0 Group  0 Pid 1 on hosta device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid 2 on hosta device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid 3 on hostb device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid 4 on hostb device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""
ROWS = """\
           8             2     float     sum      -1    10.0    0.00    0.00      0    10.0    0.00    0.00      0
        1024           256     float     sum      -1    20.0    0.05    0.08      0    20.0    0.05    0.08      0
"""


@pytest.fixture(scope="module")
def shared() -> NcclTable:
    path = shared_traces_dir() / "nccl" / "gcp_a3mega_2x8xH100_all_reduce_perf.txt"
    if not path.is_file():
        pytest.skip("shared nccl-tests trace not available")
    return parse_nccl_tests(path)


@pytest.fixture(scope="module")
def fallback() -> BusBandwidthComm:
    return BusBandwidthComm(load_calibration())


@pytest.fixture(scope="module")
def measured(shared: NcclTable, fallback: BusBandwidthComm) -> MeasuredComm:
    return MeasuredComm([shared], fallback)


def write(tmp_path: Path, text: str, name: str = "run.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- parsing ---------------------------------------------------------------


def test_parses_shared_file(shared: NcclTable) -> None:
    assert shared.op == "all_reduce"
    assert (shared.ranks, shared.ranks_per_node, shared.nodes) == (16, 8, 2)
    assert len(shared.sizes) == len(shared.times_s) == 31
    assert shared.sizes[0] == 8 and shared.sizes[-1] == 8 * GIB
    assert shared.times_s[-1] == pytest.approx(47535e-6)
    assert shared.source.endswith("gcp_a3mega_2x8xH100_all_reduce_perf.txt")


def test_op_from_binary_and_override(tmp_path: Path) -> None:
    path = write(tmp_path, "> mpirun -np 4 ./build/reduce_scatter_perf -b 8 -e 1K\n" + HEADER + ROWS)
    table = parse_nccl_tests(path)
    assert (table.op, table.ranks, table.ranks_per_node) == ("reduce_scatter", 4, 2)
    assert table.sizes == (8, 1024) and table.times_s == pytest.approx((10e-6, 20e-6))
    assert parse_nccl_tests(path, op="all_gather").op == "all_gather"
    send = write(tmp_path, "$ ./build/sendrecv_perf -b 8\n" + HEADER + ROWS, "send.txt")
    assert parse_nccl_tests(send).op == "send"


def test_ranks_from_mpirun_flags_without_rank_lines(tmp_path: Path) -> None:
    header = "\n".join(line for line in HEADER.splitlines() if "Rank" not in line) + "\n"
    path = write(tmp_path, "> mpirun -np 16 -npernode 8 all_reduce_perf\n" + header + ROWS)
    table = parse_nccl_tests(path)
    assert (table.ranks, table.ranks_per_node) == (16, 8)


def test_nccl_debug_lines_are_skipped(tmp_path: Path) -> None:
    log = "hosta:1:1 [0] NCCL INFO Channel 00/02 : 0 1 2 3\n"
    path = write(tmp_path, "all_reduce_perf\n" + HEADER + log + ROWS)
    assert len(parse_nccl_tests(path).sizes) == 2


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("all_reduce_perf\n" + HEADER, 12, None),  # no data rows
        ("all_reduce_perf\n" + HEADER + ROWS.replace("20.0", "fast", 1), 14, "time"),
        ("all_reduce_perf\n" + HEADER + ROWS + "        2048      512  float\n", 15, "time"),
        ("all_reduce_perf\n" + HEADER + "   8.5  2  float  sum  -1  10.0  0.0  0.0  0\n", 13, "size"),
        ("all_reduce_perf\n" + HEADER + "   8  2  float  sum  -1  0.0  0.0  0.0  0\n", 13, "time"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, line: int, field: str | None) -> None:
    path = write(tmp_path, text, "bad_nccl.txt")
    with pytest.raises(LoomInputError) as info:
        parse_nccl_tests(path)
    message = str(info.value)
    assert "bad_nccl.txt" in message and f"line {line}" in message
    assert info.value.line == line and info.value.field == field


def test_unreadable_and_unknown_op(tmp_path: Path) -> None:
    with pytest.raises(LoomInputError, match="missing.txt"):
        parse_nccl_tests(tmp_path / "missing.txt")
    path = write(tmp_path, HEADER + ROWS)
    with pytest.raises(LoomInputError, match="operation"):
        parse_nccl_tests(path)
    with pytest.raises(LoomInputError, match="unknown operation"):
        parse_nccl_tests(path, op="broadcast")


# --- measured costs ------------------------------------------------------------


def test_reproduces_measured_points(shared: NcclTable, measured: MeasuredComm) -> None:
    group = GroupShape(16, 8)
    # every point not undercut by a larger message comes back exactly
    times = shared.times_s
    for i, (size, t) in enumerate(zip(shared.sizes, times)):
        if t <= min(times[i:]):
            assert measured.all_reduce(size, group, LINKS) == pytest.approx(t)
        else:  # noisy reading: the envelope of the larger messages
            assert measured.all_reduce(size, group, LINKS) == pytest.approx(min(times[i:]))
    assert measured.all_reduce(GIB, group, LINKS) == pytest.approx(6.759e-3)


def test_interpolation_between_neighbours(shared: NcclTable, measured: MeasuredComm) -> None:
    group = GroupShape(16, 8)
    for i in range(20, len(shared.sizes) - 1):
        mid = (shared.sizes[i] * shared.sizes[i + 1]) ** 0.5
        t = measured.all_reduce(mid, group, LINKS)
        assert shared.times_s[i] < t < shared.times_s[i + 1]


def test_extrapolation(shared: NcclTable, measured: MeasuredComm) -> None:
    group = GroupShape(16, 8)
    assert measured.all_reduce(16 * GIB, group, LINKS) == pytest.approx(2 * shared.times_s[-1])
    assert measured.all_reduce(1, group, LINKS) == pytest.approx(min(shared.times_s[:12]))


def test_monotonic_in_size(measured: MeasuredComm) -> None:
    for group in (GroupShape(16, 8), GroupShape(32, 8), GroupShape(64, 4, minipods=2, oversubscription=2.0)):
        sizes = [2.0**e for e in range(36)] + [3.0 * 2**e for e in range(34)]
        times = [measured.all_reduce(s, group, LINKS) for s in sorted(sizes)]
        assert all(a <= b for a, b in itertools.pairwise(times))


def test_other_shapes_scale_with_nodes_and_members(measured: MeasuredComm) -> None:
    two = measured.all_reduce(4 * GIB, GroupShape(16, 8), LINKS)
    four = measured.all_reduce(4 * GIB, GroupShape(32, 8), LINKS)
    assert four / two == pytest.approx(1.5)  # (3/4) / (1/2)
    half_nics = measured.all_reduce(4 * GIB, GroupShape(8, 4), LINKS)
    assert half_nics / two == pytest.approx(2.0)  # same 2 nodes, 4 NICs instead of 8


def test_minipod_loss_and_oversubscription(measured: MeasuredComm) -> None:
    cal = load_calibration()
    base = measured.all_reduce(GIB, GroupShape(32, 8), LINKS)
    spread = measured.all_reduce(GIB, GroupShape(32, 8, minipods=cal.saturate_minipods), LINKS)
    assert spread == pytest.approx(base / (1 - cal.minipod_loss_collective))
    oversub = measured.all_reduce(GIB, GroupShape(32, 8, oversubscription=3.0), LINKS)
    assert oversub == pytest.approx(3 * base)


def test_fallbacks(measured: MeasuredComm, fallback: BusBandwidthComm) -> None:
    intra = GroupShape(8, 8)
    assert measured.all_reduce(GIB, intra, LINKS) == fallback.all_reduce(GIB, intra, LINKS)
    inter = GroupShape(16, 8)
    assert measured.send(GIB, GroupShape(2, 1), LINKS) == fallback.send(GIB, GroupShape(2, 1), LINKS)
    # no reduce-scatter / all-gather table: analytical model
    assert measured.reduce_scatter(GIB, inter, LINKS) == fallback.reduce_scatter(GIB, inter, LINKS)
    assert measured.all_gather(GIB, inter, LINKS) == fallback.all_gather(GIB, inter, LINKS)
    assert measured.all_reduce(0, inter, LINKS) == fallback.all_reduce(0, inter, LINKS)


def test_table_per_op(tmp_path: Path, shared: NcclTable, fallback: BusBandwidthComm) -> None:
    rs = parse_nccl_tests(write(tmp_path, "reduce_scatter_perf\n" + HEADER + ROWS))
    model = MeasuredComm([shared, rs], fallback)
    group = GroupShape(4, 2)
    assert model.reduce_scatter(1024, group, LINKS) == pytest.approx(20e-6)
    assert model.all_gather(1024, group, LINKS) == fallback.all_gather(1024, group, LINKS)
    # the all-reduce table (2 × 8) is used for the 2 × 2 group: 4× fewer NICs
    assert model.all_reduce(GIB, group, LINKS) == pytest.approx(4 * 6.759e-3)
