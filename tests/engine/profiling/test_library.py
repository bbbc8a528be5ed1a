"""Profile files: the packaged profiles, their consistency and provenance, the loader's errors,
the writer's round trip, and the derivation that produced them."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from qlm.config import ConfigError
from qlm.config.profile_files import (
    PROFILE_FIELDS,
    load_profile,
    load_profile_file,
    packaged_profile_paths,
    packaged_profiles,
    profile_named,
    save_profile,
)
from qlm.perf.profile import Profile
from qlm.perf.step import StepTime
from qlm.types import DEFAULT_GPU_TYPES
from tests.factories import make_profile

DATA = Path(__file__).resolve().parents[3] / "sims" / "data"  # public data (NOTICE there)
SPLITWISE = DATA / "splitwise_perf_model.csv"
AZURE = DATA / "azure_llm_2023_conv.csv"

EXPECTED = {
    ("mistral-7b", "A10"): 1,
    ("mistral-7b", "A100"): 1,
    ("mistral-7b", "H100"): 1,
    ("vicuna-13b", "A100"): 1,
    ("vicuna-13b", "H100"): 1,
    ("llama-70b", "A100"): 4,
    ("llama-70b", "H100"): 4,
}


def test_packaged_profiles_cover_the_models_that_fit() -> None:
    profiles = packaged_profiles()
    assert {p.key: p.gpu_count for p in profiles} == EXPECTED
    for p in profiles:
        assert p.fits(DEFAULT_GPU_TYPES[p.gpu_type].memory_bytes), p.key
        assert p.step_time is not None
    # 13B weights (26 GB) exceed one A10 (24 GB): not packaged, and it would not fit.
    vicuna = profile_named("vicuna-13b", "A100")
    assert not vicuna.fits(DEFAULT_GPU_TYPES["A10"].memory_bytes)


@pytest.mark.parametrize("path", packaged_profile_paths(), ids=lambda p: p.name)
def test_packaged_table_and_prefill_rate_follow_the_step_model(path: Path) -> None:
    spec = load_profile_file(path)
    assert spec.step_time is not None
    assert spec.typical_context_tokens is not None
    assert spec.decode_table is not None
    step = spec.step_time.to_step_time()
    expected = step.decode_table(spec.decode_table.batch_sizes, spec.typical_context_tokens)
    assert spec.decode_table.step_s == pytest.approx(expected, rel=1e-5)
    assert spec.prefill_tokens_per_s == pytest.approx(step.prefill_tokens_per_s, rel=1e-5)


@pytest.mark.parametrize("path", packaged_profile_paths(), ids=lambda p: p.name)
def test_packaged_numbers_all_have_a_stated_provenance(path: Path) -> None:
    spec = load_profile_file(path)
    assert set(spec.provenance.fields) == PROFILE_FIELDS
    for name, source in spec.provenance.fields.items():
        cited = [ref for ref in spec.provenance.references if ref in source.source]
        if source.kind in ("measured", "published"):
            assert cited, f"{path.name}: {name} names no reference"


def test_profile_named_lists_what_is_known() -> None:
    assert profile_named("llama-70b", "H100").gpu_count == 4
    with pytest.raises(KeyError, match="known: llama-70b@A100"):
        profile_named("llama-70b", "A10")


@pytest.mark.parametrize(
    "profile",
    [
        make_profile(),
        replace(make_profile(), step_time=StepTime(0.01, 1e-4, 1e-3, 1e-6), provenance="mine"),
        *packaged_profiles(),
    ],
    ids=lambda p: f"{p.model}@{p.gpu_type}",
)
def test_save_then_load_gives_the_same_profile(profile: Profile, tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    save_profile(profile, path)
    assert load_profile(path) == profile


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """\
    model: m
    gpu_type: A100
    weight_bytes: 1000
    kv_bytes_per_token: 10
    step_time:
      base_s: {base}
      per_prefill_token_s: 1.0e-4
      per_decode_seq_s: 1.0e-3
      per_context_token_s: 0
    typical_context_tokens: 1000
    output_tokens_mean: 200
    output_tokens_std: 100
    load_s: 10
"""


def test_a_file_without_a_table_derives_it_from_the_step_model(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, GOOD.format(base=0.01)))
    assert profile.decode_batch_sizes == (1, 8, 16, 32, 64, 128, 256)
    assert profile.decode_step_s_at(64) == pytest.approx(0.01 + 64 * 1e-3)
    assert profile.prefill_tokens_per_s == pytest.approx(1e4)


def test_a_bad_number_is_reported_with_file_line_and_field(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.format(base=-0.01))
    with pytest.raises(ConfigError) as err:
        load_profile(path)
    assert f"{path}:6: step_time.base_s: Input should be greater than 0" in str(err.value)


def test_a_decreasing_table_is_reported_at_its_field(tmp_path: Path) -> None:
    body = (
        GOOD.format(base=0.01) + "    decode_table: {batch_sizes: [1, 8], step_s: [0.02, 0.01]}\n"
    )
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError, match=rf"{path}:14: decode_table.step_s: .*not decrease"):
        load_profile(path)


def test_unknown_keys_and_provenance_fields_are_refused(tmp_path: Path) -> None:
    body = GOOD.format(base=0.01) + (
        "    provenance:\n      fields:\n        speed: {kind: measured, source: me}\n"
    )
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError, match=rf"{path}:16: provenance.fields: .*unknown profile"):
        load_profile(path)
    path = _write(tmp_path, GOOD.format(base=0.01) + "    colour: blue\n")
    with pytest.raises(ConfigError, match=rf"{path}:14: colour: Extra inputs"):
        load_profile(path)


def test_a_file_needs_a_table_or_a_step_model(tmp_path: Path) -> None:
    body = GOOD.format(base=0.01).replace("    typical_context_tokens: 1000\n", "")
    with pytest.raises(ConfigError, match="give decode_table, or step_time with typical"):
        load_profile(_write(tmp_path, body))


def test_the_derivation_reproduces_the_packaged_files(tmp_path: Path) -> None:
    from qlm.engine.profiling.derive import main

    assert main([str(SPLITWISE), str(AZURE), str(tmp_path)]) == 0
    packaged = {p.name: p.read_text() for p in packaged_profile_paths()}
    derived = {p.name: p.read_text() for p in sorted(tmp_path.glob("*.yaml"))}
    assert derived == packaged
