"""Run configuration: dataclasses with defaults that run, TOML presets, dotted overrides.

A preset file sets only what differs from the defaults::

    [model]
    size = "cpu-small"            # a size preset of model.py, applied before the other keys
    [model.positions]
    name = "expe"
    [train]
    steps = 300

``--set train.lr=3e-4`` overrides one key (the value is read as TOML, else as a string). An unknown
key or a wrong type is a ``UserError`` naming the key. The resolved config (every field explicit)
is written into the run directory and every checkpoint, so a run can be resumed and reproduced
without the preset it came from.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from extrapos import schema
from extrapos.data.segmented import POSE_CHUNKS
from extrapos.errors import UserError
from extrapos.model import ModelConfig, model_config
from extrapos.presets import PRESETS_DIR, find_config, parse_toml_value, preset_names, read_toml

__all__ = [
    "PRESETS_DIR",
    "BUDGET_KEYS",
    "DataConfig",
    "build_section",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "find_config",
    "from_dict",
    "load_config",
    "load_run_config",
    "parse_override",
    "preset_names",
    "read_toml",
    "validate",
    "with_overrides",
]

#: the precisions train.precision accepts ("auto": run/precision.py picks per device and model)
PRECISIONS = ("fp32", "bf16", "auto")


@dataclass
class DataConfig:
    corpus: str = "sotu"  # corpus spec (sotu, python-stdlib, a path, hf:...)
    tokenizer: str = "bpe:8192"  # tokenizer spec (bpe:N, a tokenizer.json / .model / .tiktoken)
    dir: str | None = None  # a prepared data directory (overrides corpus/tokenizer)
    min_doc_tokens: int = 0
    max_tokens: int | None = None
    max_docs: int | None = None
    split_fractions: list[float] = field(default_factory=lambda: [0.9, 0.05, 0.05])
    text_field: str = "text"
    packed: bool = False  # windows across documents joined by end-of-text
    document_mask: bool = False  # packed rows: attention stays inside each document
    document_positions: str = "continue"  # packed rows: "continue" across documents | "restart" at each
    sampler: str = "contiguous"  # contiguous | chunk | prefix | full | randompos | pose | synthetic
    alpha: float = 0.25  # chunk / prefix fraction (segmented sampling)
    extended_length: int | None = None  # L_e for segmented samplers (windows of L_e tokens)
    chunk_targets: str | None = None  # chunk: None/"original" (original next token) | "concatenated"
    split_rule: str | None = None  # None/"document": whole documents per split | "within": held-out tails
    split_gap: int | None = None  # tokens skipped between a document's splits (split_rule = within)
    pose_chunks: int = POSE_CHUNKS  # pose: chunks an example's positions are split into (Zhu et al. 2023: 2)


@dataclass
class TrainConfig:
    seq_len: int | None = None  # tokens per example; None -> model.train_length
    batch_size: int = 16  # sequences per micro-batch (per process)
    batch_tokens: int | None = None  # effective batch in tokens; accumulation fills it
    steps: int | None = None  # budget: exactly one of steps / tokens / epochs (default 200 steps)
    tokens: int | None = None
    epochs: float | None = None
    lr: float = 1e-3
    end_lr: float = 1e-4
    warmup: float = 0.1  # fraction of the steps if < 1, else a number of steps
    schedule: str = "cosine"  # cosine | linear | constant (after warmup)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables
    precision: str = "fp32"  # fp32 | bf16 (autocast) | auto (by device and width: run/precision.py)
    compile: bool = False
    # torch's deterministic kernels (use_deterministic_algorithms, warn_only) and cuBLAS's fixed
    # workspace: a rerun or a resume on a GPU repeats the same losses, at some cost in speed
    deterministic: bool = False
    parallel: str = "ddp"  # ddp | fsdp (FSDP2) across torchrun processes
    activation_checkpointing: bool = False  # recompute each block's activations in the backward
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # torch intra-op threads on CPU (None: torch's default)
    log_every: int = 10
    eval_every: int = 0  # 0: validate only at the end
    eval_batches: int = 16
    checkpoint_every: int = 0  # 0: checkpoint only at the end
    keep_checkpoints: int = 2
    tensorboard: bool = False
    wandb: str | None = None  # a W&B project name to log to (needs wandb installed)
    objective: str = "lm"  # lm: next token (decoders) | mlm: masked tokens (encoder flavour)
    mask_rate: float = 0.15  # mlm: share of tokens selected in training (BERT 0.15; evaluation keeps 0.15)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @property
    def seq_len(self) -> int:
        return self.train.seq_len or self.model.train_length

    def to_dict(self) -> dict[str, Any]:
        d = _drop_none(dataclasses.asdict(self))
        for section, defaults in WRITTEN_WHEN_SET.items():
            for key, default in defaults.items():
                if d[section].get(key) == default:
                    del d[section][key]
        return d

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


# Keys added after runs were saved, written only when they differ from their default: a run saved
# before them keeps a byte-identical config.toml, which `compare` and `extend` compare as text.
WRITTEN_WHEN_SET: dict[str, dict[str, Any]] = {
    "model": {"parallel_residual": False, "embed_norm": False, "post_norm": False},
    "data": {"pose_chunks": POSE_CHUNKS, "document_mask": False, "document_positions": "continue"},
    "train": {
        "parallel": "ddp",
        "activation_checkpointing": False,
        "deterministic": False,
        "objective": "lm",
        "mask_rate": 0.15,
    },
}


def _drop_none(d: Any) -> Any:
    # TOML has no null: a missing key means the default (which is None for these fields)
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


# ---- building and checking ----------------------------------------------------------------------


def build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    names = ", ".join(sorted(f.name for f in dataclasses.fields(cls)))
    return schema.build(
        cls,
        values,
        where=f"config key '{section}.{{key}}'",
        unknown=f"unknown config key '{section}.{{key}}'; the keys of [{section}] are: {names}.",
    )


def from_dict(raw: dict[str, Any]) -> RunConfig:
    """Build and type-check a RunConfig from nested dicts (TOML content)."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    unknown = sorted(set(raw) - {"model", "data", "train"})
    if unknown:
        raise UserError(
            f"unknown config section '{schema.one_line(unknown[0])}'; sections are [model], [data] and "
            "[train]."
        )
    model_raw = dict(raw.get("model", {}))
    size = schema.check(str | None, model_raw.pop("size", None), "config key 'model.size'")
    positions = model_raw.pop("positions", None)
    base = dataclasses.asdict(model_config(size)) if size else {}
    if positions is not None:
        if isinstance(positions, str):
            positions = {"name": positions}
        if not isinstance(positions, dict) or "name" not in positions:
            raise UserError(
                "config key 'model.positions' needs a 'name' (e.g. [model.positions] name = \"rope\")."
            )
        base["positions"] = positions
    base.update(model_raw)
    model = build_section(ModelConfig, base, "model")
    data = build_section(DataConfig, raw.get("data", {}), "data")
    train = build_section(TrainConfig, raw.get("train", {}), "train")
    cfg = RunConfig(model, data, train)
    validate(cfg)
    return cfg


def validate(cfg: RunConfig) -> None:
    """Every value checked before anything is written: a bad one is one sentence naming the key."""
    _validate_text(dataclasses.asdict(cfg), "")
    cfg.model.validate()  # the model's own rules (model.py), the library's as the CLI's
    _validate_train(cfg.train)
    _validate_data(cfg.data)
    if (cfg.train.objective == "mlm") != (cfg.model.flavour == "encoder"):
        raise UserError(
            f"train.objective={cfg.train.objective!r} does not fit model.flavour={cfg.model.flavour!r}: "
            "the encoder flavour trains with objective mlm, the decoders (gpt2, llama) with lm."
        )
    if cfg.train.objective != "mlm" and cfg.train.mask_rate != TrainConfig.mask_rate:
        raise UserError(
            "train.mask_rate applies to objective mlm only; remove it from this decoder's config."
        )
    if cfg.data.sampler == "pose":  # its examples have seq_len tokens, each chunk at least one
        _require(
            cfg.data.pose_chunks <= cfg.seq_len,
            "data.pose_chunks",
            f"at most the example length {cfg.seq_len} (every chunk holds a token)",
            cfg.data.pose_chunks,
        )


def _require(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise UserError(f"{key} must be {rule}, got {value!r}.")


def _validate_text(value: Any, key: str) -> None:
    """Every string of the config, nested ones too (an encoding's options are a free table), is UTF-8 text:
    the config is written to config.toml, which holds UTF-8 only."""
    if isinstance(value, dict):
        for k, v in value.items():
            _validate_text(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _validate_text(v, f"{key}[{i}]")
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 arrive as lone surrogates
            raise UserError(
                f"{key} must be UTF-8 text (it holds bytes that are not), got {value!r}."
            ) from None


def _validate_train(t: TrainConfig) -> None:
    budgets = [b for b in (t.steps, t.tokens, t.epochs) if b is not None]
    if len(budgets) > 1:
        raise UserError("set only one of train.steps, train.tokens and train.epochs.")
    for key in ("steps", "tokens", "epochs", "seq_len", "batch_tokens", "threads"):
        value = getattr(t, key)
        _require(value is None or value > 0, f"train.{key}", "positive", value)
    _require(t.batch_size >= 1, "train.batch_size", "a positive integer", t.batch_size)
    # numpy's generators (data order, masks) refuse a negative seed
    _require(t.seed >= 0, "train.seed", "a non-negative integer", t.seed)
    _require(t.precision in PRECISIONS, "train.precision", "'fp32', 'bf16' or 'auto'", t.precision)
    _require(t.parallel in ("ddp", "fsdp"), "train.parallel", "'ddp' or 'fsdp'", t.parallel)
    _require(
        t.schedule in ("cosine", "linear", "constant"),
        "train.schedule",
        "cosine, linear or constant",
        t.schedule,
    )
    # AdamW's step is about lr per weight: above 1 the first step destroys the model (a NaN loss at step 1)
    _require(0 <= t.lr <= 1, "train.lr", "a learning rate in [0, 1] (e.g. 3e-4)", t.lr)
    _require(0 <= t.end_lr <= 1, "train.end_lr", "a learning rate in [0, 1] (e.g. 3e-5)", t.end_lr)
    _require(t.warmup >= 0, "train.warmup", "a fraction of the steps (< 1) or a number of steps", t.warmup)
    # AdamW's decoupled decay multiplies each weight by 1 - lr x weight_decay a step: at 1 or more the first
    # step zeroes or flips every weight (Loshchilov & Hutter 2019, Algorithm 2)
    _require(
        t.weight_decay >= 0 and t.lr * t.weight_decay < 1,
        "train.weight_decay",
        f"non-negative and below 1 / train.lr ({1 / t.lr:.6g})" if t.lr > 0 else "non-negative",
        t.weight_decay,
    )
    _require(0 <= t.beta1 < 1, "train.beta1", "in [0, 1)", t.beta1)
    _require(0 <= t.beta2 < 1, "train.beta2", "in [0, 1)", t.beta2)
    _require(t.eps > 0, "train.eps", "positive", t.eps)
    _require(t.grad_clip >= 0, "train.grad_clip", "non-negative (0 disables clipping)", t.grad_clip)
    _require(
        t.objective in ("lm", "mlm"), "train.objective", "lm (next token) or mlm (masked tokens)", t.objective
    )
    _require(0 < t.mask_rate < 1, "train.mask_rate", "in (0, 1), e.g. 0.15 (BERT) or 0.4", t.mask_rate)
    _require(t.log_every >= 1, "train.log_every", "at least 1", t.log_every)
    _require(t.eval_batches >= 1, "train.eval_batches", "at least 1", t.eval_batches)
    for key in ("eval_every", "checkpoint_every", "keep_checkpoints"):
        _require(
            getattr(t, key) >= 0,
            f"train.{key}",
            "non-negative (0: only at the end / keep all)",
            getattr(t, key),
        )
    _require(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", t.device) is not None,
        "train.device",
        "auto, cpu, cuda or cuda:N",
        t.device,
    )


def _validate_data(d: DataConfig) -> None:
    from extrapos.data.segmented import SEGMENTED

    # an empty spec would be read as "none given" (data.dir = "" prepares the default corpus instead)
    for key in ("corpus", "tokenizer", "dir", "text_field"):
        value = getattr(d, key)
        _require(value is None or value.strip() != "", f"data.{key}", "a non-empty name or path", value)

    samplers = ("contiguous", "synthetic", *SEGMENTED)
    _require(d.sampler in samplers, "data.sampler", "one of " + ", ".join(samplers), d.sampler)
    fractions = d.split_fractions
    _require(
        len(fractions) == 3 and all(0 <= f <= 1 for f in fractions) and abs(sum(fractions) - 1) < 1e-6,
        "data.split_fractions",
        "three numbers in [0, 1] summing to 1 (train, val, test)",
        fractions,
    )
    _require(0 < d.alpha <= 1, "data.alpha", "in (0, 1]", d.alpha)
    _require(
        d.document_positions in ("continue", "restart"),
        "data.document_positions",
        "'continue' (positions run across the documents of a packed row) or 'restart' (each starts at 0)",
        d.document_positions,
    )
    if not d.packed and (d.document_mask or d.document_positions != "continue"):
        # name only what is set: a preset that packs (cpu/medium) leaves both, and unpacking it needs both off
        offending = [f"data.document_mask = {str(d.document_mask).lower()}"] if d.document_mask else []
        if d.document_positions != "continue":
            offending.append(f'data.document_positions = "{d.document_positions}"')
        raise UserError(
            f"{' and '.join(offending)} apply to packed rows only (an unpacked window holds one document); "
            'set data.packed = true, or data.document_mask = false and data.document_positions = "continue".'
        )
    _require(d.min_doc_tokens >= 0, "data.min_doc_tokens", "non-negative", d.min_doc_tokens)
    for key in ("max_tokens", "max_docs", "extended_length"):
        _require(getattr(d, key) is None or getattr(d, key) > 0, f"data.{key}", "positive", getattr(d, key))
    # None (the default, absent from saved configs so older runs compare equal) means "original"
    _require(
        d.chunk_targets in (None, "original", "concatenated"),
        "data.chunk_targets",
        "'original' or 'concatenated'",
        d.chunk_targets,
    )
    _require(
        d.split_rule in (None, "document", "within"),
        "data.split_rule",
        "'document' or 'within'",
        d.split_rule,
    )
    _require(
        d.split_gap is None or d.split_gap >= 0,
        "data.split_gap",
        "a non-negative number of tokens",
        d.split_gap,
    )
    _require(
        d.chunk_targets in (None, "original") or d.sampler == "chunk",
        "data.chunk_targets",
        "left unset unless data.sampler = chunk",
        d.chunk_targets,
    )
    _require(d.pose_chunks >= 1, "data.pose_chunks", "a positive integer", d.pose_chunks)
    _require(
        d.pose_chunks == POSE_CHUNKS or d.sampler == "pose",
        "data.pose_chunks",
        "left unset unless data.sampler = pose",
        d.pose_chunks,
    )


# ---- overrides ------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise UserError(f"override {text!r} must look like section.key=value (e.g. train.lr=3e-4).")
    key, _, value = text.partition("=")
    keys = key.strip().split(".")
    if len(keys) < 2 or not all(keys):
        raise UserError(f"override key {key!r} must name a section and a key, e.g. train.steps.")
    return keys, parse_toml_value(value)


BUDGET_KEYS = ("steps", "tokens", "epochs")


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] == "train" and len(keys) == 2 and keys[1] in BUDGET_KEYS:
            # a budget given on the command line replaces the preset's, whatever its kind
            for other in BUDGET_KEYS:
                raw.get("train", {}).pop(other, None)
        node = raw
        for k in keys[:-1]:
            child = node.get(k)
            if isinstance(child, str) and k == "positions":  # positions = "rope" shorthand
                child = {"name": child}
            if child is None:
                child = {}
            if not isinstance(child, dict):  # train.steps.x=1: steps holds a value, not a table
                raise UserError(
                    f"override key {'.'.join(keys)!r} goes inside {k!r}, which holds the value {child!r}, "
                    "not a table of keys; name the key itself (e.g. train.steps=100)."
                )
            node[k] = child
            node = child
        node[keys[-1]] = value
    return raw


def load_config(spec: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Defaults <- preset/file <- --set overrides, checked."""
    raw = read_toml(find_config(spec)) if spec else {}
    return from_dict(apply_overrides(raw, list(overrides or [])))


def with_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """``cfg`` with dotted ``--set`` overrides applied, checked like a config file."""
    if not overrides:
        return cfg
    return from_dict(apply_overrides(cfg.to_dict(), list(overrides)))


def load_run_config(run_dir: Path) -> RunConfig:
    path = Path(run_dir) / "config.toml"
    if not path.is_file():
        raise UserError(
            f"{run_dir} is not a run directory (no config.toml); pass the --out of `extrapos train`."
        )
    return from_dict(read_toml(path))
