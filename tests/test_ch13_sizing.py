"""Chapter 13's sizing of compressed caches (FP8, MLA) against figures worked out by hand from
the models' config.json numbers, and proof that it calls chapter 1's answers."""

from __future__ import annotations

import pytest

from course.experiments import compressed_sizing as sizing
from course.experiments import kv_sizing
from course.experiments.models import MODELS

DEEPSEEK, KIMI = MODELS["DeepSeek-V3"], MODELS["Kimi-K2"]
QWEN, LLAMA = MODELS["Qwen3-235B-A22B"], MODELS["Llama-3.1-405B"]
LARGE = [DEEPSEEK, KIMI, QWEN, LLAMA]
GIB = 2**30


def name(model):
    return model.name


@pytest.mark.parametrize(("model", "shape"), [
    (DEEPSEEK, ("MLA", 61, 128, 512, 64)), (KIMI, ("MLA", 61, 64, 512, 64)),
    (QWEN, ("GQA", 94, 64, 4, 128)), (LLAMA, ("GQA", 126, 128, 8, 128)),
], ids=["DeepSeek-V3", "Kimi-K2", "Qwen3-235B-A22B", "Llama-3.1-405B"])
def test_the_large_models_carry_their_config_json_shapes_and_sources(model, shape):
    attention, layers, heads, a, b = shape
    assert (model.attention, model.num_layers, model.num_attention_heads) == (attention, layers,
                                                                              heads)
    if attention == "MLA":
        assert (model.kv_lora_rank, model.qk_rope_head_dim) == (a, b)
    else:
        assert (model.num_kv_heads, model.head_dim) == (a, b)
    assert model.source.startswith("https://huggingface.co/") and "config.json" in model.source


def test_deepseek_v3s_record_is_656_bytes_and_its_bf16_latent_1152():
    assert sizing.bytes_per_token_per_layer(DEEPSEEK, "fp8-record") == 656
    assert sizing.bytes_per_token_per_layer(DEEPSEEK, "bf16") == (512 + 64) * 2 == 1152
    # the record: 512 e4m3 bytes, a float32 scale per tile of 128, a bf16 rotary key of 64
    assert 512 + 4 * (512 // 128) + 2 * 64 == 656


def test_llama_405b_in_bf16_is_4096_bytes_per_layer_per_token():
    assert sizing.bytes_per_token_per_layer(LLAMA, "bf16") == 2 * 8 * 128 * 2 == 4096
    assert sizing.bytes_per_token_per_layer(QWEN, "bf16") == 2 * 4 * 128 * 2


@pytest.mark.parametrize("model", LARGE, ids=name)
def test_fp8_halves_every_per_value_format_exactly(model):
    assert sizing.bytes_per_token_per_layer(model, "fp8") * 2 == \
        sizing.bytes_per_token_per_layer(model, "bf16")


@pytest.mark.parametrize("model", LARGE, ids=name)
@pytest.mark.parametrize("tokens", sizing.CONTEXTS)
@pytest.mark.parametrize("gib", sizing.BUDGETS_GIB)
def test_fp8_fits_twice_the_requests_of_bf16_within_one(model, tokens, gib):
    bf16 = sizing.requests_that_fit(model, "bf16", tokens, gib * GIB)
    fp8 = sizing.requests_that_fit(model, "fp8", tokens, gib * GIB)
    assert abs(fp8 - 2 * bf16) <= 1


def test_requests_that_fit_are_whole_requests_worked_by_hand():
    # Llama-3.1-405B, bf16, 128k tokens: 4096 x 126 x 131072 bytes = 63 GiB: one in 80 GiB
    assert sizing.requests_that_fit(LLAMA, "bf16", 131072, 80 * GIB) == \
        80 * GIB // (4096 * 126 * 131072) == 1
    # DeepSeek-V3's record, 8k tokens: 656 x 61 x 8192 bytes each
    assert sizing.requests_that_fit(DEEPSEEK, "fp8-record", 8192, 80 * GIB) == \
        80 * GIB // (656 * 61 * 8192) == 262
    assert sizing.requests_that_fit(LLAMA, "bf16", 131072, 1) == 0
    assert isinstance(sizing.requests_that_fit(LLAMA, "fp8", 8192, 80 * GIB), int)


def test_the_record_and_unknown_formats_are_refused_by_name():
    with pytest.raises(ValueError, match="MLA model only"):
        sizing.bytes_per_token_per_layer(LLAMA, "fp8-record")
    with pytest.raises(ValueError, match="unknown KV format 'int4'"):
        sizing.bytes_per_token_per_layer(DEEPSEEK, "int4")
    with pytest.raises(ValueError):
        sizing.requests_that_fit(DEEPSEEK, "bf16", 0, GIB)


def test_sizing_calls_chapter_ones_gqa_answer(monkeypatch):
    before = (sizing.bytes_per_token_per_layer(LLAMA, "bf16"),
              sizing.requests_that_fit(LLAMA, "bf16", 8192, 80 * GIB))
    monkeypatch.setattr(kv_sizing, "kv_bytes_per_token",
                        lambda layers, heads, dim, element: 4 * layers * heads * dim * element)
    after = (sizing.bytes_per_token_per_layer(LLAMA, "bf16"),
             sizing.requests_that_fit(LLAMA, "bf16", 8192, 80 * GIB))
    assert after[0] == 2 * before[0] and after[1] < before[1]
    assert sizing.decode_intensity(LLAMA, 2) == pytest.approx(8)  # half of 16


def test_sizing_calls_chapter_ones_mla_and_sequence_answers(monkeypatch):
    monkeypatch.setattr(kv_sizing, "mla_kv_bytes_per_token", lambda *args: 1000)
    assert sizing.bytes_per_token_per_layer(DEEPSEEK, "bf16") == 1000
    monkeypatch.setattr(kv_sizing, "kv_bytes_per_sequence", lambda *args: 40 * GIB)
    assert sizing.requests_that_fit(DEEPSEEK, "fp8", 8192, 80 * GIB) == 2
    assert sizing.requests_that_fit(LLAMA, "bf16", 8192, 80 * GIB) == 2


def test_the_table_has_a_row_per_model_and_format_and_the_record_for_mla_only():
    rows = sizing.sizing_table()
    assert [(r.model, r.kv_format) for r in rows] == [
        ("DeepSeek-V3", "bf16"), ("DeepSeek-V3", "fp8"), ("DeepSeek-V3", "fp8-record"),
        ("Kimi-K2", "bf16"), ("Kimi-K2", "fp8"), ("Kimi-K2", "fp8-record"),
        ("Qwen3-235B-A22B", "bf16"), ("Qwen3-235B-A22B", "fp8"),
        ("Llama-3.1-405B", "bf16"), ("Llama-3.1-405B", "fp8")]
    for row in rows:
        assert set(row.requests) == {(g, t) for g in (80, 141) for t in (8192, 32768, 131072)}
        model = MODELS[row.model]
        for (gib, tokens), count in row.requests.items():
            assert count == gib * GIB // (row.bytes_per_token_per_layer * model.num_layers
                                          * tokens)
        # more memory never fits fewer, a longer context never more
        assert row.requests[(141, 8192)] >= row.requests[(80, 8192)] >= row.requests[(80, 131072)]


def test_decode_intensity_against_a_hand_computation():
    # absorbed MLA: 128 heads x (2 x 576 + 2 x 512) FLOPs over a 576-value latent
    assert sizing.decode_intensity(DEEPSEEK, 2) == pytest.approx(
        128 * (2 * 576 + 2 * 512) / (576 * 2))
    assert sizing.decode_intensity(DEEPSEEK, 2) == pytest.approx(241.78, abs=0.01)
    assert sizing.decode_intensity(KIMI, 1) == pytest.approx(64 * (2 * 576 + 2 * 512) / 576)
    assert sizing.format_intensity(DEEPSEEK, "fp8-record") == pytest.approx(278528 / 656)
    # GQA: 2 x 2 x heads x head_dim FLOPs over 2 x kv_heads x head_dim values
    assert sizing.decode_intensity(LLAMA, 2) == pytest.approx(
        2 * 2 * 128 * 128 / (2 * 8 * 128 * 2)) == 16
    assert sizing.decode_intensity(QWEN, 1) == pytest.approx(2 * 2 * 64 * 128 / (2 * 4 * 128))


def test_ridge_points_put_mla_near_the_h100s_and_gqa_far_below():
    h100, h200 = sizing.GPU_ROOFLINES["H100 SXM"], sizing.GPU_ROOFLINES["H200"]
    assert h100.ridge == pytest.approx(989e12 / 3.35e12) == sizing.ridge_point(989e12, 3.35e12)
    assert h200.ridge == pytest.approx(989e12 / 4.8e12)
    assert 0.8 < sizing.decode_intensity(DEEPSEEK, 2) / h100.ridge < 1
    assert sizing.decode_intensity(LLAMA, 2) < h100.ridge / 10


def test_the_sizing_chart_draws_a_bar_per_row_and_budget_on_a_log_axis():
    rows = sizing.sizing_table()
    figure = sizing.sizing_chart(rows)
    assert len(figure.data) == len(rows) * len(sizing.BUDGETS_GIB) == 20
    assert sum(trace.showlegend is not False for trace in figure.data) == len(rows)
    first = figure.data[0]
    assert first.name == "DeepSeek-V3, bf16" and list(first.y) == [149, 37, 9]
    assert figure.layout.yaxis.type == "log"
    assert figure.layout.title.text and figure.layout.xaxis.title.text


def test_the_intensity_chart_draws_a_series_per_format_and_a_ridge_per_gpu():
    figure = sizing.intensity_chart()
    assert [trace.name for trace in figure.data] == ["bf16", "fp8", "fp8-record"]
    record = figure.data[2]
    assert list(record.y)[2:] == [None, None]  # no record for the GQA models
    assert list(figure.data[0].y)[0] == pytest.approx(241.78, abs=0.01)
    ridges = sorted(shape.y0 for shape in figure.layout.shapes)
    assert ridges == pytest.approx(sorted(r.ridge for r in sizing.GPU_ROOFLINES.values()))


def test_main_prints_the_table_and_the_intensities(capsys):
    sizing.main()
    printed = capsys.readouterr().out
    assert "DeepSeek-V3" in printed and "fp8-record" in printed and "241.8" in printed
