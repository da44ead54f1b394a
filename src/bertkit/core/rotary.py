"""ModernBERT's attention pieces: rotary positions (RoFormer's, as ModernBERT turns queries
and keys) and sliding-window attention computed chunk by chunk. The encoder (`core.model`)
uses them on the padded grid, `TokenLayout.attend` (`core.unpad`) sequence by sequence."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rotary_tables(seq_len: int, head_size: int, theta: float, device: torch.device | str
                  ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(cos, sin), each (S, D) in fp32: rotary positions of base `theta` (RoFormer's, as
    ModernBERT computes them: frequencies theta^(-2i/D), the head's two halves turned)."""
    rates = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float) / head_size))
    angles = torch.arange(seq_len, device=device).float()[:, None] * rates.to(device)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotated(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x (B, A, S, D) turned by the rotary tables, in fp32 and back to x's dtype."""
    cos, sin = rotary
    half = x.shape[-1] // 2
    wide = x.float()
    turned = torch.cat((-wide[..., half:], wide[..., :half]), dim=-1)
    return (wide * cos + turned * sin).to(x.dtype)


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None, reach: int, scale: float, dropout_p: float,
                     training: bool) -> torch.Tensor:  # fmt: skip
    """Attention of (B, A, S, D) queries to the keys at most `reach` positions away (a sliding
    window, ModernBERT's local layers), chunk by chunk: the queries in chunks of `reach`, each
    against its own chunk and one each side (every key it may see), so the scores are
    (S, 3 reach) a head, not (S, S). `mask` (B, 1, 1, S) True at real keys, or None. Scores
    and softmax in fp32, the weighted sum in v's dtype. -> (B, A, S, D)"""
    batch, heads, seq_len, size = q.shape
    chunk = max(reach, 1)
    count = -(-seq_len // chunk)
    tail = count * chunk - seq_len
    queries = F.pad(q.float(), (0, 0, 0, tail)).view(batch, heads, count, chunk, size)

    def windows(t: torch.Tensor) -> torch.Tensor:  # (B, A, S, D) -> (B, A, count, 3 chunk, D)
        padded = F.pad(t, (0, 0, chunk, chunk + tail))
        return padded.unfold(2, 3 * chunk, chunk).transpose(-1, -2)

    keys, values = windows(k.float()), windows(v)
    query_at = torch.arange(count * chunk, device=q.device).view(count, chunk, 1)
    key_at = (torch.arange(count, device=q.device).view(count, 1, 1) * chunk - chunk
              + torch.arange(3 * chunk, device=q.device).view(1, 1, -1))  # fmt: skip
    allowed = ((query_at - key_at).abs() <= reach) & (key_at >= 0) & (key_at < seq_len)
    allowed = allowed[None, None]  # (1, 1, count, chunk, 3 chunk)
    if mask is not None:
        real = F.pad(mask.reshape(batch, seq_len), (chunk, chunk + tail))
        real = real.unfold(1, 3 * chunk, chunk)[:, None, :, None, :]  # (B, 1, count, 1, 3c)
        allowed = allowed & real
    scores = (queries * scale) @ keys.transpose(-1, -2)  # (B, A, count, chunk, 3 chunk)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    if dropout_p > 0.0 and training:
        probs = F.dropout(probs, dropout_p, True)
    context = probs.to(v.dtype) @ values  # (B, A, count, chunk, D)
    return context.reshape(batch, heads, count * chunk, size)[:, :, :seq_len]
