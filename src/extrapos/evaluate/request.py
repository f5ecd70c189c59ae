"""What defines an evaluation of `extrapos eval` (and its masked-LM form): the request, its keys, its
default result name and its lengths checked against a run's L_t.

A request is recorded in every result; equal requests of the same weights reuse it (``result_key``).
Fields added after results were first saved keep the keys of the requests made before they existed
(``LEGACY_FIELDS``, ``UNSET_FIELDS``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from extrapos.errors import UserError
from extrapos.evaluate.lengths import (
    MIN_WINDOW,
    EvalLength,
    check_windows_divide,
    is_multiple,
    is_token_count,
    resolve_lengths,
)
from extrapos.evaluate.slot import slug
from extrapos.run.handle import Run

DEFAULT_LENGTHS = (1, 2, 4, 8, 16)
PROTOCOLS = ("documents", "stream")
BOUNDARIES = ("cross", "mask")  # the stream protocol: context crosses documents, or stays in its own
SELECTIONS = ("spread", "first")  # the documents protocol's spans: spread over documents, or the first ones

# Fields added after results were first saved, with the values that reproduce the requests of that time
# (spans taken from the first documents). A field at its legacy value is left out of the keys, so a request
# with all of them at these values has the key it had before they existed, and no other request does.
LEGACY_FIELDS: dict[str, Any] = {"protocol": "documents", "boundary": None, "selection": "first"}
# Fields added later that change nothing while unset: left out of the key and of the request a result
# records at these values, so a request that does not use them has the key and the result file it had
# before they existed.
UNSET_FIELDS: dict[str, Any] = {"tokens": None}


@dataclass
class EvalRequest:
    """Everything that defines an evaluation (the result file records it; equal requests reuse it)."""

    lengths: list[int | float] = field(default_factory=lambda: list(DEFAULT_LENGTHS))  # multiples of L_t
    tokens: list[int] | None = None  # windows given in tokens, beside (or instead of) the multiples
    base_length: int | None = None  # L_t; None -> the run's training length
    corpus: str | None = None  # None -> the run's own held-out split
    data_dir: str | None = None
    split: str = "test"
    max_tokens: int = 65_536  # target tokens scored per length (at most)
    position_options: dict[str, Any] = field(default_factory=dict)  # inference-time encoding changes
    stride: int | None = None  # sliding-window mode: score the last `stride` tokens per window
    buckets: int = 32  # per-position loss buckets over the longest window
    precision: str = "fp32"
    step: int | None = None  # checkpoint step (None: latest)
    protocol: str = "documents"  # "documents": spans inside documents; "stream": documents joined
    boundary: str | None = None  # stream only: "cross" (None means cross) or "mask"
    selection: str = "spread"  # documents only: spans "spread" over documents, or the "first" documents'

    def written(self) -> dict[str, Any]:
        """The request as a result records it (fields added later left out at their unset value)."""
        return {k: v for k, v in asdict(self).items() if k not in UNSET_FIELDS or v != UNSET_FIELDS[k]}

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.key_fields(), sort_keys=True).encode()).hexdigest()[:12]

    def key_fields(self) -> dict[str, Any]:
        """The fields a key hashes: all of them, less those added later that hold their legacy value."""
        legacy = {**LEGACY_FIELDS, **UNSET_FIELDS}
        return {k: v for k, v in asdict(self).items() if k not in legacy or v != legacy[k]}

    @classmethod
    def from_saved(cls, request: dict[str, Any]) -> EvalRequest:
        """The request a saved result records; one saved before a field existed gets its legacy value."""
        known = {f.name for f in fields(cls)}
        return cls(**{**LEGACY_FIELDS, **{k: v for k, v in request.items() if k in known}})


def result_key(req: EvalRequest, step: int, weights_sha256: str) -> str:
    """The request, the checkpoint step it resolved to and the digest of the weights it scored."""
    text = json.dumps({"request": req.key_fields(), "step": step, "weights": weights_sha256}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve_request(req: EvalRequest) -> EvalRequest:
    """``req`` with the stream protocol's boundary made explicit (None -> "cross"), so that a result always
    names it and the two spellings of one evaluation share a key."""
    if req.protocol == "stream" and req.boundary is None:
        return replace(req, boundary="cross")
    return req


def check_request(req: EvalRequest) -> None:
    """Every field of an evaluation request checked before a model is loaded."""
    if (not req.lengths and not req.tokens) or not all(is_multiple(k) for k in req.lengths):
        raise UserError(
            "evaluation lengths must be positive multiples of the training length, e.g. 1,2,4,8,16 (or 0.5 "
            "where 0.5 x L_t is a whole number of tokens), or windows in tokens with --tokens."
        )
    if req.tokens is not None and (not req.tokens or not all(is_token_count(n) for n in req.tokens)):
        raise UserError(
            f"--tokens must be whole numbers of at least {MIN_WINDOW} tokens separated by commas (e.g. "
            f"15360), got {req.tokens!r}."
        )
    integral = req.tokens is None and all(isinstance(k, int) for k in req.lengths)
    # fractional and token lengths are checked in tokens once L_t is known (``resolve_lengths``)
    if integral and req.protocol == "documents" and any(max(req.lengths) % k for k in req.lengths):
        raise UserError(
            f"every length must divide the longest ({max(req.lengths)}) so that each span splits into whole "
            f"windows, got {','.join(map(str, req.lengths))}; use e.g. 1,2,4,8,16, or --protocol stream."
        )
    if req.stride is not None and req.stride < 1:
        raise UserError(f"--stride must be a positive number of tokens, got {req.stride}.")
    if req.max_tokens < 1 or req.buckets < 1:
        raise UserError("--max-tokens and the per-position buckets must be positive.")
    if req.precision not in ("fp32", "bf16"):
        raise UserError(f"--precision must be fp32 or bf16, got {req.precision!r}.")
    if req.split not in ("train", "val", "test"):
        raise UserError(f"--split must be train, val or test, got {req.split!r}.")
    if req.base_length is not None and req.base_length < 1:
        raise UserError(f"the base length must be positive, got {req.base_length}.")
    if req.protocol not in PROTOCOLS:
        raise UserError(f"--protocol must be documents or stream, got {req.protocol!r}.")
    if req.protocol == "documents" and req.boundary is not None:
        raise UserError(
            "--boundary applies to the stream protocol only (a documents window never leaves its document); "
            "drop it or add --protocol stream."
        )
    if req.boundary not in (None, *BOUNDARIES):
        raise UserError(f"--boundary must be cross or mask, got {req.boundary!r}.")
    if req.selection not in SELECTIONS:
        raise UserError(f"--selection must be spread or first, got {req.selection!r}.")
    if req.protocol == "stream" and req.selection != "spread":
        raise UserError(
            "the stream protocol always spreads its target blocks over the stream; --selection first "
            "applies to the documents protocol only."
        )
    if req.protocol == "stream" and req.stride is not None:
        raise UserError(
            "--stride is the documents protocol's sliding window; the stream protocol already scores each "
            "block with all the preceding stream its window holds, so drop --stride."
        )


def default_name(req: EvalRequest) -> str:
    parts = [
        req.split
        if req.corpus is None and req.data_dir is None
        else _slug(req.corpus or Path(str(req.data_dir)).name)
    ]
    if req.protocol == "stream":
        parts += ["stream", req.boundary or "cross"]
    elif req.selection != "spread":
        parts.append(req.selection)
    for k, v in sorted(req.position_options.items()):
        parts.append(f"{k}{v}")
    if req.stride:
        parts.append(f"stride{req.stride}")
    if req.precision != "fp32":
        parts.append(req.precision)
    if req.step is not None:
        parts.append(f"step{req.step}")
    if req.base_length is not None:  # another L_t: other windows and another "past L_t"
        parts.append(f"base{req.base_length}")
    return "-".join(_slug(str(p)) for p in parts)


def _slug(text: str) -> str:
    return slug(text, keep=".+_", empty="eval")  # no "-" inside a piece: the pieces are joined with it


def check_lengths(run: Run, req: EvalRequest) -> list[EvalLength]:
    """The request's lengths checked against the run's L_t (``request_lengths``) before anything is read or
    written."""
    return request_lengths(req, req.base_length or run.cfg.model.train_length)


def request_lengths(req: EvalRequest, L: int) -> list[EvalLength]:
    """The request's lengths at training length ``L`` in windows of tokens, checked (whole windows of at
    least MIN_WINDOW tokens; under the documents protocol each dividing the longest)."""
    resolved = resolve_lengths(req.lengths, req.tokens, L)
    if req.protocol == "documents":
        check_windows_divide([x.window for x in resolved])
    elif resolved[0].window < L:  # the stream scores blocks of L_t targets, each inside every window
        raise UserError(
            f"the stream protocol scores blocks of L_t = {L} targets, so its windows must be at least {L} "
            f"tokens, and {resolved[0].ev:g} x L_t is {resolved[0].window}; drop it or use the documents "
            "protocol."
        )
    return resolved
