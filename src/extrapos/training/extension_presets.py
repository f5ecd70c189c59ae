"""Extension presets: a published recipe for ``extrapos extend`` as one name (``--preset NAME``), for any
run, trained here or imported (``extrapos presets`` lists them).

The segmented-sequences paper (Karypis et al., *Extending Input Contexts of Language Models through
Training on Segmented Sequences*) extends pretrained models with ``chunk`` at alpha = 0.25: in its
Table 3, chunk-0.25 is the best segmented method at 2 x and 4 x on both development models (and beats
training on the full L_e windows for RoPE at 4 x); §4.4 fixes the budget as L_e / L_t epochs of the
L_e windows (compute-equivalent, extrapos' default). Its abstract and §6 extend by 4 x; Table 3 also
reports 2 x. The paper gives no learning rate; ``extend``'s rule continues near the parent's final one
(docs/extension.md), and says so when the parent is an imported model whose training settings are not
known.
"""

from __future__ import annotations

from dataclasses import dataclass

from extrapos.errors import UserError


@dataclass(frozen=True)
class ExtensionPreset:
    name: str
    method: str
    alpha: float | None
    factor: int
    summary: str  # one line for `extrapos presets`
    source: str  # where the settings come from


SEGMENTED = "Karypis et al., segmented sequences, Table 3 and §4.4"
PRESETS = {
    p.name: p
    for p in (
        ExtensionPreset(
            "segmented-chunk-x4",
            "chunk",
            0.25,
            4,
            "the segmented-sequences paper's extension: chunk-0.25 to 4 x L_t, compute-equivalent budget",
            SEGMENTED,
        ),
        ExtensionPreset(
            "segmented-chunk-x2",
            "chunk",
            0.25,
            2,
            "the same to 2 x L_t (the paper's other extension size)",
            SEGMENTED,
        ),
    )
}


def extension_preset(name: str) -> ExtensionPreset:
    if name not in PRESETS:
        raise UserError(
            f"no extension preset named {name!r}; the extension presets are: {', '.join(PRESETS)}."
        )
    return PRESETS[name]
