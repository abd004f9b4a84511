from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from loom.errors import LoomInputError, UnknownNameError
from loom.hardware.gpus import GpuSpec, gpu_spec, load_gpu_specs

REQUIRED_TYPES = {
    "V100", "T4", "P100", "P40", "A10", "A40", "A100-40GB", "A100-80GB",
    "L20", "H800", "H100", "H200",
}

GOOD_ENTRY = """\
X1:
  tflops_bf16: 100
  tflops_fp16: 100
  memory_gib: 40
  memory_bw_gbps: 1000
  intra_node_gbps: 300
  nic_gbps: 200
  source:
    - https://example.com/x1.pdf
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_bundled_file_loads_with_required_types() -> None:
    specs = load_gpu_specs()
    assert REQUIRED_TYPES <= specs.keys()
    for name, spec in specs.items():
        assert isinstance(spec, GpuSpec)
        assert spec.name == name
        assert spec.source and all(s.startswith("https://") for s in spec.source)
        for f in ("tflops_bf16", "tflops_fp16", "memory_gib", "memory_bw_gbps", "intra_node_gbps", "nic_gbps"):
            assert getattr(spec, f) > 0, (name, f)


def test_bundled_values_are_sane() -> None:
    assert gpu_spec("H100").tflops_bf16 > gpu_spec("A100-80GB").tflops_bf16 > gpu_spec("V100").tflops_fp16
    assert gpu_spec("A100-80GB").memory_gib == 80
    assert gpu_spec("A100-40GB").memory_gib == 40
    assert gpu_spec("P100").memory_gib == 12  # Philly's 2-GPU servers
    assert gpu_spec("P40").memory_gib == 24  # Philly's 8-GPU servers
    # H800 is an H100 with its NVLink cut, not its compute.
    assert gpu_spec("H800").tflops_bf16 == gpu_spec("H100").tflops_bf16
    assert gpu_spec("H800").intra_node_gbps < gpu_spec("H100").intra_node_gbps
    assert gpu_spec("H200").memory_bw_gbps > gpu_spec("H100").memory_bw_gbps


def test_spec_is_frozen_and_default_copy_is_isolated() -> None:
    spec = gpu_spec("H100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.tflops_bf16 = 1.0  # type: ignore[misc]
    specs = load_gpu_specs()
    specs.pop("H100")
    assert "H100" in load_gpu_specs()


def test_custom_file_loads(tmp_path: Path) -> None:
    specs = load_gpu_specs(write(tmp_path, GOOD_ENTRY + "  notes: fine\n"))
    assert specs["X1"] == GpuSpec("X1", 100, 100, 40, 1000, 300, 200, ("https://example.com/x1.pdf",), "fine")


@pytest.mark.parametrize(
    ("old", "new", "field", "line"),
    [
        ("  nic_gbps: 200\n", "  nic_gbps: -5\n", "X1.nic_gbps", 7),
        ("  memory_gib: 40\n", "  memory_gib: lots\n", "X1.memory_gib", 4),
        ("  tflops_fp16: 100\n", "  tflops_fp16: true\n", "X1.tflops_fp16", 3),
        ("  memory_bw_gbps: 1000\n", "", "X1.memory_bw_gbps", 2),
        ("  nic_gbps: 200\n", "  nic_gbps: 200\n  nic_gbits: 200\n", "X1.nic_gbits", 8),
        ("    - https://example.com/x1.pdf\n", "    - ''\n", "X1.source", 9),
    ],
    ids=["negative", "not-a-number", "bool", "missing", "unknown", "empty-source"],
)
def test_bad_entry_names_file_field_and_line(tmp_path: Path, old: str, new: str, field: str, line: int) -> None:
    assert old in GOOD_ENTRY
    path = write(tmp_path, GOOD_ENTRY.replace(old, new))
    with pytest.raises(LoomInputError) as info:
        load_gpu_specs(path)
    err = info.value
    assert err.field == field and err.line == line
    assert str(path) in str(err) and f"'{field}'" in str(err) and f"line {line}" in str(err)


def test_duplicate_type_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_ENTRY + GOOD_ENTRY)
    with pytest.raises(LoomInputError, match="duplicate GPU type") as info:
        load_gpu_specs(path)
    assert info.value.field == "X1" and info.value.line == 10


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_ENTRY.replace("  memory_gib: 40\n", "  memory_gib: [40\n"))
    with pytest.raises(LoomInputError) as info:
        load_gpu_specs(path)
    assert info.value.line is not None
    assert str(path) in str(info.value) and f"line {info.value.line}" in str(info.value)
    assert "invalid YAML" in str(info.value)


@pytest.mark.parametrize("text", ["", "- just\n- a list\n", "X1: 3\n"])
def test_wrong_shape_is_rejected(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(LoomInputError) as info:
        load_gpu_specs(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(LoomInputError) as info:
        load_gpu_specs(path)
    assert str(path) in str(info.value)


def test_unknown_gpu_suggests_close_match() -> None:
    with pytest.raises(UnknownNameError) as info:
        gpu_spec("A100-80G")
    message = str(info.value)
    assert "did you mean" in message and "A100-80GB" in message
    assert "H100" in message  # lists known names
    with pytest.raises(UnknownNameError, match="H100"):
        gpu_spec("h100")
    assert isinstance(info.value, LoomInputError)
