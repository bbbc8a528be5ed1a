"""The engine performance model: step-time interpolation, KV capacity, batch size, validation.

Unless a case says otherwise the profile is the factory default: decode table
(1, 16, 64) -> (0.020, 0.025, 0.040) s, 14 GiB of weights, 128 KiB of KV per token,
gpu_memory_utilization 0.9, min_kv_tokens 4096, max_batch_size 64, 10k prefill tokens/s.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.perf.profile import GIB, Profile
from tests.factories import make_profile


@pytest.mark.parametrize(
    ("batch_size", "expected_s"),
    [
        (1, 0.020),  # table row
        (16, 0.025),  # table row
        (64, 0.040),  # table row (last)
        (8, 0.020 + 0.005 * 7 / 15),  # between 1 and 16: 7/15 of the way -> 0.022333
        (40, 0.0325),  # between 16 and 64: halfway (24/48) from 0.025 to 0.040
        (16.5, 0.025 + 0.015 * 0.5 / 48),  # fractional batch sizes interpolate too
        (0.5, 0.020),  # below the first row: clamped to the first step time
        (0, 0.020),  # clamped
        (128, 0.060),  # beyond the last row: extrapolated along 16->64, 0.025 + 0.015 * 112/48
    ],
)
def test_decode_step_interpolation(batch_size: float, expected_s: float) -> None:
    assert make_profile().decode_step_s_at(batch_size) == pytest.approx(expected_s)


@pytest.mark.parametrize("batch_size", [0.5, 1, 7, 1000])
def test_single_row_table_is_constant(batch_size: float) -> None:
    # One measurement: nothing to interpolate or extrapolate along.
    profile = make_profile(step_s=(0.03,), batch_sizes=(8,))
    assert profile.decode_step_s_at(batch_size) == 0.03


@pytest.mark.parametrize(
    ("batch_size", "expected_per_s"),
    [
        (1, 50.0),  # 1 / 0.020
        (16, 640.0),  # 16 / 0.025
        (40, 40 / 0.0325),  # interpolated step -> 1230.8 tokens/s
        (64, 1600.0),  # 64 / 0.040
    ],
)
def test_token_throughput(batch_size: float, expected_per_s: float) -> None:
    assert make_profile().token_throughput_per_s(batch_size) == pytest.approx(expected_per_s)


def test_prefill_time_and_key() -> None:
    profile = make_profile("m13b", "H100")
    assert profile.prefill_s(500) == pytest.approx(0.05)  # 500 tokens / 10k tokens/s
    assert profile.key == ("m13b", "H100")


@pytest.mark.parametrize(
    ("profile_kwargs", "memory_gib", "expected_tokens"),
    [
        ({}, 80, 475_136),  # (0.9 x 80 - 14) GiB = 58 GiB / 128 KiB = 58 x 8192
        ({}, 24, 62_259),  # (21.6 - 14) GiB = 7.6 GiB / 128 KiB = 62259.2, floored
        ({"gpu_count": 2}, 80, 1_064_960),  # (0.9 x 160 - 14) GiB = 130 x 8192
        ({"kv_kib_per_token": 800.0, "weight_gib": 26.0}, 80, 60_293),  # 46 GiB / 800 KiB
        ({}, 15, 0),  # 13.5 GiB usable < 14 GiB of weights: none, not negative
    ],
)
def test_kv_capacity_tokens(
    profile_kwargs: dict[str, float], memory_gib: int, expected_tokens: int
) -> None:
    assert make_profile(**profile_kwargs).kv_capacity_tokens(memory_gib * GIB) == expected_tokens  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("min_kv_tokens", "memory_gib", "fits"),
    [
        (4096, 80, True),  # 475136 KV tokens, plenty
        (4096, 16, False),  # (14.4 - 14) GiB = 3276 tokens < 4096
        (475_136, 80, True),  # exactly the capacity: fits
        (475_137, 80, False),  # one token more than the capacity
        (1, 15, False),  # weights alone do not fit
    ],
)
def test_fits(min_kv_tokens: int, memory_gib: int, fits: bool) -> None:
    profile = make_profile(min_kv_tokens=min_kv_tokens)
    assert profile.fits(memory_gib * GIB) is fits


@pytest.mark.parametrize(
    ("max_batch_size", "memory_gib", "context_tokens", "expected"),
    [
        (64, 80, 1000, 64),  # KV allows 475; max_batch_size 64 binds
        (1024, 80, 1000, 475),  # KV binds: 475136 // 1000
        (1024, 80, 999.5, 475),  # context rounds up to 1000 tokens per sequence
        (1024, 80, 100_000, 4),  # long contexts: 475136 // 100000
        (1024, 24, 1000, 62),  # smaller GPU: 62259 // 1000
        (1024, 80, 0, 1024),  # zero context counts as 1 token; max_batch_size binds
        (1024, 80, 10_000_000, 1),  # not even one sequence fits: floored at 1
        (1024, 15, 1000, 1),  # no KV at all: still 1 (can_serve rules such cases out)
    ],
)
def test_batch_size_for(
    max_batch_size: int, memory_gib: int, context_tokens: float, expected: int
) -> None:
    profile = make_profile(max_batch_size=max_batch_size)
    assert profile.batch_size_for(memory_gib * GIB, context_tokens) == expected


BASE = make_profile()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"gpu_count": 0}, "gpu_count must be >= 1"),
        ({"weight_bytes": 0}, "weight_bytes must be > 0"),
        ({"kv_bytes_per_token": 0}, "kv_bytes_per_token must be > 0"),
        ({"decode_batch_sizes": (), "decode_step_s": ()}, "at least one row"),
        ({"decode_step_s": (0.02, 0.03)}, "differ in length"),  # 3 sizes, 2 times
        (
            {"decode_batch_sizes": (16, 1, 64)},
            "strictly increasing",  # out of order
        ),
        (
            {"decode_batch_sizes": (1, 16, 16)},
            "strictly increasing",  # a repeated size is not an increase
        ),
        ({"decode_batch_sizes": (0, 16, 64)}, "decode batch sizes must be >= 1"),
        ({"decode_step_s": (0.0, 0.025, 0.04)}, "decode step times must be > 0"),
        ({"prefill_tokens_per_s": 0.0}, "prefill_tokens_per_s must be > 0"),
        ({"output_tokens_mean": 0.0}, "output_tokens_mean must be > 0"),
        ({"output_tokens_std": -1.0}, "output_tokens_std must be >= 0"),
        ({"load_s": -0.1}, "load_s must be >= 0"),
        ({"max_batch_size": 0}, "max_batch_size must be >= 1"),
        ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization in \(0, 1\]"),
        ({"gpu_memory_utilization": 1.01}, r"gpu_memory_utilization in \(0, 1\]"),
    ],
)
def test_validation(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(BASE, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"gpu_memory_utilization": 1.0},  # all of the memory is allowed
        {"output_tokens_std": 0.0},  # deterministic outputs
        {"load_s": 0.0},  # an instant load (e.g. already cached)
    ],
)
def test_validation_boundaries_accepted(changes: dict[str, object]) -> None:
    assert isinstance(replace(BASE, **changes), Profile)  # type: ignore[arg-type]


def test_step_time_stays_positive_up_to_max_batch_size() -> None:
    # A table whose step time falls (16 -> 64) is rejected: extrapolating it would give a
    # negative step time at 256 (0.04 - 0.01 x 240/48 = -0.01 s).
    try:
        profile = make_profile(step_s=(0.02, 0.04, 0.03), max_batch_size=256)
    except ValueError:
        return  # rejecting a non-monotone table at construction would also be a fix
    assert profile.decode_step_s_at(profile.max_batch_size) > 0
