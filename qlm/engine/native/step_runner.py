"""Continuous batching over the Llama forward pass: which pieces run in the next step.

Question answered: what does one engine step compute, and what comes out of it? Each step
(`NativeRunner.step`) takes, within a token budget and a sequence limit: one token of every
decoding sequence, the next prompt chunk of every running sequence still in prefill, then
waiting sequences whose chunk fits the budget and the free KV blocks. The local policy
(local_policy.py, by name: fcfs, srpt-mlfq, prefix-groups) orders the running sequences and
the admissions.
A long prompt is computed in chunks across steps (chunked prefill), so decodes never wait
behind it. When the KV blocks run out for a running sequence, the one the policy names
(fcfs: the one admitted last) is preempted: its blocks are freed and it waits again, to be
recomputed (prompt and output so far) when there is room. Each sequence that completed its
pending tokens samples one token; sequences that end free their blocks.

Synchronous and clock-free: the engine client (a later step) runs it in a worker thread.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from qlm.engine.native.blocks import BlockPool, KvCache, OutOfBlocksError
from qlm.engine.native.checkpoint import Checkpoint
from qlm.engine.native.llama import LlamaModel, Piece
from qlm.engine.native.local_policy import LocalPolicyConfig, local_policy
from qlm.engine.native.paged_sequence import Finish, Sampling, Seq
from qlm.engine.native.runner_config import RunnerConfig


@dataclass(frozen=True, slots=True)
class Emitted:
    """A token a sequence sampled in a step; `finish` set when it ended the sequence."""

    seq_id: str
    token: int
    finish: Finish | None


@dataclass(frozen=True, slots=True)
class StepResult:
    emitted: tuple[Emitted, ...]
    prefill_tokens: int  # tokens computed for sequences that sampled nothing or their first
    decode_tokens: int
    preempted: tuple[str, ...]
    # Prefix tokens whose K and V the step read once for a group instead of once per member
    # (summed over groups: prefix length x (members - 1)).
    shared_prefix_reads_saved: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens admitted from the prefix cache in the step


class NativeRunner:
    def __init__(self, checkpoint: Checkpoint, config: RunnerConfig | None = None) -> None:
        self.config = config or RunnerConfig()
        self.model = LlamaModel(checkpoint)
        self.pool = BlockPool(self.config.num_blocks, self.config.block_size)
        self.cache = KvCache(checkpoint.shape, self.config.num_blocks, self.config.block_size)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []  # in admission order
        self.contexts: dict[str, Seq] = {}  # filled contexts, holding their KV until freed
        self._seqs: dict[str, Seq] = {}
        self.steps = 0
        self._hit_tokens = 0
        config = self.config
        inputs = LocalPolicyConfig(
            config.max_wait_steps, config.mlfq_quantum_tokens, config.prefix_groups, self.cached
        )
        self.policy = local_policy(config.policy, inputs)

    def check_new(self, seq_id: str, prompt_tokens: int, sampling: Sampling) -> None:
        """ValueError naming the sequence when it cannot be taken."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already exists")
        total = prompt_tokens + sampling.max_tokens
        if total > self.config.num_blocks * self.config.block_size:
            raise ValueError(f"sequence {seq_id}: prompt and max_tokens exceed the KV cache")
        if total > self.model.shape.max_position_embeddings:
            raise ValueError(
                f"sequence {seq_id}: prompt and max_tokens exceed the model's "
                f"{self.model.shape.max_position_embeddings} positions"
            )

    def add(self, seq_id: str, prompt: Sequence[int], sampling: Sampling) -> None:
        self.check_new(seq_id, len(prompt), sampling)
        seq = Seq(seq_id, tuple(prompt), sampling, queued_step=self.steps)
        self._seqs[seq_id] = seq
        self.waiting.append(seq)

    def fork(
        self, parent_id: str, child_id: str, sampling: Sampling, more: Sequence[int] = ()
    ) -> None:
        """A child that continues from the parent's tokens so far and `more` (its prompt),
        holding the parent's KV blocks without a copy (copy-on-write when it writes into a
        shared one)."""
        parent = self._seqs.get(parent_id)
        if parent is None:
            raise ValueError(f"no sequence {parent_id} to fork (unknown or finished)")
        self.check_new(child_id, parent.length + len(more), sampling)
        table = self.pool.fork(parent.table)
        child = Seq(
            child_id,
            (*parent.tokens, *more),
            sampling,
            table,
            computed=parent.computed,
            queued_step=self.steps,
        )
        self._seqs[child_id] = child
        self.waiting.append(child)

    def fill(self, context_id: str, tokens: Sequence[int], parent_id: str | None = None) -> None:
        """A context of `tokens` (after its parent's, whose KV blocks it shares without a
        copy): computed, then kept with its KV until `free`. `fork` (a child sequence that
        generates) and `fill` with it as parent continue from it; `fill` with no tokens is
        Parrot's Fork."""
        if parent_id is None:
            self.add(context_id, tokens, _FILL)
        else:
            self.fork(parent_id, context_id, _FILL, tokens)
        seq = self._seqs[context_id]
        seq.context = True
        if seq.to_compute <= 0:
            self.waiting.remove(seq)
            self.contexts[context_id] = seq

    def abort(self, seq_id: str) -> bool:
        """Drop a sequence, or free a context; False when there is no such one."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return False
        if seq in self.running:
            self.running.remove(seq)
        elif self.contexts.pop(seq_id, None) is None:
            self.waiting.remove(seq)
        self.pool.free(seq.table)
        return True

    def seq(self, seq_id: str) -> Seq:
        return self._seqs[seq_id]

    def detach(self, seq_id: str) -> tuple[int, Seq]:
        """Take running `seq_id` off this runner, its blocks still held (kv_handoff.py: the
        caller frees them or `adopt`s it back); (its place in the running set, it)."""
        seq = self._seqs.get(seq_id)
        if seq is None or seq not in self.running:
            raise ValueError(f"sequence {seq_id} is not running here")
        index = self.running.index(seq)
        self.running.remove(seq)
        del self._seqs[seq_id]
        return index, seq

    def adopt(self, seq: Seq, index: int | None = None) -> None:
        """Take `seq`, its K and V already in this cache up to `seq.computed` (its table's
        blocks held for it), as running at `index` (default last) or, with every sequence slot
        taken, as waiting: admitted like a fork, holding its blocks."""
        self._seqs[seq.seq_id] = seq
        if self.config.prefix_caching:
            self._remember_full(seq)
        if len(self.running) < self.config.max_num_seqs:
            self.running.insert(len(self.running) if index is None else index, seq)
        else:
            self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self) -> StepResult:
        """One forward pass over the next pieces; what it sampled."""
        self._hit_tokens = 0
        plan, preempted = self._schedule()
        if not plan and self.waiting and not self.running:
            self._reclaim_waiting()  # waiting forks held the blocks the head needs
            plan, preempted = self._schedule()
        self.steps += 1
        if not plan:
            return StepResult((), 0, 0, tuple(preempted))
        groups = self._prefix_groups(plan) if self.config.shared_prefix else {}
        pieces = [self._piece(seq, count, groups.get(seq.seq_id)) for seq, count in plan]
        logits = self.model.forward(pieces, self.cache)
        emitted, row, prefill, decode = [], 0, 0, 0
        for (seq, count), piece in zip(plan, pieces, strict=True):
            seq.computed += count
            seq.table.num_tokens = seq.computed
            if self.config.prefix_caching:
                self._remember_full(seq)
            decode += count if seq.output and count == 1 else 0
            prefill += 0 if seq.output and count == 1 else count
            if seq.context and seq.to_compute == 0:
                self.running.remove(seq)  # filled: it keeps its KV, off the running set
                self.contexts[seq.seq_id] = seq
            if not piece.wants_logits:
                continue
            finish = seq.append(seq.sample(logits[row]), self.model.shape.eos_token_ids)
            row += 1
            emitted.append(Emitted(seq.seq_id, seq.output[-1], finish))
            if finish is not None:
                self._retire(seq)
        saved = sum(p.prefix_tokens for p in pieces if p.prefix_group >= 0)
        saved -= sum(tokens for _, tokens in set(groups.values()))
        return StepResult(
            tuple(emitted), prefill, decode, tuple(preempted), saved, self._hit_tokens
        )

    def _piece(self, seq: Seq, count: int, group: tuple[int, int] | None) -> Piece:
        start = seq.computed
        return Piece(
            tokens=seq.tokens[start : start + count],
            start=start,
            slots=self.pool.slots(seq.table, start, count),
            context=self.pool.slots(seq.table, 0, start + count),
            wants_logits=start + count == seq.length,
            prefix_group=-1 if group is None else group[0],
            prefix_tokens=0 if group is None else group[1],
        )

    def _prefix_groups(self, plan: list[tuple[Seq, int]]) -> dict[str, tuple[int, int]]:
        """Sequence id -> (group, prefix tokens) for sequences of the step whose block tables
        start with the same computed full blocks (at least one; two sequences or more)."""
        size = self.config.block_size
        by_first: dict[int, list[Seq]] = {}
        for seq, _ in plan:
            if seq.computed >= size:
                by_first.setdefault(seq.table.blocks[0], []).append(seq)
        groups: dict[str, tuple[int, int]] = {}
        for members in by_first.values():
            if len(members) < 2:
                continue
            blocks = min(seq.computed for seq in members) // size
            lead = members[0].table.blocks
            for seq in members[1:]:
                same = (a == b for a, b in zip(lead[:blocks], seq.table.blocks, strict=False))
                blocks = next((i for i, equal in enumerate(same) if not equal), blocks)
            for seq in members:
                groups[seq.seq_id] = (lead[0], blocks * size)
        return groups

    def _schedule(self) -> tuple[list[tuple[Seq, int]], list[str]]:
        """(sequence, tokens to compute) for the next step, blocks grown for them; the ids of
        sequences preempted to make room."""
        budget = self.config.max_batched_tokens
        plan: list[tuple[Seq, int]] = []
        preempted: list[str] = []
        running = self.policy.running_order(self.running)
        for seq in [s for s in running if s.pending == 1]:  # decodes first
            if seq in self.running and budget > 0 and self._grow_running(seq, 1, preempted):
                plan.append((seq, 1))
                budget -= 1
        prefills = [s for s in running if s.pending > 1 and s in self.running]
        admitting = True
        for seq in self.policy.prefill_order(prefills, self.waiting, self.steps):
            if budget <= 0:
                break
            if seq in self.running:
                count = min(seq.to_compute, budget)
                if not self._grow_running(seq, count, preempted):
                    continue
            else:
                fits = admitting and seq.seq_id not in preempted
                count = self._admit(seq, budget) if fits else 0
                if not count:
                    admitting = False  # later arrivals do not pass one that does not fit
                    continue
            plan.append((seq, count))
            budget -= count
        plan = [(seq, count) for seq, count in plan if seq in self.running]
        return plan, preempted

    def _reclaim_waiting(self) -> None:
        """Free the blocks waiting sequences and filled contexts hold (forks waiting with
        their parent's blocks, partly computed prompts): they are recomputed when admitted,
        and what continues from a context recomputes its tokens."""
        for seq in [*self.waiting, *self.contexts.values()]:
            self._drop_blocks(seq)

    def _drop_a_context(self) -> bool:
        """Free the KV of the earliest filled context that holds any (its tokens stay: what
        continues from it recomputes them); False when none holds KV."""
        for seq in self.contexts.values():
            if seq.table.blocks:
                self._drop_blocks(seq)
                return True
        return False

    def _admit(self, seq: Seq, budget: int) -> int:
        """Admit waiting `seq`, its cached prefix taken from the prefix cache; the tokens it
        computes in this step (0, nothing changed, when a sequence slot or the KV blocks are
        lacking)."""
        if len(self.running) >= self.config.max_num_seqs:
            return 0
        fresh = not seq.table.blocks  # not a fork, nothing computed
        matched = self._match_prefix(seq) if fresh and self.config.prefix_caching else 0
        count = min(seq.to_compute, budget)
        if self.pool.extra_blocks(seq.table, count) > self.pool.free_blocks:
            if matched:
                self._drop_blocks(seq)
            return 0
        self.pool.grow(seq.table, count, self.cache)
        self.waiting.remove(seq)
        self.running.append(seq)
        self._hit_tokens += matched
        return count

    def cached(self, seq: Seq) -> int:
        """Leading tokens of `seq` it would not compute if admitted now: those it holds, or
        for a fresh sequence its leading full blocks the prefix cache holds (taking none)."""
        if seq.table.blocks or not self.config.prefix_caching:
            return seq.computed
        hits = 0
        for key in self._leading_keys(seq):
            if not self.pool.cached(key):
                break
            hits += 1
        return hits * self.config.block_size

    def _leading_keys(self, seq: Seq) -> list[bytes]:
        """The prefix-cache names of `seq`'s full blocks but the one holding its last token
        (at least one token is left to compute, for the logits); kept on the sequence."""
        size, tokens, keys = self.config.block_size, seq.tokens, seq.lookahead_keys
        for i in range(len(keys), (seq.length - 1) // size):
            keys.append(block_key(keys[-1] if keys else b"", tokens[i * size : (i + 1) * size]))
        return keys[: (seq.length - 1) // size]

    def _match_prefix(self, seq: Seq) -> int:
        """Take the longest run of `seq`'s leading full blocks the prefix cache holds; the
        tokens taken."""
        for key in self._leading_keys(seq):
            block = self.pool.lookup(key)
            if block is None:
                break
            seq.table.blocks.append(block)
            seq.hashes.append(key)
        seq.computed = seq.table.num_tokens = len(seq.table.blocks) * self.config.block_size
        return seq.computed

    def _remember_full(self, seq: Seq) -> None:
        """Enter `seq`'s blocks that became full into the prefix cache."""
        size, tokens = self.config.block_size, seq.tokens
        key = seq.hashes[-1] if seq.hashes else b""
        for i in range(len(seq.hashes), seq.computed // size):
            key = block_key(key, tokens[i * size : (i + 1) * size])
            self.pool.remember(seq.table.blocks[i], key)
            seq.hashes.append(key)

    def _drop_blocks(self, seq: Seq) -> None:
        self.pool.free(seq.table)
        seq.computed = 0
        seq.hashes.clear()

    def _grow_running(self, seq: Seq, count: int, preempted: list[str]) -> bool:
        """Room for `count` more tokens of running `seq`, preempting the sequences admitted
        last (`seq` itself when it is the last) until there is; False when `seq` went."""
        while True:
            try:
                self.pool.grow(seq.table, count, self.cache)
                return True
            except OutOfBlocksError:
                if self._drop_a_context():
                    continue
                victim = self.policy.victim(self.running)
                self._preempt(victim)
                preempted.append(victim.seq_id)
                if victim is seq:
                    return False

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        self._drop_blocks(seq)
        self.waiting.appendleft(seq)

    def _retire(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.pool.free(seq.table)
        del self._seqs[seq.seq_id]


_FILL = Sampling(max_tokens=1)  # what check_new reserves for a context: one more token


def block_key(previous: bytes, tokens: Sequence[int]) -> bytes:
    """The prefix cache's name for a full block: a digest of the previous block's name and
    this block's tokens (so of every token up to its end)."""
    data = previous + array("q", tokens).tobytes()
    return hashlib.blake2b(data, digest_size=16).digest()
