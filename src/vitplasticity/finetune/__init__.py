"""Single-component finetuning of a ViT, as in the paper (docs/protocol.md, "Finetuning").

One run trains one configuration (:data:`vitplasticity.models.architectures.CONFIGURATIONS`): the
components it names, plus the new classifier head and the final norm; everything else is
frozen (``requires_grad`` False: no gradient, no optimizer state). Which parameter is whose
comes from the model's architecture (:class:`vitplasticity.models.architectures.ParameterMap`, by
identity): a model no architecture knows, or one its architecture refuses to finetune, is an
error before any step. SGD (momentum 0.9) or AdamW, no weight decay; linear warmup from 0 then
cosine to 0; gradient-norm clipping; gradients accumulated over micro-batches when the batch
does not fit.

Model selection: at every validation point the test set is evaluated too, and the test
accuracy of the step with the best validation accuracy (the earliest on ties) is the run's
result; no weights are kept aside, and the metrics hold the whole test-accuracy curve.

A run checkpoints every ``checkpoint_every`` steps and on SIGTERM (what SLURM sends before
preemption), resumes from its checkpoint when started again, and ends bit-identical (on CPU)
to an uninterrupted run; the checkpoint is deleted when the run completes. A run whose loss
or gradient norm becomes non-finite stops and is recorded as diverged.

:func:`vitplasticity.finetune.train.train_runs` takes the runs of one job (each a
:class:`vitplasticity.finetune.run.Run` and its output folder), the
:class:`~vitplasticity.finetune.settings.TrainingSettings` they share and their source (an
image dataset, or a text file: :mod:`~vitplasticity.finetune.text_run`), checks them all once
(:mod:`~vitplasticity.finetune.identity`), then takes each run through four pieces, one module
each, whatever its task (:mod:`~vitplasticity.finetune.tasks`):
:mod:`~vitplasticity.finetune.setup` (model, optimizer, task, data),
:mod:`~vitplasticity.finetune.resumable` (resume), :mod:`~vitplasticity.finetune.loop`
(the steps of :mod:`~vitplasticity.finetune.step`) and :mod:`~vitplasticity.finetune.outputs`
(summary and files). :func:`~vitplasticity.finetune.train.train` is one run of it.

This package's ``__init__`` imports nothing: :mod:`vitplasticity.finetune.settings` stays
torch-free for the Snakefile.
"""
