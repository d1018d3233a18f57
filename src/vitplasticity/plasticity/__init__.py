"""Plasticity: the average rate of change ||f(x) - f(y)||_F / ||x - y||_F of every component f
(ln1, mha, ln2, fc1, fc2) of every block of a transformer, over pairs of images or token
sequences (docs/protocol.md). The model's architecture (:mod:`vitplasticity.models.architectures`)
says what its embedding and its components are; the measurement knows no module names.

Two protocols (:mod:`~vitplasticity.plasticity.protocols`) decide what each component is fed:

- ``embedding`` (the reference code, the default to reproduce): x and y are the embedding
  outputs of the reference and the downstream image; *every* block's components are fed that
  same pair. MHA is ``attn(x)`` without the norm before it or the residual; FC1 is ``fc1(x)``
  without activation; FC2 is ``fc2([x, 0, 0, 0])``, x zero-padded to fc2's input width.
- ``in_situ``: the real forward pass; each component gets what reaches it there, and its
  ratio divides by the difference of its own inputs.

Pair i is reference image i with downstream image i; the downstream set is cycled when it is
shorter (:mod:`~vitplasticity.plasticity.pairs`). Both images of a pair travel in one forward
pass (reference half first), so that every difference is taken on the device right where the
two activations are, and the per-pair norms are the only thing kept
(:mod:`~vitplasticity.plasticity.norms`). Computation runs in the model's parameter dtype on
the model's device; norms are reduced in float64 (over tokens).

:func:`vitplasticity.plasticity.measure.measure` measures a model; the workflow's stages are
:func:`vitplasticity.plasticity.images.measure_dataset` (images) and
:func:`vitplasticity.plasticity.text.measure_text` (token sequences), each giving a
:class:`~vitplasticity.plasticity.summary.Measurement` (per-pair table, summary, footer
metadata). This package's ``__init__`` imports nothing, so that importing one module of it
(the text stage's torch-free constants) loads no torch.
"""
