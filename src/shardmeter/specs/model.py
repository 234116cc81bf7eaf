"""TransformerSpec: the architecture being trained, its parameter counts and FLOPs per token."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardmeter.errors import UserInputError


class MoESpec(BaseModel):
    """Mixture-of-experts MLP: `experts` routed experts, `top_k` active per token, plus shared ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    experts: int = Field(gt=1)
    top_k: int = Field(ge=1)
    shared_experts: int = Field(default=0, ge=0)
    expert_ffn: int | None = Field(default=None, gt=0)  # per-expert FFN width; None = model ffn
    dense_layers: int = Field(default=0, ge=0)  # leading layers with a dense MLP (DeepSeek-V3: 3)
    dense_ffn: int | None = Field(default=None, gt=0)  # their FFN width; None = model ffn
    # Group-limited routing (DeepSeek-V3 n_group / topk_group): experts form `n_groups` groups
    # and each token picks experts from at most `topk_groups` of them; with one group per node
    # that is node-limited routing (each token reaches at most topk_groups nodes)
    n_groups: int | None = Field(default=None, ge=1)
    topk_groups: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.experts:
            raise UserInputError("top_k", self.top_k, f"at most experts ({self.experts})")
        if (self.n_groups is None) != (self.topk_groups is None):
            raise UserInputError("topk_groups", self.topk_groups, "give n_groups and topk_groups")
        if self.n_groups is not None and self.experts % self.n_groups:
            raise UserInputError(
                "n_groups", self.n_groups, f"a divisor of experts ({self.experts})"
            )
        if (
            self.n_groups is not None
            and self.topk_groups is not None
            and self.topk_groups > self.n_groups
        ):
            raise UserInputError(
                "topk_groups", self.topk_groups, f"at most n_groups ({self.n_groups})"
            )
        return self


class MLASpec(BaseModel):
    """Multi-head latent attention (DeepSeek-V2 2024, Eqs. 9-19; DeepSeek-V3 config.json): Q, K
    and V are up-projected per head from low-rank latents (Q from the hidden state when
    `q_lora_rank` is None), plus one shared RoPE key of `qk_rope_head_dim`. Widths in elements."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    q_lora_rank: int | None = Field(default=None, gt=0)  # None: Q projected from the hidden
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)

    @property
    def latent_dim(self) -> int:
        """Per-token width of the latents the up-projections read: q_lora + kv_lora + the
        RoPE key (Q's input is the norm output, saved anyway, when there is no Q latent)."""
        return (self.q_lora_rank or 0) + self.kv_lora_rank + self.qk_rope_head_dim

    def q_input(self, hidden: int) -> int:
        """Width Q is projected from: the Q latent, or the hidden state without one."""
        return self.q_lora_rank if self.q_lora_rank is not None else hidden

    def up_params(self, n_heads: int, hidden: int) -> int:
        """Weights of the projections to Q (from `q_input`) and to K_nope, V (from the KV
        latent): q_lora·n·(nope + rope) + kv_lora·n·(nope + v) (DeepSeek-V2 Eqs. 12, 13, 16)."""
        q = self.q_input(hidden) * n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return q + self.kv_lora_rank * n_heads * (self.qk_nope_head_dim + self.v_head_dim)


class TransformerSpec(BaseModel):
    """A decoder-only transformer. Sizes are counts (layers, heads) or widths (elements)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = "custom"
    n_layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int | None = Field(default=None, gt=0)  # None = n_heads (MHA); 1 = MQA
    head_dim: int | None = Field(default=None, gt=0)  # None = hidden / n_heads
    ffn: int = Field(gt=0)  # per-branch MLP width
    # gelu: any 2-matrix MLP with a one-pass activation (GELU, ReLU); swiglu: 3-matrix gated;
    # relu2: 2-matrix squared ReLU, relu(x)² (Nemotron-4), which some stacks run as two eager ops
    mlp: Literal["gelu", "swiglu", "relu2"] = "gelu"
    # the norm's kind decides only what an eager (unfused) norm saves (estimate/memory.py)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    vocab: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    tied_embeddings: bool = False
    moe: MoESpec | None = None
    # MLA's latent shapes (None = standard attention); the weights and FLOPs stay those of the
    # same-weight GQA shape above (shardmeter.specs.hf.gqa_equivalent)
    mla: MLASpec | None = None

    @model_validator(mode="after")
    def _check(self) -> TransformerSpec:
        if self.head_dim is None and self.hidden % self.n_heads:
            allowed = f"a multiple of n_heads ({self.n_heads}), or give head_dim"
            raise UserInputError("hidden", self.hidden, allowed)
        if self.n_heads % self.kv_heads:
            raise UserInputError(
                "n_kv_heads", self.kv_heads, f"a divisor of n_heads ({self.n_heads})"
            )
        if self.moe is not None and self.moe.dense_layers > self.n_layers:
            allowed = f"at most n_layers ({self.n_layers})"
            raise UserInputError("moe.dense_layers", self.moe.dense_layers, allowed)
        return self

    # --- shapes ---------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.n_heads

    @property
    def q_dim(self) -> int:
        """Width of the query projection (= hidden for standard models)."""
        return self.n_heads * self.dim_head

    @property
    def kv_dim(self) -> int:
        """Width of each of the K and V projections (GQA/MQA shrink it)."""
        return self.kv_heads * self.dim_head

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP: 2 for GELU and squared ReLU (up, down), 3 for SwiGLU
        (gate, up, down)."""
        return 3 if self.mlp == "swiglu" else 2

    # --- parameter counts (weights only; biases and norms are < 0.1% and ignored) ----------
    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and output projections: h·q + 2·h·kv + q·h."""
        return 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim

    def _mlp_params(self, width: int) -> int:
        return self.mlp_matrices * self.hidden * width

    @property
    def n_moe_layers(self) -> int:
        return 0 if self.moe is None else self.n_layers - self.moe.dense_layers

    @property
    def n_dense_layers(self) -> int:
        return self.n_layers - self.n_moe_layers

    @property
    def dense_ffn(self) -> int:
        if self.moe is not None and self.moe.dense_ffn is not None:
            return self.moe.dense_ffn
        return self.ffn

    @property
    def expert_ffn(self) -> int:
        if self.moe is not None and self.moe.expert_ffn is not None:
            return self.moe.expert_ffn
        return self.ffn

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert MLP."""
        return self._mlp_params(self.expert_ffn)

    def _mlp_params_counting(self, routed: int) -> int:
        """MLP weights of all layers with `routed` routed experts per MoE layer, plus its shared
        experts and its router (h·E)."""
        dense = self.n_dense_layers * self._mlp_params(self.dense_ffn)
        if self.moe is None:
            return dense
        per_layer = (
            routed + self.moe.shared_experts
        ) * self.expert_params + self.hidden * self.moe.experts
        return dense + self.n_moe_layers * per_layer

    @property
    def mlp_params_total(self) -> int:
        """All MLP weights: dense layers, and for MoE layers every expert, shared ones and router."""
        return self._mlp_params_counting(self.moe.experts if self.moe is not None else 0)

    @property
    def mlp_params_active(self) -> int:
        """MLP weights one token touches: top-k plus shared experts, and the router."""
        return self._mlp_params_counting(self.moe.top_k if self.moe is not None else 0)

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the untied output head (V·h each)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params_non_embedding(self) -> int:
        return self.n_layers * self.attn_params_per_layer + self.mlp_params_total

    @property
    def params_total(self) -> int:
        return self.params_non_embedding + self.embedding_params

    @property
    def params_active(self) -> int:
        """Parameters used per token (= params_total for dense models)."""
        return (
            self.n_layers * self.attn_params_per_layer
            + self.mlp_params_active
            + self.embedding_params
        )

    # --- FLOPs per token --------------------------------------------------------------------
    def matmul_flops_per_token(self) -> int:
        """Forward FLOPs per token of all weight matmuls incl. the logits: 2 per active weight.

        Kaplan et al. 2020, Table 1 (C_forward ≈ 2N); the input embedding is a lookup, not a matmul.
        """
        logits = self.vocab * self.hidden
        return 2 * (self.params_active - self.embedding_params + logits)

    def attention_flops_per_token(self, causal: bool = True) -> float:
        """Forward FLOPs per token of the score and value matmuls (QKᵀ and AV).

        Kaplan et al. 2020, Table 1: 2·n_layer·n_ctx·d_attn per matmul pair; with a causal mask
        flash-attention kernels skip about half (factor 1/2).
        """
        full = 4.0 * self.n_layers * self.seq_len * self.q_dim
        return full / 2 if causal else full

    def training_flops_per_token(self, causal: bool = True) -> float:
        """Model FLOPs per trained token: 3 × forward (backward ≈ 2 × forward), Kaplan et al. 2020."""
        return 3.0 * (self.matmul_flops_per_token() + self.attention_flops_per_token(causal))
