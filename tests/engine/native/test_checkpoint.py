"""What the native engine refuses in a checkpoint's config.json: named by file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qlm.engine.native.checkpoint import CheckpointError, load_checkpoint, read_shape

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 300,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "eos_token_id": [1, 2],
}


def write(tmp_path: Path, **changes: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    return tmp_path


def test_a_llama_config_reads_with_its_defaults(tmp_path: Path) -> None:
    shape = read_shape(write(tmp_path))
    assert (shape.head_dim, shape.num_kv_heads, shape.eos_token_ids) == (32, 2, (1, 2))
    assert shape.rope_theta == 10000.0
    assert not shape.tie_word_embeddings


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}),
        ("attention_bias", True),
        ("mlp_bias", True),
        ("hidden_act", "gelu"),
        ("architectures", ["MistralForCausalLM"]),
    ],
)
def test_what_the_forward_pass_lacks_is_refused_by_name(
    tmp_path: Path, field: str, value: object
) -> None:
    path = write(tmp_path, **{field: value})
    with pytest.raises(CheckpointError, match=field) as info:
        read_shape(path)
    assert str(path / "config.json") in str(info.value)


def test_a_checkpoint_without_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_checkpoint(write(tmp_path))


def test_an_unreadable_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json"):
        read_shape(tmp_path)
