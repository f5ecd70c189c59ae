"""Task evaluations beyond perplexity: passkey / needle retrieval and synthetic length-generalization tasks.

``extrapos.tasks.passkey`` scores a run on the passkey retrieval test of Mohtashami & Jaggi (2023,
"Landmark Attention", §4.2) over a grid of lengths (multiples of L_t) and needle depths;
``extrapos.tasks.synthetic`` scores a run trained on a ``synthetic:`` corpus (see
``extrapos.data.synthetic``) by its accuracy on the answer tokens at k x L_t.
"""
