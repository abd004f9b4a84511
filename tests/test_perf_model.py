"""loom.perf model spec, parameter counts, FLOPs and presets."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom.errors import LoomInputError, UnknownNameError
from loom.perf import (
    ModelSpec,
    flops_per_iteration,
    load_presets,
    megatron_flops,
    preset,
    preset_names,
)

TABLE1 = (
    Path(__file__).resolve().parents[1].parent
    / "shared"
    / "calibration"
    / "megatron_lm_table1.csv"
)
MEGATRON_NAMES = [
    "megatron-1.7b",
    "megatron-3.6b",
    "megatron-7.5b",
    "megatron-18.4b",
    "megatron-39.1b",
    "megatron-76.1b",
    "megatron-145.6b",
    "megatron-310.1b",
    "megatron-529.6b",
    "megatron-1t",
]


def _table1() -> list[dict[str, str]]:
    if not TABLE1.exists():
        pytest.skip(f"calibration table not found at {TABLE1}")
    with TABLE1.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("gpt3-175b", 174.6e9),
        ("llama2-7b", 6.74e9),
        ("llama2-13b", 13.0e9),
        ("llama2-70b", 69.0e9),
    ],
)
def test_param_counts_match_published(name, published):
    assert preset(name).total_params() == pytest.approx(published, rel=0.015)


def test_gpt3_param_count_from_explicit_shape():
    m = ModelSpec("g", layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)
    assert m.total_params() == pytest.approx(174.6e9, rel=0.002)
    assert m.activated_params() == m.total_params()


def test_megatron_table1_rows_and_flops():
    rows = _table1()
    assert len(rows) == len(MEGATRON_NAMES)
    for name, row in zip(MEGATRON_NAMES, rows, strict=True):
        m = preset(name)
        assert (m.heads, m.hidden, m.layers, m.seq_len, m.vocab) == tuple(
            int(row[k]) for k in ("heads", "hidden", "layers", "seq_len", "vocab")
        )
        # published sizes are rounded to 0.1B (1.65B prints as 1.7)
        assert m.total_params() == pytest.approx(
            float(row["params_b"]) * 1e9, rel=0.015, abs=0.06e9
        )
        b = int(row["global_batch"])
        ref = megatron_flops(b, m.seq_len, m.layers, m.hidden, m.vocab)
        assert flops_per_iteration(m, b, recompute="full") == pytest.approx(
            ref, rel=0.02
        )
        # model FLOPs (no recomputation) are 3/4 of that
        assert flops_per_iteration(m, b) == pytest.approx(0.75 * ref, rel=0.02)


def test_recompute_modes_ordered():
    m = preset("gpt3-175b")
    none, sel, full = (
        flops_per_iteration(m, 8, r) for r in ("none", "selective", "full")
    )
    assert none < sel < full
    with pytest.raises(LoomInputError) as err:
        flops_per_iteration(m, 8, "partial")
    assert err.value.field == "recompute"


def test_moe_counts_and_flops():
    m = preset("moe__27B")
    assert m.total_params() == pytest.approx(27e9, rel=0.03)
    assert m.activated_params() < m.total_params() / 5
    assert m.moe_layers == 8 and m.dense_layers == 8
    dense = ModelSpec(
        "d",
        layers=16,
        hidden=2048,
        heads=16,
        ffn_hidden=16384,
        seq_len=1024,
        vocab=32000,
    )
    # top-2 experts double the MLP work of the MoE layers, so more FLOPs than dense
    assert flops_per_iteration(m, 4) > flops_per_iteration(dense, 4)
    for name, size in [
        ("moe__690M", 0.69e9),
        ("moe__1.3B", 1.3e9),
        ("moe__2.4B", 2.4e9),
        ("moe__10B", 10e9),
    ]:
        assert preset(name).total_params() == pytest.approx(size, rel=0.05)


def test_all_presets_load_and_are_sane():
    names = preset_names()
    for required in [
        "gpt3-175b",
        "llama2-70b",
        "arnold-24b-dense",
        "arnold-24b-moe",
        "bert__760M",
        "moe__690M",
        "wide_resnet__6.8B",
        *MEGATRON_NAMES,
    ]:
        assert required in names
    for name in names:
        m = preset(name)
        assert m.name == name and m.source
        assert flops_per_iteration(m, 2) > 0
    assert preset("arnold-24b-dense").total_params() == pytest.approx(24e9, rel=0.03)
    assert preset("arnold-24b-moe").total_params() == pytest.approx(24e9, rel=0.03)
    cnn = preset("wide_resnet__1B")
    assert cnn.kind == "cnn" and cnn.total_params() == 1_000_000_000
    assert flops_per_iteration(cnn, 2) == pytest.approx(2 * flops_per_iteration(cnn, 1))


def test_unknown_preset_suggests_close_match():
    with pytest.raises(UnknownNameError) as err:
        preset("llama2-7")
    assert "llama2-7b" in str(err.value) and "did you mean" in str(err.value)
    assert preset("LLAMA2-7B") is preset("llama2-7b")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"layers": 0}, "layers"),
        ({"hidden": -4}, "hidden"),
        ({"heads": 3}, "hidden"),  # 1024 not divisible by 3
        ({"seq_len": 1.5}, "seq_len"),
        ({"vocab": True}, "vocab"),
        ({"experts": 4, "top_k": 5}, "top_k"),
        ({"kv_heads": 3}, "kv_heads"),
        ({"mlp": "relu"}, "mlp"),
        ({"kind": "rnn"}, "kind"),
        ({"kind": "cnn"}, "params"),
        ({"params": 10}, "params"),
        ({"ffn_hidden": 0}, "ffn_hidden"),
    ],
)
def test_invalid_specs_name_the_field(kwargs, field):
    base = {
        "name": "x",
        "layers": 4,
        "hidden": 1024,
        "heads": 16,
        "seq_len": 512,
        "vocab": 1000,
    }
    with pytest.raises(LoomInputError) as err:
        ModelSpec(**{**base, **kwargs})
    assert err.value.field == field
    assert field in str(err.value)


def test_preset_file_errors_are_located(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text(
        "ok: {layers: 2, hidden: 64, heads: 4, seq_len: 8, vocab: 10}\n"
        "bad: {layers: 2, hidden: 64, heads: 5, seq_len: 8, vocab: 10}\n"
    )
    with pytest.raises(LoomInputError) as err:
        load_presets(bad)
    assert err.value.line == 2 and err.value.field == "bad.hidden"
    bad.write_text(
        "x: {layers: 2, hidden: 64, heads: 4, seq_len: 8, vocab: 10, colour: red}\n"
    )
    with pytest.raises(LoomInputError) as err:
        load_presets(bad)
    assert err.value.field == "x.colour"


def test_spec_is_frozen():
    m = preset("gpt3-175b")
    with pytest.raises((AttributeError, TypeError)):
        m.layers = 1  # type: ignore[misc]
    assert m.ffn_hidden == 4 * m.hidden and m.kv_heads == m.heads


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(1, 64),
    heads=st.integers(1, 32),
    head_dim=st.sampled_from([32, 64, 128]),
    seq=st.sampled_from([128, 1024, 4096]),
    batch=st.integers(1, 512),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_flops_monotone_in_layers_hidden_batch(
    layers, heads, head_dim, seq, batch, recompute
):
    def f(l, h_heads, b):
        m = ModelSpec(
            "p",
            layers=l,
            hidden=h_heads * head_dim,
            heads=h_heads,
            seq_len=seq,
            vocab=32000,
        )
        return flops_per_iteration(m, b, recompute)

    base = f(layers, heads, batch)
    assert f(layers + 1, heads, batch) > base
    assert f(layers, heads + 1, batch) > base
    assert f(layers, heads, batch + 1) > base
