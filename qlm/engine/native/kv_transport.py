"""Carrying a prefill/decode hand-off (kv_handoff.py) from one process to another.

Question answered: how does a `KvHandoff` made in a prefill process reach a decode process,
and how does the prefill process learn whether it landed? Over a `multiprocessing.connection`
`Connection`: a socket (`Listener` and `Client` over TCP or a Unix socket, with an authkey) or
a `Pipe`. The payload is one message: `torch.save` of a dict of plain values and tensors,
read back with `weights_only=True` (nothing but tensors and plain containers is unpickled
from the peer); the decode side's answer is a second message, a small JSON object (landed, or
refused with the reason). `offer` and `accept` are the two ends: the prefill side's blocks
are held until the answer comes, freed when it landed, the sequence back in its running set
when it was refused.

Not yet: an answer lost with the link (the peer gone after it imported) leaves the sequence
on both sides (the prefill side takes it back, as for a refusal: no retry protocol). One
sequence per message, sent whole through the CPU (no layer-by-layer streaming overlapping
the prefill, as DistServe and vLLM's connectors do). The message also carries the request's
generator state (5,056 bytes for torch's CPU generator), so a small prompt's message is
mostly overhead.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from multiprocessing.connection import Connection

import torch

from qlm.engine.native.blocks import OutOfBlocksError
from qlm.engine.native.kv_handoff import KvHandoff, PrefillSide, import_kv
from qlm.engine.native.paged_sequence import Sampling
from qlm.engine.native.step_runner import NativeRunner

WIRE_FORMAT = 1
_NO_BLOCKS = "out_of_blocks"
_INVALID = "invalid"


def to_message(handoff: KvHandoff) -> bytes:
    """The hand-off as one message."""
    sampling = asdict(handoff.sampling)
    sampling["stop_token_ids"] = list(handoff.sampling.stop_token_ids)
    payload = {
        "format": WIRE_FORMAT,
        "seq_id": handoff.seq_id,
        "prompt_ids": list(handoff.prompt_ids),
        "output_ids": list(handoff.output_ids),
        "k_layer_token_head_dim": handoff.k_layer_token_head_dim.contiguous(),
        "v_layer_token_head_dim": handoff.v_layer_token_head_dim.contiguous(),
        "sampling": sampling,
        "generator_state": handoff.generator_state,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def from_message(message: bytes) -> KvHandoff:
    """The hand-off `to_message` made `message` of; ValueError for another format."""
    payload = torch.load(io.BytesIO(message), weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != WIRE_FORMAT:
        raise ValueError(f"not a hand-off message of format {WIRE_FORMAT}")
    sampling = dict(payload["sampling"])
    sampling["stop_token_ids"] = tuple(sampling["stop_token_ids"])
    return KvHandoff(
        seq_id=str(payload["seq_id"]),
        prompt_ids=tuple(int(t) for t in payload["prompt_ids"]),
        output_ids=tuple(int(t) for t in payload["output_ids"]),
        k_layer_token_head_dim=payload["k_layer_token_head_dim"],
        v_layer_token_head_dim=payload["v_layer_token_head_dim"],
        sampling=Sampling(**sampling),
        generator_state=payload["generator_state"],
    )


def send_handoff(conn: Connection, handoff: KvHandoff) -> int:
    """Send `handoff` over `conn`; the bytes sent."""
    message = to_message(handoff)
    conn.send_bytes(message)
    return len(message)


def receive_handoff(conn: Connection) -> KvHandoff:
    return from_message(conn.recv_bytes())


def offer(prefill: PrefillSide, seq_id: str, conn: Connection) -> int:
    """Export `seq_id` from the prefill side, send it over `conn` and wait for the decode
    side's answer: the bytes sent once it landed (its blocks here freed). Refused: the
    sequence is back in the prefill runner and the decode side's error is raised here
    (OutOfBlocksError when it lacked blocks, ValueError otherwise)."""
    handoff = prefill.export(seq_id)
    try:
        sent = send_handoff(conn, handoff)
        answer = json.loads(conn.recv_bytes())
    except BaseException:
        prefill.refused(seq_id)  # the link failed: the sequence stays here
        raise
    if answer.get("landed"):
        prefill.landed(seq_id)
        return sent
    prefill.refused(seq_id)
    reason = str(answer.get("reason", "refused"))
    if answer.get("error") == _NO_BLOCKS:
        raise OutOfBlocksError(reason)
    raise ValueError(reason)


def accept(decode_runner: NativeRunner, conn: Connection) -> KvHandoff:
    """Receive one hand-off from `conn`, import it into `decode_runner` and answer; the
    hand-off once taken. A refusal is answered, then raised here too (nothing changed)."""
    handoff = receive_handoff(conn)
    try:
        import_kv(decode_runner, handoff)
    except OutOfBlocksError as exc:
        conn.send_bytes(json.dumps({"error": _NO_BLOCKS, "reason": str(exc)}).encode())
        raise
    except ValueError as exc:
        conn.send_bytes(json.dumps({"error": _INVALID, "reason": str(exc)}).encode())
        raise
    conn.send_bytes(json.dumps({"landed": True}).encode())
    return handoff
