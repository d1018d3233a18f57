"""One tiny random-init model per architecture family and variant, built offline (timm with
small kwargs; transformers from its config class), for the contract test and the stages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TinyModel:
    """A tiny model of one family: how to build it and a batch of its inputs."""

    id: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], torch.Tensor]
    timm_id: str | None = None
    kwargs: dict | None = None


def _timm(timm_id: str, family: str, image: int = 32, **kwargs) -> TinyModel:
    import timm

    kwargs = {"img_size": image, "embed_dim": 48, "depth": 2, "num_heads": 3, **kwargs}

    def build() -> nn.Module:
        torch.manual_seed(0)
        return timm.create_model(timm_id, pretrained=False, num_classes=5, **kwargs)

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, 3, image, image, generator=torch.Generator().manual_seed(n))

    return TinyModel(timm_id, family, build, inputs, timm_id, kwargs)


TIMM_SWIN_TINY_KWARGS = {
    "img_size": 32,
    "embed_dim": 12,
    "depths": (2, 2),
    "num_heads": (2, 4),
    "window_size": 2,
}
"""A tiny timm Swin: 32 px images in an 8 x 8 patch grid of width 12, then a patch merging to
4 x 4 of width 24; windows of 2 x 2, so every stage has several and its second block shifts
them (with the mask)."""


def _timm_swin() -> TinyModel:
    import timm

    def build() -> nn.Module:
        torch.manual_seed(0)
        return timm.create_model(
            "swin_tiny_patch4_window7_224", pretrained=False, num_classes=5, **TIMM_SWIN_TINY_KWARGS
        )

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(n))

    return TinyModel(
        "swin_tiny_patch4_window7_224",
        "timm_swin",
        build,
        inputs,
        "swin_tiny_patch4_window7_224",
        TIMM_SWIN_TINY_KWARGS,
    )


GPT2_TINY_CONFIG = {
    "n_embd": 48,
    "n_layer": 2,
    "n_head": 3,
    "vocab_size": 64,
    "n_positions": 16,
    "attn_implementation": "eager",
}
"""A tiny GPT2Config: 2 blocks of width 48, 3 heads, 64 token ids, 16 positions."""


def _gpt2() -> TinyModel:
    def build() -> nn.Module:
        from vitplasticity.utils.optional import require_transformers

        transformers = require_transformers()
        torch.manual_seed(0)
        return transformers.GPT2Model(transformers.GPT2Config(**GPT2_TINY_CONFIG))

    def inputs(n: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(n)
        return torch.randint(0, GPT2_TINY_CONFIG["vocab_size"], (n, 12), generator=generator)

    return TinyModel("gpt2_tiny", "hf_gpt2", build, inputs)


HF_VISION_TINY_CONFIG = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "image_size": 32,
    "patch_size": 8,
    "attn_implementation": "eager",
}
"""What every tiny transformers vision config shares: 2 blocks of width 48, 3 heads, 32 px
images in 16 patches of 8."""


def _hf_vision(
    case_id: str,
    family: str,
    model_class: str,
    config_class: str,
    base: dict | None = None,
    **config,
) -> TinyModel:
    """A tiny transformers vision model: ``model_class(config_class(...))``, random init;
    ``base`` replaces :data:`HF_VISION_TINY_CONFIG`."""

    def build() -> nn.Module:
        from vitplasticity.utils.optional import require_transformers

        transformers = require_transformers()
        torch.manual_seed(0)
        settings = {**(HF_VISION_TINY_CONFIG if base is None else base), **config}
        return getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(n))

    return TinyModel(case_id, family, build, inputs)


def _hf_classifier(
    case_id: str, family: str, model_type: str, base: dict | None = None, **config
) -> TinyModel:
    """A tiny transformers vision tower in its classification class with a 5-way head, built as
    finetuning builds it (``vitplasticity.models.build.build_model``), random init; ``base``
    replaces :data:`HF_VISION_TINY_CONFIG`."""

    def build() -> nn.Module:
        from vitplasticity.models.build import build_model
        from vitplasticity.models.spec import HFModelSpec

        shared = HF_VISION_TINY_CONFIG if base is None else base
        settings = {"model_type": model_type, **shared, **config}
        spec = HFModelSpec(hf_id=f"tiny/{model_type}", weights="random", config=settings)
        torch.manual_seed(0)
        return build_model(spec, num_classes=5)

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(n))

    return TinyModel(case_id, family, build, inputs)


HF_SWIN_TINY_CONFIG = {
    "image_size": 32,
    "patch_size": 4,
    "embed_dim": 12,
    "depths": [2, 2],
    "num_heads": [2, 4],
    "window_size": 2,
    "attn_implementation": "eager",
}
"""A tiny transformers Swin, as :data:`TIMM_SWIN_TINY_KWARGS`: an 8 x 8 grid of width 12, a patch
merging to 4 x 4 of width 24, windows of 2 x 2 (every stage's second block shifts them)."""

HF_VISION_TINY_MODELS: list[TinyModel] = [
    _hf_vision("hf_vit", "hf_vit", "ViTModel", "ViTConfig", intermediate_size=96),
    _hf_vision(
        "hf_vit_classifier",
        "hf_vit",
        "ViTForImageClassification",
        "ViTConfig",
        intermediate_size=96,
        num_labels=5,
    ),
    _hf_vision("hf_deit", "hf_deit", "DeiTModel", "DeiTConfig", intermediate_size=96),
    _hf_vision(
        "hf_beit",
        "hf_beit",
        "BeitModel",
        "BeitConfig",
        intermediate_size=96,
        use_absolute_position_embeddings=True,
    ),
    _hf_vision(
        "hf_beit_relative",
        "hf_beit",
        "BeitModel",
        "BeitConfig",
        intermediate_size=96,
        use_relative_position_bias=True,
        use_shared_relative_position_bias=True,
    ),
    _hf_vision(
        "hf_data2vec_vision",
        "hf_data2vec_vision",
        "Data2VecVisionModel",
        "Data2VecVisionConfig",
        intermediate_size=96,
        use_relative_position_bias=True,
        use_shared_relative_position_bias=True,
        use_absolute_position_embeddings=True,
    ),
    _hf_vision("hf_dinov2", "hf_dinov2", "Dinov2Model", "Dinov2Config", mlp_ratio=2),
    _hf_vision(
        "hf_dinov2_swiglu",
        "hf_dinov2",
        "Dinov2Model",
        "Dinov2Config",
        mlp_ratio=2,
        use_swiglu_ffn=True,
    ),
    _hf_vision(
        "hf_dinov2_registers_classifier",
        "hf_dinov2",
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersConfig",
        mlp_ratio=2,
        num_register_tokens=2,
        num_labels=5,
    ),
    _hf_vision(
        "hf_dinov3",
        "hf_dinov3",
        "DINOv3ViTModel",
        "DINOv3ViTConfig",
        intermediate_size=96,
        num_register_tokens=2,
        key_bias=True,
    ),
    _hf_vision(
        "hf_dinov3_gated",
        "hf_dinov3",
        "DINOv3ViTModel",
        "DINOv3ViTConfig",
        intermediate_size=64,
        num_register_tokens=4,
        use_gated_mlp=True,
        hidden_act="silu",
    ),
    _hf_vision(
        "hf_clip_vision",
        "hf_clip_vision",
        "CLIPVisionModel",
        "CLIPVisionConfig",
        intermediate_size=96,
    ),
    _hf_vision(
        "hf_clip_vision_projection",
        "hf_clip_vision",
        "CLIPVisionModelWithProjection",
        "CLIPVisionConfig",
        intermediate_size=96,
        projection_dim=24,
    ),
    _hf_vision(
        "hf_siglip_vision",
        "hf_siglip_vision",
        "SiglipVisionModel",
        "SiglipVisionConfig",
        intermediate_size=96,
    ),
    _hf_classifier("hf_deit_classifier", "hf_deit", "deit", intermediate_size=96),
    _hf_classifier("hf_beit_classifier", "hf_beit", "beit", intermediate_size=96),
    _hf_classifier(
        "hf_data2vec_vision_classifier",
        "hf_data2vec_vision",
        "data2vec-vision",
        intermediate_size=96,
    ),
    # mask_ratio as MAE pre-trains (0.75): every stage takes every patch all the same
    _hf_classifier("hf_vit_mae_classifier", "hf_vit_mae", "vit_mae", intermediate_size=96),
    _hf_classifier("hf_dinov2_classifier", "hf_dinov2", "dinov2", mlp_ratio=2),
    _hf_classifier(
        "hf_dinov3_classifier",
        "hf_dinov3",
        "dinov3_vit",
        intermediate_size=96,
        num_register_tokens=2,
    ),
    _hf_classifier(
        "hf_clip_classifier", "hf_clip_vision", "clip_vision_model", intermediate_size=96
    ),
    _hf_classifier(
        "hf_siglip_classifier", "hf_siglip_vision", "siglip_vision_model", intermediate_size=96
    ),
]
"""The transformers vision towers (and wrappers with a classifier or projection); the
``_classifier`` ones are what finetune and recommend take."""

HF_SWIN_TINY_MODELS: list[TinyModel] = [
    _hf_classifier("hf_swin_classifier", "hf_swin", "swin", base=HF_SWIN_TINY_CONFIG),
    _hf_vision("hf_swin", "hf_swin", "SwinModel", "SwinConfig", base=HF_SWIN_TINY_CONFIG),
]
"""The transformers Swin (hierarchical: tests/models/test_swin.py), in its classification class
(what finetune takes) and bare."""


HF_TEXT_TINY_CONFIG = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,  # grouped-query attention: 3 query heads share one key/value
    "head_dim": 16,
    "intermediate_size": 96,
    "vocab_size": 64,
    "max_position_embeddings": 16,
    "attn_implementation": "eager",
}
"""A tiny decoder LM config (Llama, Mistral, Qwen, Gemma 1/2/3): 2 layers of width 48, 3 query heads
and 1 key/value head of 16, 64 token ids, 16 positions. The sliding windows below (4) are
shorter than the test sequences (12 tokens), so that a wrong per-layer mask shows."""

HF_TEXT_TINY_MODELS: dict[str, tuple[str, str, str, dict]] = {
    # id: (family, config class, model class, config beyond HF_TEXT_TINY_CONFIG)
    "llama_tiny": ("hf_llama", "LlamaConfig", "LlamaModel", {}),
    "mistral_tiny": (
        "hf_llama",
        "MistralConfig",
        "MistralModel",
        {"sliding_window": 4, "num_key_value_heads": 3},  # every layer slides; plain MHA
    ),
    "qwen2_tiny": (
        "hf_llama",
        "Qwen2Config",
        "Qwen2Model",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},  # layer 1
    ),
    "qwen3_tiny": ("hf_llama", "Qwen3Config", "Qwen3Model", {}),  # q_norm / k_norm
    "llama_causal_lm_tiny": (
        "hf_llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        {"attention_bias": True, "mlp_bias": True},  # untied lm_head, biases everywhere
    ),
    "gemma_tiny": ("hf_llama", "GemmaConfig", "GemmaModel", {}),  # Llama's layer, Gemma's norms
    "gemma2_tiny": ("hf_gemma", "Gemma2Config", "Gemma2Model", {"sliding_window": 4}),
    "gemma3_tiny": (
        "hf_gemma",
        "Gemma3TextConfig",
        "Gemma3TextModel",
        # local (sliding, rope theta 1e4) then global (full, rope theta 1e6) layer
        {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "phi3_tiny": (
        "hf_phi3",
        "Phi3Config",
        "Phi3Model",
        # fused qkv_proj and gate_up_proj, a sliding window of 4 on every layer; special token
        # ids within the 64 (Phi3's defaults are 32000, past the tiny vocabulary)
        {"sliding_window": 4, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    ),
    "olmo2_tiny": (
        "hf_olmo2",
        "Olmo2Config",
        "Olmo2Model",
        # norms after each branch, none before; q_norm / k_norm over all heads; special token
        # ids within the 64 (OLMo2's eos default is 50279, past the tiny vocabulary)
        {"pad_token_id": 0, "eos_token_id": 2},
    ),
    "mixtral_tiny": (
        "hf_moe",
        "MixtralConfig",
        "MixtralModel",
        # 4 experts of 96 hidden units (wider than the 48 of a token), 2 per token, the k weights
        # renormalised; the eager experts loop (transformers' default is grouped_mm)
        {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "eager"},
    ),
    "qwen2_moe_tiny": (
        "hf_moe",
        "Qwen2MoeConfig",
        "Qwen2MoeModel",
        # 4 experts of 16 hidden units (narrower than a token, as Qwen1.5-MoE's), 2 per token, the
        # weights not renormalised; a shared expert of 24 with its sigmoid gate; q/k/v biases; a
        # sliding window of 4 on layer 0 only
        {
            **{"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
            **{"shared_expert_intermediate_size": 24, "experts_implementation": "eager"},
            **{"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
        },
    ),
}
"""The transformers decoder LMs of the hf_llama, hf_gemma, hf_phi3, hf_olmo2 and hf_moe families,
built from their config class with :data:`HF_TEXT_TINY_CONFIG` (no hub)."""


def _hf_text(case_id: str) -> TinyModel:
    family, config_class, model_class, extra = HF_TEXT_TINY_MODELS[case_id]

    def build() -> nn.Module:
        from vitplasticity.utils.optional import require_transformers

        transformers = require_transformers()
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**{**HF_TEXT_TINY_CONFIG, **extra})
        return getattr(transformers, model_class)(config)

    def inputs(n: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(n)
        return torch.randint(0, HF_TEXT_TINY_CONFIG["vocab_size"], (n, 12), generator=generator)

    return TinyModel(case_id, family, build, inputs)


HF_PARALLEL_TINY_CONFIG = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "vocab_size": 64,
    "max_position_embeddings": 16,
    "attn_implementation": "eager",
}
"""What the tiny GPT-NeoX and Falcon configs share: 2 layers of width 48, 3 heads of 16, 64
token ids, 16 positions."""

HF_PARALLEL_TINY_MODELS: dict[str, tuple[str, str, str, dict]] = {
    # id: (family, config class, model class, config beyond HF_PARALLEL_TINY_CONFIG)
    "gpt_neox_tiny": (
        "hf_gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXModel",
        # parallel attention and MLP; rotary on half of each head (Pythia's rotary_pct 0.25)
        {"intermediate_size": 96, "rotary_pct": 0.5},
    ),
    "gpt_neox_sequential_tiny": (
        "hf_gpt_neox",
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {"intermediate_size": 96, "use_parallel_residual": False},  # untied lm_head
    ),
    "falcon_tiny": (
        "hf_falcon",
        "FalconConfig",
        "FalconModel",
        # parallel attention and MLP, ln_attn and ln_mlp, 3 query heads sharing 1 key/value
        {"new_decoder_architecture": True, "num_kv_heads": 1, "ffn_hidden_size": 96, "bias": True},
    ),
    "falcon_sequential_tiny": (
        "hf_falcon",
        "FalconConfig",
        "FalconModel",
        # one after the other, one key/value head (multi_query)
        {"parallel_attn": False, "multi_query": True, "ffn_hidden_size": 96},
    ),
}
"""The transformers decoders with parallel attention and MLP (hf_gpt_neox, hf_falcon), each in
its parallel and its sequential layout, built from their config class with
:data:`HF_PARALLEL_TINY_CONFIG` (no hub)."""


def _hf_parallel(case_id: str) -> TinyModel:
    family, config_class, model_class, extra = HF_PARALLEL_TINY_MODELS[case_id]

    def build() -> nn.Module:
        from vitplasticity.utils.optional import require_transformers

        transformers = require_transformers()
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**{**HF_PARALLEL_TINY_CONFIG, **extra})
        return getattr(transformers, model_class)(config)

    def inputs(n: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(n)
        return torch.randint(0, HF_PARALLEL_TINY_CONFIG["vocab_size"], (n, 12), generator=generator)

    return TinyModel(case_id, family, build, inputs)


ENCODER_TINY_CONFIG = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "intermediate_size": 96,
    "vocab_size": 64,
    "max_position_embeddings": 16,
    "attn_implementation": "eager",
}
"""A tiny BERT / RoBERTa / DeBERTa-v2 config: 2 post-norm layers of width 48, 3 heads, 64 token ids, 16
positions (RoBERTa's first 2 are its padding's: 14 usable)."""

HF_ENCODER_TINY_MODELS: dict[str, tuple[str, str, str, dict]] = {
    # id: (family, config class, model class, config beyond ENCODER_TINY_CONFIG)
    "bert_tiny": ("hf_bert", "BertConfig", "BertModel", {}),  # with its pooler
    # pad id 1: positions skip pad tokens
    "roberta_tiny": ("hf_bert", "RobertaConfig", "RobertaModel", {}),
    # decoder tied to the embedding
    "bert_masked_lm_tiny": ("hf_bert", "BertConfig", "BertForMaskedLM", {}),
    # DeBERTa-v3's settings: c2p and p2c terms through the content projections themselves
    # (share_att_key), distances log-bucketed beyond 4 (8 buckets; the test sequences are
    # 12 tokens), normed relative embeddings, no absolute positions
    "deberta_v2_tiny": (
        "hf_deberta_v2",
        "DebertaV2Config",
        "DebertaV2Model",
        {
            "relative_attention": True,
            "pos_att_type": ["p2c", "c2p"],
            "share_att_key": True,
            "position_buckets": 8,
            "norm_rel_ebd": "layer_norm",
            "position_biased_input": False,
        },
    ),
    # DeBERTa-v2's older settings: separate position projections (pos_key_proj,
    # pos_query_proj), distances clamped at 6 without buckets, absolute positions and token
    # types, a narrower embedding projected to the width (embed_proj); legacy MLM head, its
    # decoder tied to the word embedding
    "deberta_v2_masked_lm_tiny": (
        "hf_deberta_v2",
        "DebertaV2Config",
        "DebertaV2ForMaskedLM",
        {
            "relative_attention": True,
            "pos_att_type": ["c2p", "p2c"],
            "max_relative_positions": 6,
            "type_vocab_size": 2,
            "embedding_size": 32,
        },
    ),
}
"""The transformers post-norm encoders of the hf_bert and hf_deberta_v2 families."""


def _hf_encoder(case_id: str) -> TinyModel:
    family, config_class, model_class, extra = HF_ENCODER_TINY_MODELS[case_id]

    def build() -> nn.Module:
        from vitplasticity.utils.optional import require_transformers

        transformers = require_transformers()
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**{**ENCODER_TINY_CONFIG, **extra})
        return getattr(transformers, model_class)(config)

    def inputs(n: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(n)
        return torch.randint(0, ENCODER_TINY_CONFIG["vocab_size"], (n, 12), generator=generator)

    return TinyModel(case_id, family, build, inputs)


TINY_MODELS: list[TinyModel] = [
    _timm("vit_tiny_patch16_224", "timm_vit", patch_size=8),
    _timm("deit3_small_patch16_224", "timm_vit", patch_size=8),
    _timm("vit_base_patch16_clip_224", "timm_vit", patch_size=8),
    _timm("vit_base_patch16_siglip_224", "timm_vit", patch_size=8),
    _timm("vit_small_patch14_reg4_dinov2", "timm_vit", image=28, patch_size=7),
    _timm("vit_small_patch16_dinov3", "timm_eva"),
    _timm("vit_small_plus_patch16_dinov3", "timm_eva"),
    _timm("vit_small_patch16_dinov3_qkvb", "timm_eva"),
    _timm("eva02_tiny_patch14_224", "timm_eva", image=28),
    _timm("vit_base_patch16_rope_reg1_gap_256", "timm_eva"),
    _timm("vit_base_patch16_rope_mixed_224", "timm_eva"),
    _timm("beit_base_patch16_224", "timm_beit"),
    _timm("beitv2_base_patch16_224", "timm_beit"),
    _timm_swin(),
    _gpt2(),
    *HF_VISION_TINY_MODELS,
    *HF_SWIN_TINY_MODELS,
    *(_hf_text(case_id) for case_id in HF_TEXT_TINY_MODELS),
    *(_hf_parallel(case_id) for case_id in HF_PARALLEL_TINY_MODELS),
    *(_hf_encoder(case_id) for case_id in HF_ENCODER_TINY_MODELS),
]
"""Every family's tiny models; each family has at least one (tests/models/test_architectures.py)."""


def perturbed(model: nn.Module, seed: int = 0) -> nn.Module:
    """float64, eval, every parameter moved far from its init (norm gains around 1, biases and
    layer scales off zero), so that a swapped or missing module shows in the numbers."""
    model = model.double().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if parameter.ndim == 1:
                parameter.copy_(1.0 + 0.5 * noise)
            else:
                parameter.add_(0.1 * noise)
    return model
