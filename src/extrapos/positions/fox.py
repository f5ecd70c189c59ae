"""Forgetting attention, a data-dependent ALiBi (Lin et al. 2025, "Forgetting Transformer: softmax
attention with a forget gate", §2, eqs. for f_t and D_ij).

Per layer and head, from the normed block input x_t (the input of the Q/K/V projections):

    f_t = sigmoid(w^T x_t + b)                       a scalar forget gate in (0, 1) per token
    D_ij = sum_{l=j+1..i} log f_l  (j <= i)          added to the logits q_i.k_j / sqrt(d_h)

With c_i = sum_{l<=i} log f_l (inclusive), D_ij = c_i - c_j and c_i is a row constant, so the bias
is q_feat_i * k_feat_j with q_feat = 1, k_feat = -c: a ``FoldedBias`` that runs through fused SDPA
exactly like ALiBi (whose gates would be the constant log f = -m_h). The running sum c is
accumulated in fp32 and carried by the KV cache (``state["fox_c"]``), as CABLE's S.

How it differs from CABLE (cable.py): both are cumulative sums of per-token increments of x, but

* FoX's increment -log f_l = softplus(-(w^T x_l + b)) is strictly positive and smooth (a gate can
  approach "remember everything" but never reach it), with a bias b; CABLE's ReLU(x w_c) is
  exactly zero for many tokens (no decay at all) and has no bias term;
* CABLE multiplies the whole row by a per-query weight g_i = softplus(x_i w_s); FoX has none
  (CABLE-NW is CABLE without it);
* both charge the tokens after the key (l = j+1..i) and fold the same way (q_feat = 1 here, g
  there); ``cable-official`` (softplus(x w + b) increments, no g) is FoX with (w, b) negated,
  except that it drops attention's 1/sqrt(d_h).

Bidirectional (the paper defines the causal form): D_ij = -|c_i - c_j|, the log-gates of the
tokens between the two (the query's side included, as in the causal form for j <= i); not rank
one, so a ``PairwiseBias``.

The paper's "Pro" block (output gate, QK-norm, key shift) changes the attention block rather than
the positional signal and is not part of this encoding. Init: w ~ N(0, 0.02) as the repository's
other projections and b = ``bias_init`` (0: f ~ 0.5 per token at the start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from extrapos.bounds import Bound, CheckedOptions
from extrapos.positions.base import EncodingContext, FoldedBias, PairwiseBias, PositionalEncoding
from extrapos.positions.bias import gate_projection, running_sum
from extrapos.positions.registry import register

STATE_KEY = "fox_c"


class ForgettingAttention(PositionalEncoding):
    """Bias sum_{l=j+1..i} log sigmoid(w^T x_l + b), per layer and head (Lin et al. 2025, §2); see module
    doc."""

    family = "forgetting"
    paper = "Lin et al. 2025, Forgetting Transformer: softmax attention with a forget gate (FoX)"

    @dataclass(frozen=True)
    class Options(CheckedOptions):
        BOUNDS: ClassVar[dict[str, Bound]] = {"bias_init": Bound(-100, 100)}
        bias_init: float = 0.0  # b at init: sigmoid(b) is the typical forget gate of an untrained model

    options: Options

    def __init__(self, ctx: EncodingContext, options: Options | None = None):
        super().__init__(ctx, options)
        gates = [nn.Linear(ctx.d_model, ctx.n_heads) for _ in range(ctx.n_layers)]
        for lin in gates:
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.constant_(lin.bias, self.options.bias_init)
        self.gates = nn.ModuleList(gates)

    def log_gates(self, x: Tensor, layer: int) -> Tensor:
        """log f (B, H, T) <= 0 in the feature dtype."""
        return F.logsigmoid(gate_projection(self.gates[layer], x)).transpose(1, 2)

    def bias(self, x: Tensor, positions: Tensor, layer: int, state: dict | None) -> FoldedBias | PairwiseBias:
        c = running_sum(self.log_gates(x, layer))  # inclusive
        if state is not None:
            if STATE_KEY in state:  # continue the running sum of the cached tokens
                c = c + state[STATE_KEY].unsqueeze(-1)
            state[STATE_KEY] = c[..., -1]
        if not self.ctx.causal:
            return PairwiseBias(q_feat=c.unsqueeze(-1), k_feat=c.unsqueeze(-1), fn=_symmetric_decay)
        # D_ij = c_i - c_j: c_i is a row constant
        return FoldedBias(q_feat=torch.ones_like(c), k_feat=-c)


def _symmetric_decay(qf: Tensor, kf: Tensor) -> Tensor:
    """-|c_i - c_j| for a block of queries qf (B, H, tq, 1) and all keys kf (B, H, Tk, 1)."""
    return -(qf - kf.transpose(-1, -2)).abs()


register(
    "fox",
    ForgettingAttention,
    "Forgetting attention (data-dependent ALiBi): bias = sum of log sigmoid forget gates between key and "
    "query (folded)",
)
