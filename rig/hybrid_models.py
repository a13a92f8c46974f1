"""Tiny random-weight *hybrid* models (several KV-cache groups) that vLLM's CPU build runs.

Modelled on tiny_model.py: transformers `XxxForCausalLM(config).save_pretrained` in bf16 plus the
same tiny per-character tokenizer, cached under $VLLM_CONTRACT_CACHE with a done.json marker and
an atomic rename.

Kinds (KINDS):
  gemma2          sliding-window (32 tokens) + full attention layers, alternating: two attention
                  KV-cache groups. head_dim 32 (the CPU attention backend wants 32 or 64).
  granite-hybrid  GraniteMoeHybrid: Mamba2 layers + attention layers (layer_types): one Mamba
                  group and one attention group. Needs mamba_cache_mode="align" with prefix caching.
  gemma3          text-only Gemma3ForCausalLM (Gemma3TextConfig), laid out like gemma2.
  gpt-oss         GptOssForCausalLM: sliding (32) + full attention alternating, 4 bf16 experts
                  (unquantized: vLLM's CPU MoE path runs it).
  qwen3-next      Qwen3NextForCausalLM: 3 Gated DeltaNet layers + 1 gated full attention layer,
                  4 experts. GDN head_dim must be 128 (32 fails: `Unexpected head dim size`); one
                  value head and 4 KV heads of 64 for the attention layer keep vLLM's unified page
                  (GDN state vs attention KV) at a 128-token block.
  nemotron-h      NemotronHForCausalLM, layers_block_type M * - M (Mamba2, attention, MLP, Mamba2).
  falcon-h1       FalconH1ForCausalLM: attention and Mamba2 side by side in every layer.
  mamba2          Mamba2ForCausalLM: no attention, a single Mamba group.

Not here: Jamba and Mamba1 (`selective_scan_fwd` is missing from the CPU build), Bamba (vLLM falls
back to the Transformers backend, which fails).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from vllm_contract.rig.tiny_model import VOCAB, build_cached

VERSION = 1  # bump when a recipe changes; the cache key follows

_COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
               eos_token_id=2, pad_token_id=0)

KINDS: dict[str, dict] = {
    "gemma2": dict(
        config="Gemma2Config", model="Gemma2ForCausalLM",
        doc="sliding-window (32) + full attention, 4 layers alternating",
        params=dict(_COMMON, head_dim=32, num_hidden_layers=4, sliding_window=32,
                    query_pre_attn_scalar=32,
                    layer_types=["sliding_attention", "full_attention"] * 2),
    ),
    "granite-hybrid": dict(
        config="GraniteMoeHybridConfig", model="GraniteMoeHybridForCausalLM",
        doc="Mamba2 + attention (layer_types), dense MLP (no experts)",
        params=dict(_COMMON, num_hidden_layers=4, shared_intermediate_size=256,
                    num_local_experts=0, num_experts_per_tok=0,
                    layer_types=["mamba", "attention", "mamba", "attention"],
                    mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16,
                    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=64,
                    position_embedding_type="rope"),
    ),
    "gemma3": dict(
        config="Gemma3TextConfig", model="Gemma3ForCausalLM",
        doc="text-only Gemma3: sliding-window (32) + full attention, 4 layers alternating",
        params=dict(_COMMON, head_dim=32, num_hidden_layers=4, sliding_window=32,
                    query_pre_attn_scalar=32,
                    layer_types=["sliding_attention", "full_attention"] * 2),
    ),
    "gpt-oss": dict(
        config="GptOssConfig", model="GptOssForCausalLM",
        doc="gpt-oss style: sliding-window (32) + full attention alternating, 4-expert MoE (bf16)",
        params=dict(_COMMON, head_dim=32, num_hidden_layers=4, sliding_window=32,
                    num_local_experts=4, num_experts_per_tok=2,
                    layer_types=["sliding_attention", "full_attention"] * 2),
    ),
    "qwen3-next": dict(
        config="Qwen3NextConfig", model="Qwen3NextForCausalLM",
        doc="Gated DeltaNet (linear attention, head_dim 128) x3 + one gated full attention layer, "
            "4-expert MoE",
        params=dict(_COMMON | dict(num_key_value_heads=4), head_dim=64, num_hidden_layers=4,
                    layer_types=["linear_attention"] * 3 + ["full_attention"],
                    linear_key_head_dim=128, linear_value_head_dim=128,
                    linear_num_key_heads=1, linear_num_value_heads=1,
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                    shared_expert_intermediate_size=64),
    ),
    "nemotron-h": dict(
        config="NemotronHConfig", model="NemotronHForCausalLM",
        doc="Mamba2, attention and MLP layers (pattern M*-M)",
        params=dict(_COMMON, head_dim=32,
                    layers_block_type=["linear_attention", "full_attention", "mlp",
                                       "linear_attention"],
                    mamba_num_heads=8, mamba_head_dim=32, n_groups=1, ssm_state_size=16,
                    conv_kernel=4, expand=2, chunk_size=64),
    ),
    "falcon-h1": dict(
        config="FalconH1Config", model="FalconH1ForCausalLM",
        doc="every layer attention and Mamba2 in parallel, 4 layers",
        params=dict(_COMMON, num_hidden_layers=4, mamba_d_ssm=256, mamba_n_heads=8,
                    mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
                    mamba_expand=2, mamba_chunk_size=64),
    ),
    "mamba2": dict(
        config="Mamba2Config", model="Mamba2ForCausalLM",
        doc="plain Mamba2, no attention: a single Mamba group",
        params=dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4, num_heads=8,
                    head_dim=32, state_size=16, n_groups=1, expand=2, conv_kernel=4,
                    chunk_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    ),
}


def default_dir(kind: str) -> Path:
    base = os.environ.get("VLLM_CONTRACT_CACHE") or Path.home() / ".cache" / "vllm-contract"
    return Path(base) / f"tiny-{kind}-v{VERSION}"


def build(kind: str, out: Path | None = None) -> Path:
    """Build the `kind` model (and tokenizer) into `out` once; later calls return the cache."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    spec = KINDS[kind]

    def make():
        import transformers

        config = getattr(transformers, spec["config"])(**spec["params"], torch_dtype="bfloat16")
        return getattr(transformers, spec["model"])(config)

    return build_cached(Path(out) if out else default_dir(kind), make,
                        {"version": VERSION, "kind": kind, **spec["params"]})


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "gemma2"))
