"""What a model is: its spec (``spec``: one type per family, picked by ``family:``), the one
build entry point (``build``), the families' builders (``timm_build``; ``hf_build``,
``hf_classifier``, ``hf_preprocessing``), text models (``text``), weights and hub files, LoRA,
selection; ``architectures/``: one file per family."""
