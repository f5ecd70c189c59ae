"""`extrapos check-encoding NAME`: what the project proves of its own encodings, proved of any one.

A researcher's encoding (a new file of ``positions/`` or a plug-in from their own package, plugins.py)
gets the checks the built-ins get in the tests, each a line with its bound and what was measured:

- **options**: the options build, within their declared bounds, and every numeric option declares one
  (``CheckedOptions.BOUNDS``: a value outside it is refused before anything trains).
- **causal**: no information from the future: changing token t changes no logit before t (float64,
  beyond rounding), and does change the logits from t on (the model reads its input).
- **cache**: decoding one token at a time after a cached prefill gives the logits of the full forward
  (float64, relative error). A bias that reads the number of keys, or a state that drifts, fails here.
- **fast path**: one training step (loss, logits, gradients) and a cached decode on this machine's
  fastest path (CPU: fp32; CUDA: bf16 and FlexAttention) against the same model in float64 (``doctor``).
- **state**: the weights saved with safetensors and loaded into a fresh model give the same logits,
  bit for bit (a buffer the encoding needs but does not save, or one it saves but does not reload,
  fails here).
- **export** (when ``extra`` brings it; the CLI does where transformers is installed): the model as a
  Hugging Face folder, loaded back by transformers, gives the same logits.

Every check uses a small model (2 layers, d 32, 4 heads) in float64 whose encoding parameters are moved
away from their initialisation (a check must not pass because a learned bias starts at zero), and runs
past the training length (32 tokens at L_t = 16), where extrapolation happens.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from extrapos.model import Decoder, model_config

#: the small model every check builds: long enough past its training length to extrapolate
T, TRAIN_LENGTH, VOCAB, PREFILL = 32, 16, 64, 20
#: float64 bounds: what equal math in another order leaves
CACHE_TOLERANCE = 1e-9
#: the logits before t may move only by rounding: a fold's shift by the last key (a constant of each row,
#: which the softmax ignores) reads every key, so CABLE's move by ~4e-16; a leak moves them by far more
CAUSAL_TOLERANCE = 1e-12


@dataclass
class Line:
    """One property: its name, the rule it must hold to, what was measured, the verdict."""

    check: str
    rule: str
    measured: str
    ok: bool | None  # None: skipped (``measured`` says why)


@dataclass
class Conformance:
    encoding: str
    options: dict[str, Any]
    lines: list[Line] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(line.ok is not False for line in self.lines)

    def failed(self) -> list[str]:
        return [line.check for line in self.lines if line.ok is False]

    def to_dict(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "options": self.options, "ok": self.ok} | {
            "lines": [dataclasses.asdict(line) for line in self.lines]
        }


#: an extra line by its label (the export): called with a copy of the float64 model and its inputs
ExtraCheck = Callable[[Decoder, torch.Tensor, torch.Tensor], Line]


def small_model(name: str, options: dict[str, Any] | None = None, seed: int = 0) -> Decoder:
    """The float64 decoder of every check, its encoding's parameters moved away from their init."""
    torch.manual_seed(seed)
    cfg = model_config(
        n_layers=2,
        d_model=32,
        n_heads=4,
        vocab_size=VOCAB,
        train_length=TRAIN_LENGTH,
        positions={"name": name, **(options or {})},
    )
    model = Decoder(cfg).double().eval()
    with torch.no_grad():
        for p in model.pos.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _inputs(model: Decoder) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Tokens and positions of T tokens, past the training length; of L_t tokens for an encoding that
    refuses longer inputs (a learned table without interpolation), with the reason as a note."""
    from extrapos.errors import UserError

    tokens = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(T).expand(2, T)
    try:
        with torch.no_grad():
            model(tokens, positions)
    except UserError as e:
        note = f" (within L_t = {TRAIN_LENGTH} only: {str(e).split(';')[0]})"
        return tokens[:, :TRAIN_LENGTH], positions[:, :TRAIN_LENGTH], note
    return tokens, positions, ""


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def options_line(name: str, options: dict[str, Any] | None) -> Line:
    from extrapos.positions.registry import build_options

    rule = "the options build within their bounds; every numeric option declares a bound"
    built = build_options(name, options)  # a BoundError / UserError here is the user's sentence
    numeric = [
        f.name
        for f in dataclasses.fields(built)
        if isinstance(getattr(built, f.name), (int, float)) and not isinstance(getattr(built, f.name), bool)
    ]
    unbounded = [key for key in numeric if key not in type(built).BOUNDS]
    if unbounded:
        return Line("options", rule, f"no bound for {', '.join(unbounded)} (Options.BOUNDS)", False)
    return Line("options", rule, f"{len(numeric)} numeric option(s), each bounded", True)


def causal_line(model: Decoder, tokens: torch.Tensor, positions: torch.Tensor) -> Line:
    rule = f"changing token t moves no logit before t (float64, <= {CAUSAL_TOLERANCE:g}) and moves those at t"
    worst, moved, n = 0.0, True, tokens.shape[1]
    with torch.no_grad():
        ref = model(tokens, positions)
        for t in sorted({1, n // 2, min(TRAIN_LENGTH + 3, n - 1), n - 1}):
            changed = tokens.clone()
            changed[:, t] = (changed[:, t] + 1) % VOCAB
            out = model(changed, positions)
            worst = max(worst, float((out[:, :t] - ref[:, :t]).abs().max()))
            moved = moved and not torch.equal(out[:, t:], ref[:, t:])
    ok = worst <= CAUSAL_TOLERANCE and moved
    measured = f"max change before t {worst:.1e}" + ("" if moved else "; the logits from t on did not move")
    return Line("causal", rule, measured, ok)


def cache_line(model: Decoder, tokens: torch.Tensor, positions: torch.Tensor) -> Line:
    rule = f"a cached prefill then one token at a time equals the full forward (rel <= {CACHE_TOLERANCE:g})"
    prefill, n = min(PREFILL, tokens.shape[1] // 2), tokens.shape[1]
    with torch.no_grad():
        full = model(tokens, positions)
        cache = model.new_cache()
        steps = [model(tokens[:, :prefill], positions[:, :prefill], cache)]
        for i in range(prefill, n):
            steps.append(model(tokens[:, i : i + 1], positions[:, i : i + 1], cache))
    decoded = torch.cat(steps, dim=1)
    err = _relative(decoded, full)
    return Line("cache", rule, f"relative error {err:.1e}", err <= CACHE_TOLERANCE)


def fast_path_line(name: str, options: dict[str, Any] | None, device: torch.device) -> Line:
    from extrapos.tools.doctor import check_encoding, fastest_precision

    precision = fastest_precision(device)
    check = check_encoding(name, device, precision, options)
    rule = (
        f"a training step and a cached decode in {precision} on {device} against float64 "
        f"(rel <= {check.tolerance:g})"
    )
    if check.error:
        return Line("fast path", rule, check.error, False)
    measured = (
        f"loss {check.loss:.1e}, logits {check.logits:.1e}, gradients {check.grads:.1e}, "
        f"decode {check.decode:.1e}"
    )
    return Line("fast path", rule, measured, check.ok)


def state_line(
    name: str, options: dict[str, Any] | None, model: Decoder, tokens: torch.Tensor, positions: torch.Tensor
) -> Line:
    from safetensors.torch import load_model, save_model

    rule = "weights saved with safetensors and loaded into a fresh model give the same logits, bit for bit"
    fresh = small_model(name, options, seed=1)  # other weights, until the file's are loaded
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        save_model(model, str(path))
        missing, unexpected = load_model(fresh, str(path), strict=False)
    if missing or unexpected:
        return Line("state", rule, f"missing {sorted(missing)}, unexpected {sorted(unexpected)}", False)
    with torch.no_grad():
        diff = float((fresh(tokens, positions) - model(tokens, positions)).abs().max())
    return Line("state", rule, f"max difference {diff:.1e}", diff == 0.0)


def _on_copy(fn: ExtraCheck, model: Decoder, tokens: torch.Tensor, positions: torch.Tensor) -> Line:
    return fn(copy.deepcopy(model), tokens, positions)


def check_encoding_conformance(
    name: str,
    options: dict[str, Any] | None = None,
    device: str = "cpu",
    extra: Mapping[str, ExtraCheck] | None = None,
) -> Conformance:
    """Every line above for encoding ``name`` with ``options``; a line that raises is a failed line
    with its error (the others still run)."""
    from extrapos.run.runtime import resolve_device

    dev = resolve_device(device, "--device")  # a bad device is the user's sentence, before any check
    report = Conformance(name, dict(options or {}))
    report.lines.append(options_line(name, options))  # a bad option is the user's error: raised
    model = small_model(name, options)
    tokens, positions, note = _inputs(model)
    checks: list[tuple[str, Callable[[], Line]]] = [
        ("causal", lambda: causal_line(model, tokens, positions)),
        ("cache", lambda: cache_line(model, tokens, positions)),
        ("fast path", lambda: fast_path_line(name, options, dev)),
        ("state", lambda: state_line(name, options, model, tokens, positions)),
    ]
    for label, fn in (extra or {}).items():  # each on its own copy: the others' model stays as it was
        checks.append((label, functools.partial(_on_copy, fn, model, tokens, positions)))
    for label, run in checks:
        try:
            line = run()
        except Exception as e:  # a check that cannot run is a finding, reported in its line
            line = Line(label, "runs", f"{type(e).__name__}: {e}", False)
        if note and label in ("causal", "cache", "state"):
            line.measured += note
        report.lines.append(line)
    return report


def format_conformance(report: Conformance) -> str:
    opts = f" {report.options}" if report.options else ""
    lines = [
        f"extrapos check-encoding {report.encoding}{opts}",
        "",
        "| check | rule | measured | verdict |",
        "|---|---|---|---|",
    ]
    for line in report.lines:
        verdict = "skipped" if line.ok is None else ("ok" if line.ok else "FAILED")
        lines.append(f"| {line.check} | {line.rule} | {line.measured} | {verdict} |")
    failed = report.failed()
    lines += [
        "",
        "conforms: every check holds"
        if not failed
        else f"does NOT conform: {', '.join(failed)} failed (docs/plugins.md says what each line checks)",
    ]
    return "\n".join(lines)
