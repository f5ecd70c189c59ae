"""`extrapos doctor`: what this machine offers, and whether every encoding computes right on it.

One table: the device and its capability (the CPU's instruction set, or the GPU's name and compute
capability), torch's version, bf16 support; then, for every registered encoding, one training step
(forward, loss, backward) and one cached decode on the fastest path the machine offers (CUDA: bf16
autocast, with FlexAttention where the model picks it; CPU: fp32), each compared on the same inputs
with the same weights in float64 on the CPU, the reference every kernel of extrapos is tested against.
The relative error ||fast - reference|| / ||reference|| of the loss, the logits and the gradients must
stay under the dtype's tolerance (bf16 1e-2, tf32 1e-3, fp32 1e-5); the decode's logits are compared
with the reference's full forward. Last, the time of one GPT-2-small training step.

A small model (2 layers, d 64, 4 heads, vocab 256, 32 tokens) keeps the whole check under a minute on
a CPU, so it runs in the default test suite; on a GPU it is the first thing `make gpu-check` runs.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from extrapos.model import Decoder

#: relative error allowed on the fast path, by the precision it computes in
TOLERANCE = {"bf16": 1e-2, "tf32": 1e-3, "fp32": 1e-5}
VOCAB, T, PREFILL = 256, 32, 24


@dataclass
class EncodingCheck:
    name: str
    loss: float  # relative errors against the float64 reference
    logits: float
    grads: float
    decode: float
    tolerance: float
    error: str | None = None  # a failure to run at all
    #: the warnings of a fast path that fell back (FlexAttention on CUDA): the result is still checked,
    #: and correct, but it ran on the slower path; on a GPU this is what tells a refused compile
    fallbacks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        worst = max(self.loss, self.logits, self.grads, self.decode)
        return self.error is None and worst <= self.tolerance


@dataclass
class Report:
    machine: dict[str, Any]
    precision: str
    checks: list[EncodingCheck] = field(default_factory=list)
    step: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "precision": self.precision,
            "ok": self.ok,
            "checks": [asdict(c) | {"ok": c.ok} for c in self.checks],
            "step": self.step,
        }


def machine_facts(device: torch.device) -> dict[str, Any]:
    from extrapos.run.precision import cpu_bf16_units, precision_facts
    from extrapos.run.runtime import cpu_has_fast_bf16

    facts: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        facts |= {
            "gpu": torch.cuda.get_device_name(device),
            "compute_capability": f"{major}.{minor}",
            "bf16": torch.cuda.is_bf16_supported(),
        }
    else:
        facts["bf16"] = "native" if cpu_has_fast_bf16() else "emulated (about 20x slower than fp32)"
        facts["bf16_units"] = cpu_bf16_units()
    facts["auto_precision"] = precision_facts(device)  # what train.precision = "auto" picks here
    return facts


def fastest_precision(device: torch.device) -> str:
    """bf16 autocast on a GPU that has it (what training there uses), fp32 elsewhere."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def _rel(fast: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.detach().double().cpu()
    diff = fast.detach().double().cpu() - ref
    return float(diff.norm() / ref.norm().clamp_min(1e-30))


def _step(
    model: Decoder, tokens: torch.Tensor, positions: torch.Tensor, device: torch.device, precision: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, logits, flattened gradients) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(tokens, positions)
    loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1).double().cpu() for p in model.parameters() if p.grad is not None])
    return loss, logits, grads


def _decode(
    model: Decoder, tokens: torch.Tensor, positions: torch.Tensor, device: torch.device, precision: str
) -> torch.Tensor:
    """The logits of the last T - PREFILL tokens, decoded one at a time after a cached prefill."""
    cache = model.new_cache()
    out = []
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        model(tokens[:, :PREFILL], positions[:, :PREFILL], cache)
        for i in range(PREFILL, T):
            out.append(model(tokens[:, i : i + 1], positions[:, i : i + 1], cache))
    return torch.cat(out, dim=1)


def check_encoding(
    name: str, device: torch.device, precision: str, options: dict[str, Any] | None = None
) -> EncodingCheck:
    """One training step and one cached decode of a cpu-tiny model with encoding ``name`` (and its
    ``options``) on ``device`` in ``precision``, against the same model in float64 on the CPU."""
    from extrapos.model import Decoder, model_config

    tolerance = TOLERANCE[precision]
    try:
        table = {"name": name, **(options or {})}  # the config's model.positions
        cfg = model_config("cpu-tiny", positions=table, vocab_size=VOCAB, train_length=T)
        torch.manual_seed(0)
        model = Decoder(cfg)
        reference = copy.deepcopy(model).double()
        gen = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, VOCAB, (2, T), generator=gen)
        positions = torch.arange(T).expand(2, -1)
        ref_loss, ref_logits, ref_grads = _step(reference, tokens, positions, torch.device("cpu"), "fp32")
        model.to(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss, logits, grads = _step(model, tokens.to(device), positions.to(device), device, precision)
            model.eval()
            decoded = _decode(model, tokens.to(device), positions.to(device), device, precision)
        fallbacks = []
        for w in caught:  # the fast path's fallbacks are findings; every other warning goes on its way
            if "FlexAttention" in str(w.message):
                fallbacks.append(str(w.message).split("\n")[0][:240])
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return EncodingCheck(
            name,
            loss=_rel(loss, ref_loss),
            logits=_rel(logits, ref_logits),
            grads=_rel(grads, ref_grads),
            decode=_rel(decoded, ref_logits[:, PREFILL:]),
            tolerance=tolerance,
            fallbacks=fallbacks,
        )
    except Exception as e:  # a check that cannot run is a finding, reported in its row
        nan = float("nan")
        return EncodingCheck(name, nan, nan, nan, nan, tolerance, error=f"{type(e).__name__}: {e}")


def time_gpt2_small_step(device: torch.device, precision: str, tokens: int) -> dict[str, Any]:
    """One GPT-2-small training step (forward, backward, AdamW) on ``tokens`` tokens, after one warm-up."""
    from extrapos.model import Decoder, model_config

    torch.manual_seed(0)
    model = Decoder(model_config("gpt2-small", positions={"name": "learned"})).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 50257, (1, tokens), device=device)
    pos = torch.arange(tokens, device=device).unsqueeze(0)
    times = []
    for _ in range(2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x, pos)
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return {"tokens": tokens, "seconds": times[-1], "tokens_per_s": tokens / times[-1]}


def doctor(
    device: str = "auto",
    encodings: list[str] | None = None,
    speed: bool = True,
    progress: bool = True,
    on_check: Callable[[EncodingCheck, float], None] | None = None,
) -> Report:
    """Every chosen encoding against its float64 reference on ``device``'s fastest path (and, ``speed``,
    one timed GPT-2-small step). ``on_check(check, seconds)`` hears of each encoding as it finishes: on
    CUDA a pairwise bias compiles FlexAttention's forward and backward, tens of seconds or more each,
    and a log without a terminal would otherwise stay silent until the end."""
    from tqdm import tqdm

    from extrapos.positions.registry import names
    from extrapos.run.runtime import resolve_device

    dev = resolve_device(device)
    precision = fastest_precision(dev)
    report = Report(machine_facts(dev), precision)
    chosen = encodings or names()
    for name in tqdm(chosen, desc="doctor", unit="encoding", disable=None if progress else True, leave=False):
        t0 = time.perf_counter()
        report.checks.append(check_encoding(name, dev, precision))
        if on_check is not None:
            on_check(report.checks[-1], time.perf_counter() - t0)
    if speed:
        report.step = time_gpt2_small_step(dev, precision, 1024 if dev.type == "cuda" else 128)
    return report


def format_report(report: Report) -> str:
    m = report.machine
    where = f"{m['gpu']} (compute capability {m['compute_capability']})" if "gpu" in m else "CPU"
    lines = [
        f"device {m['device']}: {where}; CPU capability {m['cpu_capability']}, {m['threads']} threads; "
        f"torch {m['torch']}; bf16 {m['bf16']}",
        f"fast path: {report.precision}; reference: float64 on the CPU; tolerance "
        f"{TOLERANCE[report.precision]:g} relative",
    ]
    lines += [
        f"train.precision = auto on {model}: {choice['precision']} ({choice['why']})"
        for model, choice in m.get("auto_precision", {}).items()
    ]
    lines += [
        "",
        "| encoding | loss | logits | gradients | cached decode | ok |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for c in report.checks:
        if c.error:
            lines.append(f"| {c.name} | – | – | – | – | FAILED: {c.error} |")
        else:
            lines.append(
                f"| {c.name} | {c.loss:.1e} | {c.logits:.1e} | {c.grads:.1e} | {c.decode:.1e} | "
                f"{'yes' if c.ok else 'NO'} |"
            )
    if report.step:
        s = report.step
        lines += ["", f"GPT-2-small training step, {s['tokens']} tokens: {s['seconds']:.3f} s "
                  f"({s['tokens_per_s']:,.0f} tokens/s)"]  # fmt: skip
    fell = [c for c in report.checks if c.fallbacks]
    if fell:
        lines += ["", "Fell back from the fast path (still checked above, on the slower path):"]
        lines += [f"- {c.name}: {'; '.join(dict.fromkeys(c.fallbacks))}" for c in fell]
    bad = [c.name for c in report.checks if not c.ok]
    lines += ["", "every encoding agrees with the reference" if not bad else f"disagreeing: {', '.join(bad)}"]
    return "\n".join(lines)
