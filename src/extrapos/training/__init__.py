"""Training commands (the commands layer): ``trainer`` (`extrapos train`: one loop for every
encoding, from a CPU to torchrun) and ``extend`` (`extrapos extend`: continue a trained run at K x its
training length). They import the run layer and below; the package re-exports nothing, so an import
names its module (``from extrapos.training.trainer import train``).
"""
