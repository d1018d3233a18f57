"""Which components should I finetune? The paper's answer for any model and dataset, in minutes.

:mod:`.settings` declares what both recommends take (torch-free: the Snakefile imports it);
:mod:`.criteria` measures, per component of a timm ViT, its plasticity (the paper's
criterion) and four alternatives side by side (PLoP's NFN in :mod:`.nfn`); :mod:`.ranking`
ranks configurations per criterion, picks one under a trainable-parameter budget and writes
the Markdown report; :mod:`.figure` draws them; :mod:`.pipeline` is the stage (read the data,
build the model, measure, choose, write) that the ``vitplasticity recommend`` command calls,
:mod:`.text` its counterpart for a causal language model. This package's ``__init__`` imports
nothing, so that importing its settings loads no torch.
"""
