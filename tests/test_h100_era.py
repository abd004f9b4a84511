"""h100_era.csv: the loader's located errors and exclusions, the per-generation calibration,
and the bundled fit's accuracy on the core rows (bundled parameters, no refit: cheap)."""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

import pytest

import loom.perf
from loom.errors import LoomInputError
from loom.hardware.gpus import load_gpu_specs
from loom.paths import shared_traces_dir
from loom.perf.calibration import load_calibration
from loom.perf.fit import era_error, era_group
from loom.perf.h100_era import COLUMNS, load_h100_era

ERA_CSV = shared_traces_dir().parent / "calibration" / "h100_era.csv"
# A well-formed Megatron-style row (Llama 2 70B, NeMo 24.07 on 64 DGX H100, row 5 of the table).
GOOD = {
    "id": "5", "core": "1", "system": "NeMo (Megatron-Core)", "gpu_type": "H100-80GB SXM (DGX-H100)",
    "gpus": "64", "model": "Llama2-70B", "arch": "dense", "layers": "80", "hidden": "8192", "ffn_hidden": "28672",
    "heads": "64", "kv_heads": "8", "num_experts": "", "topk": "", "seq_len": "4096", "vocab": "32000",
    "global_batch": "128", "micro_batch": "1", "grad_accum": "32", "tp": "4", "pp": "4", "vpp": "20", "cp": "1",
    "ep": "1", "dp": "4", "sharding": "", "precision": "fp8", "recompute": "", "tokens_per_s_per_gpu": "1728",
    "note": "",
}  # fmt: skip


def write_rows(tmp_path: Path, *rows: dict[str, str]) -> Path:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS))
    writer.writeheader()
    writer.writerows(rows)
    path = tmp_path / "era.csv"
    path.write_text(out.getvalue())
    return path


def test_a_good_row_maps_to_the_published_plan(tmp_path):
    runs, excluded = load_h100_era(write_rows(tmp_path, GOOD))
    assert not excluded
    (run,) = runs
    assert (run.gpu_type, run.system, run.job.precision, run.job.model.mlp, run.job.model.kv_heads) == (
        "H100", "NeMo", "fp8", "swiglu", 8)
    plan = run.plan
    assert (plan.dp, plan.tp, plan.pp, plan.virtual_stages, plan.zero_stage, plan.recompute) == (4, 4, 4, 20, 1, "none")


def test_fsdp_rows_shard_everything_and_use_the_local_batch(tmp_path):
    row = GOOD | {"system": "MaxText (JAX/XLA)", "tp": "1", "pp": "1", "vpp": "", "dp": "2048", "gpus": "2048",
                  "micro_batch": "2", "global_batch": "4096", "sharding": "FSDP=128 x DP=16", "precision": "bf16"}
    (run,), _ = load_h100_era(write_rows(tmp_path, row))
    assert (run.plan.zero_stage, run.plan.zero_shard, run.plan.micro_batch) == (3, 128, 2)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("tp", "four", "positive integer"),
        ("gpu_type", "H100-80GB PCIe (unknown)", "unknown GPU type"),
        ("precision", "int4", "fp8"),
        ("tokens_per_s_per_gpu", "fast", "not a number"),
        ("dp", "8", "GPUs"),  # tp·pp·cp·dp ≠ gpus
        ("recompute", "sometimes", "none, selective or full"),
    ],
)
def test_bad_cells_name_file_line_and_column(tmp_path, column, value, message):
    path = write_rows(tmp_path, GOOD, GOOD | {column: value})
    with pytest.raises(LoomInputError, match=message) as info:
        load_h100_era(path)
    assert (info.value.source, info.value.line, info.value.field) == (str(path), 3, column)


def test_a_missing_column_is_named(tmp_path):
    path = tmp_path / "era.csv"
    path.write_text("id,core\n1,1\n")
    with pytest.raises(LoomInputError, match="missing column") as info:
        load_h100_era(path)
    assert (info.value.line, info.value.field) == (1, "system")


def test_rows_the_estimator_cannot_express_are_excluded_with_a_reason(tmp_path):
    mla = GOOD | {"id": "24", "model": "DeepSeek-V3", "kv_heads": "MLA"}
    no_rate = GOOD | {"id": "11", "tokens_per_s_per_gpu": ""}
    runs, excluded = load_h100_era(write_rows(tmp_path, GOOD, mla, no_rate))
    assert [r.row_id for r in runs] == [5]
    reasons = {x.row_id: x.reason for x in excluded}
    assert "MLA" in reasons[24] and "tokens/s" in reasons[11]


def test_generation_fractions_apply_to_their_generation_only():
    cal = load_calibration()
    hopper = dict(cal.gemm_by_generation)
    assert cal.gemm_fraction("H100", "fp8") == hopper[("hopper", "fp8")]
    assert cal.gemm_fraction("H200-A3-Ultra", "fp16") == hopper[("hopper", "bf16")]
    assert cal.gemm_fraction("A100-80GB", "bf16") == cal.gemm_efficiency  # Table 1's fit, unchanged
    assert cal.gemm_fraction("not-a-gpu", "bf16") == cal.gemm_efficiency


@pytest.mark.parametrize(
    ("old", "new"),
    [("  hopper:\n", "  blackwell:\n"), ("    fp8: ", "    int8: "), ("    fp8: ", "    fp8: 1.7 #")],
    ids=["generation", "precision", "range"],
)
def test_calibration_generation_table_is_validated(tmp_path, old, new):
    text = (Path(loom.perf.__file__).parent / "data" / "calibration.yaml").read_text()
    assert old in text
    path = tmp_path / "cal.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(LoomInputError, match="gemm_by_generation"):
        load_calibration(path)


def test_gpu_architecture_is_validated(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("X1:\n  architecture: kepler\n  tflops_bf16: 1\n  tflops_fp16: 1\n  memory_gib: 1\n"
                    "  memory_bw_gbps: 1\n  intra_node_gbps: 1\n  nic_gbps: 1\n  source: [https://example.com]\n")
    with pytest.raises(LoomInputError, match="hopper") as info:
        load_gpu_specs(path)
    assert (info.value.line, info.value.field) == (2, "X1.architecture")


@pytest.mark.skipif(not ERA_CSV.exists(), reason="../shared/calibration/h100_era.csv not present")
def test_bundled_calibration_reproduces_the_core_rows():
    """In-sample MAPE of the bundled parameters on the core rows (docs/BENCHMARKS.md has the
    leave-one-out figure; refitting is the bench's job, too slow for a test)."""
    runs, excluded = load_h100_era(ERA_CSV)
    assert len(runs) + len(excluded) == 84
    cal = load_calibration()
    core = [r for r in runs if r.core]
    errors = [abs(era_error(r, cal)) for r in core]
    assert statistics.mean(errors) <= 0.10  # the floor is on leave-one-out (bench: 8.2%)
    fitted = [abs(era_error(r, cal)) for r in core if era_group(r) is not None]
    assert fitted and statistics.mean(fitted) <= 0.10


@pytest.mark.parametrize(
    ("table", "note", "fused"),
    [("Table 1 row \"FSDP\"", "no torch.compile", False), ("Table 1 row \"FSDP + torch.compile\"", "", True),
     ("Async TP column", "", True), ("row 1 (Optimizations: None)", "", False)],
)
def test_torchtitan_is_eager_unless_compiled(tmp_path, table, note, fused):
    row = GOOD | {"system": "torchtitan (PyTorch FSDP2/DTensor)", "tp": "1", "pp": "1", "vpp": "", "dp": "64",
                  "micro_batch": "2", "source_table": table, "note": note, "precision": "bf16"}
    (run,), _ = load_h100_era(write_rows(tmp_path, row))
    assert run.job.fused_kernels is fused


def test_model_shape_errors_name_the_csv_column(tmp_path):
    path = write_rows(tmp_path, GOOD | {"arch": "moe", "num_experts": "2", "topk": "4"})
    with pytest.raises(LoomInputError, match="top_k") as info:
        load_h100_era(path)
    assert (info.value.line, info.value.field) == (2, "topk")
