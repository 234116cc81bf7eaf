"""TinyGPT's forward and loss over the stacked parameters of many models at once.

Model ``i`` of a stack is ``{name: stack[name][i]}``. Every op is the one
:class:`heloco.model.TinyGPT` runs, batched along a leading model axis so that each model's
slice goes through the same kernel with the same shapes: ``baddbmm``/``bmm`` run one GEMM per
slice where ``nn.Linear`` runs ``addmm``; attention folds the model axis into the batch axis;
the token table is one gathered table with per-model row offsets. Layer norm and the
cross-entropy run per model (their fused kernels reduce in an order a batched call would not
keep). So each model's loss and gradients are bit-identical to running it alone on the CPU,
which is what lets the simulator batch rounds without changing a single loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from heloco.model import ModelConfig, TinyGPT

Stack = dict[str, torch.Tensor]
"""Parameter name (as in ``TinyGPT.named_parameters()``) -> ``(models, *shape)`` tensor."""


def supports(model: torch.nn.Module) -> bool:
    """Whether :func:`stacked_losses` reproduces ``model`` (exactly a TinyGPT)."""
    return type(model) is TinyGPT


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Per-model ``x @ Wᵀ + b``: x (N, M, in), weight (N, out, in), bias (N, out)."""
    if bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per-model layer norm over the last axis (one fused kernel call per model)."""
    shape = (x.shape[-1],)
    return torch.stack(
        [
            F.layer_norm(xi, shape, wi, bi)
            for xi, wi, bi in zip(x.unbind(0), weight.unbind(0), bias.unbind(0), strict=True)
        ]
    )


def stacked_logits(cfg: ModelConfig, stack: Stack, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``(N, B·T, V)`` of the N models on their own ``(N, B, T)`` int64 tokens."""
    n, b, t = tokens.shape
    d, v = cfg.d_model, cfg.vocab_size
    if t > cfg.seq_len:
        raise ValueError(f"sequence length {t} exceeds the model's seq_len {cfg.seq_len}")
    offsets = torch.arange(n, device=tokens.device).view(n, 1, 1) * v
    x = F.embedding(tokens + offsets, stack["tok_emb.weight"].reshape(n * v, d))
    x = (x + stack["pos_emb.weight"][:, None, :t]).reshape(n, b * t, d)
    shape = (n * b, t, cfg.n_head, d // cfg.n_head)
    for layer in range(cfg.n_layer):
        p = f"blocks.{layer}."
        h = _layer_norm(x, stack[p + "ln1.weight"], stack[p + "ln1.bias"])
        qkv = _linear(h, stack[p + "attn.qkv.weight"], stack[p + "attn.qkv.bias"])
        q, k, val = (z.view(shape).transpose(1, 2) for z in qkv.view(n * b, t, 3 * d).split(d, 2))
        y = F.scaled_dot_product_attention(q, k, val, is_causal=True)
        y = y.transpose(1, 2).reshape(n, b * t, d)
        x = x + _linear(y, stack[p + "attn.proj.weight"], stack[p + "attn.proj.bias"])
        h = _layer_norm(x, stack[p + "ln2.weight"], stack[p + "ln2.bias"])
        h = F.gelu(_linear(h, stack[p + "mlp.fc.weight"], stack[p + "mlp.fc.bias"]))
        x = x + _linear(h, stack[p + "mlp.proj.weight"], stack[p + "mlp.proj.bias"])
    h = _layer_norm(x, stack["ln_f.weight"], stack["ln_f.bias"])
    return _linear(h, stack["head.weight"], None)


def stacked_losses(
    cfg: ModelConfig, stack: Stack, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Each model's mean next-token cross-entropy on its ``(B, T)`` batch: a ``(N,)`` tensor
    equal, model by model, to ``heloco.data.validation.token_cross_entropy``."""
    logits = stacked_logits(cfg, stack, inputs)
    flat = targets.reshape(targets.shape[0], -1)
    return torch.stack(
        [F.cross_entropy(li, ti) for li, ti in zip(logits.unbind(0), flat.unbind(0), strict=True)]
    )
