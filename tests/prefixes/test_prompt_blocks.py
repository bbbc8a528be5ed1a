"""Prompt prefix blocks (qlm/prefixes/prompt_blocks.py): equal text so far, equal keys; token shares
that never exceed the prompt; cuts where a template ends. That requests admitted through the
API carry them: tests/api/test_prefix_admission.py."""

from __future__ import annotations

from qlm.prefixes.prompt_blocks import MAX_PREFIX_BLOCKS, PREFIX_BLOCK_CHARS, prompt_prefix

SYSTEM = "You are a careful assistant. " * 40  # 1,160 characters: four whole blocks


def test_prompts_that_share_their_start_share_its_blocks_only() -> None:
    a = prompt_prefix(SYSTEM + "What is the capital of France? " * 10, 400)
    b = prompt_prefix(SYSTEM + "Summarise this contract for me. " * 10, 420)
    shared = len(SYSTEM) // PREFIX_BLOCK_CHARS
    assert [x.key for x in a[:shared]] == [x.key for x in b[:shared]]
    assert all(x.key != y.key for x, y in zip(a[shared:], b[shared:], strict=False))
    assert prompt_prefix("x" + SYSTEM, 300)[0].key != a[0].key  # a key names all text before


def test_blocks_hold_their_share_of_tokens_and_never_more_than_the_prompt() -> None:
    text = "abcd" * 1000  # 4,000 characters: 15 whole blocks, 160 characters left over
    blocks = prompt_prefix(text, 1000)
    assert len(blocks) == 15
    assert sum(b.tokens for b in blocks) == 960  # 3,840 of 4,000 characters' share of 1,000
    assert {b.tokens for b in blocks} == {64}
    assert prompt_prefix("short", 2) == ()
    assert prompt_prefix(None, 10) == ()
    assert len(prompt_prefix("y" * PREFIX_BLOCK_CHARS * (MAX_PREFIX_BLOCKS + 3), 10**6)) == (
        MAX_PREFIX_BLOCKS
    )


def test_a_cut_ends_a_block_where_a_template_ends_its_shared_text() -> None:
    head = "You are a careful summariser. Summarise: "  # shorter than a block
    first = prompt_prefix(head + "alpha " * 100, 400, cuts=(len(head),))
    second = prompt_prefix(head + "omega " * 100, 400, cuts=(len(head),))
    assert first[0].key == second[0].key  # the head is shared
    assert first[1].key != second[1].key  # the rest is each prompt's own
    assert sum(b.tokens for b in first) <= 400
    assert prompt_prefix(head + "alpha " * 100, 400)[0].key != first[0].key  # no cut: no head


def test_a_cut_too_short_for_a_token_joins_the_next_block() -> None:
    prompt = "Q: " + "word " * 300
    blocks = prompt_prefix(prompt, len(prompt) // 4, cuts=(3,))  # "Q: " is under a token
    assert len(blocks) == len(prompt) // 256  # every whole block is still there
    assert blocks[0].key == prompt_prefix(prompt, len(prompt) // 4)[0].key
