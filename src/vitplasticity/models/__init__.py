"""What a model is: spec, build, transformers, weights, LoRA, selection; architectures/ one file per family."""
