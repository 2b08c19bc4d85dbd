"""``TinyCausalTransformer``'s forward passes for ``S`` models at once, their weights stacked.

:class:`StackedTransformer` is the engine of :mod:`grpo_companion.rl.seed_batch`: it
computes the per-token log-probabilities, the sampling and the enumeration of every
output of ``S`` transformers (one per seed) in batched passes, with the arithmetic of
:class:`~grpo_companion.rl.policies.TinyCausalTransformer` (pre-LayerNorm blocks, causal
attention by ``scaled_dot_product_attention``, GELU MLP, final LayerNorm and head). It
groups the work differently (a group's rows share its prompt's keys and values; a row's
completion tokens attend to them through one mask), which changes the rounding only;
``seed_batch`` checks it against the model's own methods before every batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from grpo_companion.rl.policies import TinyCausalTransformer

#: Rows of a prompt whose completions attend to its keys in one attention block: a block of
#: ``b`` rows of ``t`` tokens is one ``(b t) x (prompt + b t)`` attention with a mask.
_BLOCK_ROWS = 16
#: Largest number of (seed, prompt, prefix) rows one enumeration pass holds.
_ENUM_ROWS = 1 << 16


class StackedTransformer:
    """``TinyCausalTransformer`` forward passes of ``S`` models at once, weights stacked.

    ``params`` maps the model's parameter names to tensors ``(S, *shape)``. Prompts are
    ``(S, N, prompt length)``; a prompt's ``R`` rows of completion tokens are
    ``(S, N, R, t)``. The arithmetic is the model's (see the module docstring).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        if type(model) is not TinyCausalTransformer:
            raise ValueError(f"the batched engine computes TinyCausalTransformer, got a "
                             f"{type(model).__name__}")
        self.n_layers = len(model.blocks)
        self.n_heads = model.blocks[0].n_heads
        self.width = model.embed.embedding_dim
        self.vocab = model.head.out_features
        self.eos, self.pad = model.eos_id, model.pad_id
        expected = {"embed.weight", "position", "norm.weight", "norm.bias", "head.weight",
                    "head.bias"}
        for i in range(self.n_layers):
            expected |= {f"blocks.{i}.{part}.{kind}" for kind in ("weight", "bias")
                         for part in ("norm1", "qkv", "proj", "norm2", "mlp.0", "mlp.2")}
        names = {name for name, _ in model.named_parameters()}
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        gelus = [m for m in model.modules() if isinstance(m, torch.nn.GELU)]
        if (names != expected or list(model.named_buffers()) or len(gelus) != self.n_layers
                or len({(m.eps, m.elementwise_affine) for m in norms}) != 1
                or len({m.approximate for m in gelus}) != 1 or not norms[0].elementwise_affine):
            raise ValueError("the batched engine mirrors TinyCausalTransformer's layout (embed, "
                             "position, pre-LayerNorm blocks qkv/proj/mlp, norm, head); this "
                             f"model has other parts: {sorted(names ^ expected)}")
        self.norm_eps, self.gelu = norms[0].eps, gelus[0].approximate
        self.others = [t for t in range(self.vocab) if t != self.eos]

    # ------------------------------------------------------------- building blocks
    @staticmethod
    def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``x (S, ..., in) @ weight[s].T + bias[s]`` for each seed ``s``."""
        shape = x.shape
        y = torch.baddbmm(bias.unsqueeze(1), x.reshape(shape[0], -1, shape[-1]),
                          weight.transpose(1, 2))
        return y.view(*shape[:-1], weight.shape[1])

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = F.layer_norm(x.reshape(shape[0], -1, shape[-1]), shape[-1:], eps=self.norm_eps)
        return (y * weight.unsqueeze(1) + bias.unsqueeze(1)).view(shape)

    def _embed(self, p: dict[str, torch.Tensor], tokens: torch.Tensor,
               start: int) -> torch.Tensor:
        """Token plus position embeddings of ``tokens (S, ..., L)`` at positions ``start..``."""
        seeds, length = tokens.shape[0], tokens.shape[-1]
        offset = torch.arange(seeds, device=tokens.device).view(seeds, *[1] * (tokens.ndim - 1))
        table = p["embed.weight"]
        x = F.embedding(tokens + offset * self.vocab, table.reshape(-1, table.shape[-1]))
        position = p["position"][:, start:start + length]
        return x + position.view(seeds, *[1] * (tokens.ndim - 2), length, -1)

    def _mlp(self, p: dict[str, torch.Tensor], i: int, x: torch.Tensor) -> torch.Tensor:
        b = f"blocks.{i}."
        h = self._norm(x, p[b + "norm2.weight"], p[b + "norm2.bias"])
        h = F.gelu(self._linear(h, p[b + "mlp.0.weight"], p[b + "mlp.0.bias"]),
                   approximate=self.gelu)
        return x + self._linear(h, p[b + "mlp.2.weight"], p[b + "mlp.2.bias"])

    def _head(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return self._linear(self._norm(x, p["norm.weight"], p["norm.bias"]), p["head.weight"],
                            p["head.bias"])

    # ------------------------------------------------------------------ passes
    def prompt_pass(self, p: dict[str, torch.Tensor], prompts: torch.Tensor) -> tuple[
            torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Next-token logits after each prompt ``(S, N, V)``, and its keys and values.

        The keys and values of each block are ``(S, N, heads, prompt length, head width)``.
        """
        seeds, n, length = prompts.shape
        heads, dh = self.n_heads, self.width // self.n_heads
        x = self._embed(p, prompts, 0)
        cache = []
        for i in range(self.n_layers):
            b = f"blocks.{i}."
            h = self._norm(x, p[b + "norm1.weight"], p[b + "norm1.bias"])
            q, k, v = (t.reshape(seeds * n, length, heads, dh).transpose(1, 2) for t in
                       self._linear(h, p[b + "qkv.weight"], p[b + "qkv.bias"]).split(
                           self.width, dim=-1))
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            attn = attn.transpose(1, 2).reshape(seeds, n, length, self.width)
            x = x + self._linear(attn, p[b + "proj.weight"], p[b + "proj.bias"])
            x = self._mlp(p, i, x)
            cache.append((k.view(seeds, n, heads, length, dh), v.view(seeds, n, heads, length,
                                                                       dh)))
        return self._head(p, x[:, :, -1]), cache

    def extend(self, p: dict[str, torch.Tensor],
               cache: list[tuple[torch.Tensor, torch.Tensor]],
               tokens: torch.Tensor, *, keep: bool = False) -> Any:
        """Logits ``(S, N, R, t, V)`` after each of the ``t`` tokens of each row.

        Row ``r`` of context ``n`` is the context followed by ``tokens[:, n, r]``; each of
        its tokens attends to the context's keys and values (``cache``, as
        :meth:`prompt_pass` returns them) and, causally, to its own row. ``_BLOCK_ROWS``
        rows of a context form one attention block whose mask keeps the rows apart. With
        ``keep``, also the rows' own keys and values, per block ``(S, N, R, heads, t,
        head width)`` (for ``_descend``).
        """
        seeds, n, rows, t = tokens.shape
        heads, dh = self.n_heads, self.width // self.n_heads
        start = cache[0][0].shape[3]
        block = min(rows, _BLOCK_ROWS)
        n_blocks = -(-rows // block)
        if n_blocks * block != rows:  # filler rows, dropped at the end
            filler = tokens.new_full((seeds, n, n_blocks * block - rows, t), self.pad)
            tokens = torch.cat([tokens, filler], dim=2)
        device = tokens.device
        row = torch.arange(block * t, device=device) // t
        pos = torch.arange(block * t, device=device) % t
        own = (row[:, None] == row[None, :]) & (pos[None, :] <= pos[:, None])
        mask = torch.cat([torch.ones(block * t, start, dtype=torch.bool, device=device), own],
                         dim=1)
        x = self._embed(p, tokens, start)  # (S, N, R', t, d)
        units = seeds * n * n_blocks
        kept = []
        for i in range(self.n_layers):
            b = f"blocks.{i}."
            past_k, past_v = cache[i]
            h = self._norm(x, p[b + "norm1.weight"], p[b + "norm1.bias"])
            q, k, v = (u.reshape(seeds, n, n_blocks, block * t, heads, dh).transpose(3, 4)
                       for u in self._linear(h, p[b + "qkv.weight"], p[b + "qkv.bias"]).split(
                           self.width, dim=-1))
            shared = (seeds, n, n_blocks, heads, start, dh)
            keys = torch.cat([past_k.unsqueeze(2).expand(shared), k], dim=4)
            values = torch.cat([past_v.unsqueeze(2).expand(shared), v], dim=4)
            attn = F.scaled_dot_product_attention(
                q.reshape(units, heads, block * t, dh),
                keys.reshape(units, heads, start + block * t, dh),
                values.reshape(units, heads, start + block * t, dh), attn_mask=mask)
            attn = attn.view(seeds, n, n_blocks, heads, block * t, dh).transpose(3, 4)
            x = x + self._linear(attn.reshape(x.shape), p[b + "proj.weight"], p[b + "proj.bias"])
            x = self._mlp(p, i, x)
            if keep:
                kept.append(tuple(
                    u.view(seeds, n, n_blocks, heads, block, t, dh).transpose(3, 4).reshape(
                        seeds, n, n_blocks * block, heads, t, dh)[:, :, :rows] for u in (k, v)))
        logits = self._head(p, x)[:, :, :rows]
        return (logits, kept) if keep else logits

    @staticmethod
    def _descend(cache: list[tuple[torch.Tensor, torch.Tensor]],
                 kept: list[tuple[torch.Tensor, torch.Tensor]]) -> list[
                     tuple[torch.Tensor, torch.Tensor]]:
        """Each row of :meth:`extend` as a context of its own: ``(S, N * R, heads, L + t, .)``."""
        out = []
        for (past_k, past_v), (own_k, own_v) in zip(cache, kept, strict=True):
            seeds, n, rows = own_k.shape[:3]
            pair = []
            for past, own in ((past_k, own_k), (past_v, own_v)):
                shared = past.unsqueeze(2).expand(seeds, n, rows, *past.shape[2:])
                pair.append(torch.cat([shared, own], dim=4).flatten(1, 2))
            out.append((pair[0], pair[1]))
        return out

    def token_logprobs(self, p: dict[str, torch.Tensor], prompts: torch.Tensor,
                       completions: torch.Tensor, group: int, temperature: float) -> torch.Tensor:
        """``TinyCausalTransformer.token_logprobs`` of each seed: ``(S, N * group, T)``."""
        seeds, n = prompts.shape[:2]
        rows, t = completions.shape[1:]
        first, cache = self.prompt_pass(p, prompts)
        logits = first.view(seeds, n, 1, 1, -1).expand(seeds, n, group, 1, self.vocab)
        if t > 1:
            later = self.extend(p, cache, completions[:, :, :-1].reshape(seeds, n, group, t - 1))
            logits = torch.cat([logits, later], dim=3)
        logp = torch.log_softmax(logits / temperature, dim=-1).reshape(seeds, rows, t, -1)
        return logp.gather(3, completions.unsqueeze(3)).squeeze(3)

    def sample(self, p: dict[str, torch.Tensor], prompts: torch.Tensor, group: int,
               generators: Sequence[torch.Generator], max_new_tokens: int,
               temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``TinyCausalTransformer.sample`` of each seed with its own generator.

        The draws are those of ``sample_with_logprobs``: at each token, ``multinomial`` on
        the seed's ``(rows, V)`` probabilities with the seed's generator, seed after seed.
        """
        seeds, n = prompts.shape[:2]
        rows = n * group
        done = torch.zeros(seeds, rows, dtype=torch.bool, device=prompts.device)
        tokens: list[torch.Tensor] = []
        masks: list[torch.Tensor] = []
        first, cache = self.prompt_pass(p, prompts)
        logits = first.repeat_interleave(group, dim=1)
        for step in range(max_new_tokens):
            if step:
                drawn_so_far = torch.stack(tokens, dim=2).view(seeds, n, group, step)
                logits = self.extend(p, cache, drawn_so_far)[:, :, :, -1].reshape(
                    seeds, rows, -1)
            probs = (logits / temperature).softmax(-1)
            drawn = torch.stack([
                torch.multinomial(probs[s].contiguous(), 1, generator=generators[s]).squeeze(1)
                for s in range(seeds)])
            drawn = torch.where(done, torch.full_like(drawn, self.pad), drawn)
            masks.append(~done)
            done = done | (drawn == self.eos)
            tokens.append(drawn)
        return torch.stack(tokens, dim=2), torch.stack(masks, dim=2)

    def output_log_probs(self, p: dict[str, torch.Tensor], prompts: torch.Tensor,
                         max_new_tokens: int, temperature: float) -> tuple[
                             torch.Tensor, list[tuple[int, ...]]]:
        """``TinyCausalTransformer.output_log_probs`` of each seed: ``(S, N, outputs)``.

        Float64, with the completions in the model's order: at each level ``l`` the prefixes
        of ``l`` non-EOS tokens (in ``itertools.product`` order) followed by EOS, then the
        ``max_new_tokens`` tokens without EOS. Prompts are taken in chunks of at most
        ``_ENUM_ROWS`` rows.
        """
        seeds, n = prompts.shape[:2]
        widest = len(self.others) ** max(max_new_tokens - 1, 0)
        chunk = max(1, _ENUM_ROWS // (seeds * widest))
        parts = [self._enumerate(p, prompts[:, i:i + chunk], max_new_tokens, temperature)
                 for i in range(0, n, chunk)]
        outputs: list[tuple[int, ...]] = []
        for level in range(max_new_tokens):
            outputs += [(*prefix, self.eos) for prefix in
                        itertools.product(self.others, repeat=level)]
        outputs += list(itertools.product(self.others, repeat=max_new_tokens))
        return torch.cat(parts, dim=1), outputs

    def _enumerate(self, p: dict[str, torch.Tensor], prompts: torch.Tensor,
                   max_new_tokens: int, temperature: float) -> torch.Tensor:
        """The prefix tree level by level, as the model expands it (each prefix run once).

        Level ``l``'s prefixes are contexts of their own (their keys and values: the
        parent's and their last token's); their children are one new token each.
        """
        seeds, n = prompts.shape[:2]
        device = prompts.device
        others = torch.tensor(self.others, device=device)
        width = len(self.others)
        logits, cache = self.prompt_pass(p, prompts)
        logits = logits.unsqueeze(2)  # (S, contexts, 1, V)
        columns = []
        prefix_logp = torch.zeros(seeds, n, 1, dtype=torch.float64, device=device)
        for level in range(max_new_tokens):
            if level:
                contexts = cache[0][0].shape[1]
                children = others.view(1, 1, width, 1).expand(seeds, contexts, width, 1)
                logits, kept = self.extend(p, cache, children, keep=True)
                logits = logits[:, :, :, -1]
                if level < max_new_tokens - 1:
                    cache = self._descend(cache, kept)
            logq = torch.log_softmax(logits.double() / temperature, dim=-1).reshape(
                seeds, n, -1, self.vocab)
            columns.append(prefix_logp + logq[..., self.eos])
            prefix_logp = (prefix_logp.unsqueeze(3) + logq[..., others]).reshape(seeds, n, -1)
        columns.append(prefix_logp)
        return torch.cat(columns, dim=2)

