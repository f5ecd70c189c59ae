"""Reading safetensors shards: headers first (every problem found before any work), then one tensor at a
time, so that an import holds one model plus one tensor."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from torch import Tensor

from extrapos.errors import UserError

if TYPE_CHECKING:
    from extrapos.integrations.hf.adapter import Adapter
    from extrapos.model import ModelConfig

_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the dtypes a model's weights may have


def _unreadable(file: Path, e: Exception) -> UserError:
    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UserError(
        f"{file} is not a readable safetensors file ({why}); it may be truncated or damaged, "
        "download it again."
    )


def shard_header(file: Path) -> dict[str, tuple[str, int]]:
    """Every tensor of a safetensors shard with its dtype (``F32``, ``BF16``...) and element count, from
    the header alone; a UserError naming the file when it is empty, truncated or has a damaged header."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            slices = {key: f.get_slice(key) for key in f.keys()}  # f is a safetensors file, not a dict
            return {key: (t.get_dtype(), math.prod(t.get_shape())) for key, t in slices.items()}
    except OSError:
        raise
    except Exception as e:  # SafetensorError: a header too small, not JSON, offsets past the end
        raise _unreadable(file, e) from None


def check_shards(files: list[Path], adapter: Adapter, cfg: ModelConfig) -> None:
    """Before any work: every shard's header is readable, every tensor is a weight of the adapter's
    architecture, every weight is floating point (integer or quantized tensors would be cast to
    meaningless numbers), and the shards hold at least as many values as the model config.json
    describes (so that a config with a huge size is refused here, not by allocating it)."""
    held = 0
    for file in files:
        for key, (dtype, numel) in shard_header(file).items():
            if adapter.weights.match(key, adapter.model_type) is None:  # a buffer, not a weight
                continue
            held += numel
            if dtype not in _FLOAT_DTYPES:
                raise UserError(
                    f"{key} in {file} holds {dtype} values, not floating-point weights; extrapos imports "
                    "float32, float16 or bfloat16 checkpoints (dequantize it first)."
                )
    # a lower bound of the model's weights, in Python integers (no model is built, nothing overflows):
    # the embedding, an untied head, Q and the output projection, and the MLP's up and down matrices
    d, vocab = cfg.d_model, cfg.vocab_size
    needed = vocab * d * (1 if cfg.tie_embeddings else 2) + cfg.n_layers * (2 * d * d + 2 * d * cfg.hidden)
    plan = cfg.positions_plan()
    if plan.name == "learned":  # GPT-2's position table: n_positions rows
        from extrapos.positions.absolute import LearnedAbsolute

        needed += int(plan.options_as(LearnedAbsolute.Options).max_length or cfg.train_length) * d
    if needed > held:
        raise UserError(
            f"config.json describes a model of at least {needed:,} weights but the safetensors files "
            f"hold {held:,}; config.json and the weights disagree."
        )


def iter_hf_tensors(files: list[Path]) -> Iterator[tuple[str, Callable[[], Tensor]]]:
    """(name, loader) for every tensor of the shards; each loader reads that one tensor."""
    from safetensors import safe_open

    def load(file: Path, key: str) -> Tensor:
        # one mapping per tensor: pages of a shard mapped for the whole loop would count in the resident
        # set as they are read, a second copy of the model next to the one being filled
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                return f.get_tensor(key)
        except OSError:
            raise
        except Exception as e:
            raise _unreadable(file, e) from None

    for file in files:
        for key in shard_header(file):
            yield key, partial(load, file, key)
