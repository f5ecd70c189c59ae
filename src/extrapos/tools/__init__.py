"""Commands about the library and the machine rather than a run (the commands layer): ``catalog``
(`extrapos encodings`: every encoding, its options and paper) and ``doctor`` (`extrapos doctor`: the
device, and every encoding checked against the float64 reference). They import the run layer and
below; the package re-exports nothing, so an import names its module
(``from extrapos.tools.catalog import encodings_text``).
"""
