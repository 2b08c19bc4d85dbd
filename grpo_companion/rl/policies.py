"""Policies: a tabular softmax policy and a tiny causal transformer.

Both expose the two operations Algorithm 1 needs, batched over prompts:

- ``sample(prompts, group_size, temperature=..., generator=...)`` draws
  ``group_size`` outputs per prompt and returns ``(completions, mask)`` with
  rows ordered prompt-major (row ``b * group_size + i`` is output ``i`` of
  prompt ``b``);
- ``token_logprobs(prompts, completions, group_size, temperature=...)`` returns
  the per-token log-probabilities ``(rows, tokens)`` of those completions
  under the temperature-scaled policy (TRL likewise divides the logits by the
  sampling temperature before taking log-probabilities).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: Keys and values of the positions seen so far, each ``(batch, heads, positions, head width)``.
_KV = tuple[torch.Tensor, torch.Tensor]


def _check_temperature(temperature: float) -> None:
    if not temperature > 0 or math.isinf(temperature):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


class TabularSoftmaxPolicy(nn.Module):
    """pi(o|q) = softmax(logits[q])[o]: one free logit vector per prompt.

    This is the "large enough hypothesis class" of Section 2.4: every policy
    over the ``n_outputs`` outputs of every prompt is representable, so the
    parametric iteration can reach the optimal policies of Theorems 1, 4, 8.
    Outputs are single tokens: completions have one column.
    """

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        if logits.ndim != 2:
            raise ValueError(f"logits must have shape (n_prompts, n_outputs), got "
                             f"{tuple(logits.shape)}")
        self.logits = nn.Parameter(logits.detach().clone())

    def log_probs(
        self, prompts: torch.Tensor | None = None, *, temperature: float = 1.0
    ) -> torch.Tensor:
        """Log-probabilities ``(len(prompts), n_outputs)`` (all prompts if None)."""
        logits = self.logits if prompts is None else self.logits[prompts]
        return torch.log_softmax(logits / temperature, dim=-1)

    def sample(
        self,
        prompts: torch.Tensor,
        group_size: int,
        *,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``group_size`` outputs per prompt; completions ``(rows, 1)``."""
        _check_temperature(temperature)
        with torch.no_grad():
            probs = self.log_probs(prompts, temperature=temperature).exp()
            draws = torch.multinomial(probs, group_size, replacement=True, generator=generator)
        completions = draws.reshape(-1, 1)
        return completions, torch.ones_like(completions, dtype=torch.bool)

    def token_logprobs(
        self,
        prompts: torch.Tensor,
        completions: torch.Tensor,
        group_size: int,
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Log-probabilities ``(rows, 1)`` of sampled outputs."""
        _check_temperature(temperature)
        logp = self.log_probs(prompts, temperature=temperature)
        picked = logp.gather(1, completions.reshape(len(prompts), group_size))
        return picked.reshape(-1, 1)


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extend(x, None)[0]

    def extend(self, x: torch.Tensor, past: _KV | None, *,
               siblings: bool = False) -> tuple[torch.Tensor, _KV]:
        """The block on new positions ``x (batch, length, width)``, and the keys and values so far.

        ``past`` holds the keys and values of the positions before ``x`` (None:
        ``x`` starts the sequence). Each new position attends to every past
        position and, causally, to the new ones up to itself. With
        ``siblings`` the ``length`` new entries are instead alternatives for
        one same next position: each attends to the past and to itself only.
        """
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        shape = (batch, length, self.n_heads, width // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        mask = None
        if past is not None:
            seen = past[0].shape[2]
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            if siblings:  # alternative i sees the past and key seen + i
                mask = torch.cat([torch.ones(length, seen, dtype=torch.bool, device=x.device),
                                  torch.eye(length, dtype=torch.bool, device=x.device)], dim=1)
            elif length > 1:  # query i (position seen + i) sees keys 0 .. seen + i
                mask = torch.ones(length, seen + length, dtype=torch.bool,
                                  device=x.device).tril(diagonal=seen)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              is_causal=past is None)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x)), (k, v)


class TinyCausalTransformer(nn.Module):
    """A small decoder-only (GPT-style, pre-LayerNorm) language model.

    Parameters
    ----------
    vocab_size, max_len
        Vocabulary size and the longest sequence (prompt + completion).
    d_model, n_layers, n_heads
        Width, depth and number of attention heads (``d_model % n_heads == 0``).
    eos_id, pad_id
        End-of-sequence token (ends a completion) and the filler written after
        it (masked out of every loss).
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        eos_id: int,
        pad_id: int,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("max_len", max_len),
                            ("d_model", d_model), ("n_layers", n_layers),
                            ("n_heads", n_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads={n_heads}, got {d_model}")
        self.max_len, self.eos_id, self.pad_id = max_len, eos_id, pad_id
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.position, std=0.02)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(batch, length, vocab)`` for ``tokens (batch, length)``."""
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def _extend(self, tokens: torch.Tensor, past: list[_KV] | None) -> tuple[
            torch.Tensor, list[_KV]]:
        """Final hidden states ``(batch, length, width)`` of ``tokens`` run after ``past``.

        ``past`` are the cached keys and values of the earlier positions, one pair
        per block (None: ``tokens`` start the sequence); returns them extended.
        """
        start = 0 if past is None else past[0][0].shape[2]
        x = self.embed(tokens) + self.position[start:start + tokens.shape[1]]
        caches = []
        for i, block in enumerate(self.blocks):
            x, kv = block.extend(x, None if past is None else past[i])
            caches.append(kv)
        return self.norm(x), caches

    def _extend_siblings(self, tokens: torch.Tensor, past: list[_KV]) -> tuple[
            torch.Tensor, list[_KV]]:
        """Final hidden states ``(batch, c, width)`` of ``c`` alternative next tokens per row.

        Row ``b`` of ``tokens (batch, c)`` holds ``c`` candidates for the one
        position after ``past[.][b]``; each is computed as if it alone followed
        that past. Returns the hidden states and, per block, the candidates'
        own keys and values ``(batch, heads, c, head width)``.
        """
        start = past[0][0].shape[2]
        x = self.embed(tokens) + self.position[start]
        own = []
        for i, block in enumerate(self.blocks):
            x, (k, v) = block.extend(x, past[i], siblings=True)
            own.append((k[:, :, start:], v[:, :, start:]))
        return self.norm(x), own

    def _shared_prompts(self, prompts: torch.Tensor, group_size: int) -> tuple[
            torch.Tensor, list[_KV]]:
        """Run each prompt once; its next-token logits and its cache, for each of its rows.

        The group's ``group_size`` rows share the prompt, so its positions are
        computed for one row and repeated (gradients flow back through the
        repeat, summed over the group).
        """
        hidden, past = self._extend(prompts, None)
        logits = self.head(hidden[:, -1]).repeat_interleave(group_size, dim=0)
        past = [(k.repeat_interleave(group_size, dim=0), v.repeat_interleave(group_size, dim=0))
                for k, v in past]
        return logits, past

    def sample(
        self,
        prompts: torch.Tensor,
        group_size: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``group_size`` completions per prompt (ancestral sampling).

        Returns ``(completions, mask)`` of shape ``(rows, max_new_tokens)``;
        ``mask`` is True up to and including the first EOS, and tokens after it
        are ``pad_id``. :meth:`sample_with_logprobs` also returns the
        log-probabilities of the drawn tokens.

        The prompt is run once per prompt (not once per sample), and its keys
        and values are then shared by the group's ``group_size`` rows; every
        later token is one step of each row on those cached keys and values
        (a KV cache), so no position is computed twice. The distributions are
        those of :meth:`forward` up to float rounding, drawn from the same
        random numbers as with one full forward pass per token.
        """
        completions, mask, _ = self.sample_with_logprobs(
            prompts, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
            generator=generator)
        return completions, mask

    def sample_with_logprobs(
        self,
        prompts: torch.Tensor,
        group_size: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`sample`, and the per-token log-probabilities ``(rows, max_new_tokens)``.

        The log-probabilities are those of the distributions the tokens were
        drawn from (temperature applied): :meth:`token_logprobs` of the
        completions up to float rounding, without another forward pass. After
        the first EOS they are those of ``pad_id`` and meaningless (masked).
        """
        _check_temperature(temperature)
        if prompts.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(f"max_new_tokens must be <= {self.max_len - prompts.shape[1]}, "
                             f"got {max_new_tokens}")
        rows = len(prompts) * group_size
        done = torch.zeros(rows, dtype=torch.bool, device=prompts.device)
        tokens, masks, logps = [], [], []
        with torch.no_grad():
            logits, past = self._shared_prompts(prompts, group_size)
            for step in range(max_new_tokens):
                if step:
                    hidden, past = self._extend(tokens[-1].unsqueeze(1), past)
                    logits = self.head(hidden[:, -1])
                probs = (logits / temperature).softmax(-1)
                drawn = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                drawn = torch.where(done, torch.full_like(drawn, self.pad_id), drawn)
                masks.append(~done)
                done = done | (drawn == self.eos_id)
                tokens.append(drawn)
                logp = torch.log_softmax(logits / temperature, dim=-1)
                logps.append(logp.gather(1, drawn.unsqueeze(1)).squeeze(1))
        return torch.stack(tokens, dim=1), torch.stack(masks, dim=1), torch.stack(logps, dim=1)

    def output_log_probs(
        self,
        prompts: torch.Tensor,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
        """Exact log-probability of every possible completion of each prompt.

        A completion is what :meth:`sample` can return, read up to its first
        EOS: ``l < max_new_tokens`` non-EOS tokens followed by EOS, or
        ``max_new_tokens`` non-EOS tokens and no EOS. With vocabulary ``V``
        there are ``sum_{l < T} (V-1)^l + (V-1)^T`` of them, and their
        probabilities sum to 1 for every prompt.

        The tree of prefixes is expanded one level per token on the KV cache
        (each prefix is run once, one new position per level), so the cost is
        that of ``(V-1)^(T-1)`` one-token steps per prompt, not of a forward
        pass per completion.

        Returns
        -------
        (log_probs, outputs)
            ``log_probs`` is ``(len(prompts), len(outputs))`` (float64);
            ``outputs`` lists each completion's tokens (its EOS included), in
            the order of the columns, the same for every prompt.
        """
        _check_temperature(temperature)
        if max_new_tokens < 1 or prompts.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(f"max_new_tokens must be in [1, {self.max_len - prompts.shape[1]}], "
                             f"got {max_new_tokens}")
        vocab = self.head.out_features
        others = torch.tensor([t for t in range(vocab) if t != self.eos_id], device=prompts.device)
        n_prompts, width = len(prompts), len(others)
        columns: list[torch.Tensor] = []
        outputs: list[tuple[int, ...]] = []
        prefixes: list[tuple[int, ...]] = [()]
        with torch.no_grad():
            hidden, past = self._extend(prompts, None)
            logits = self.head(hidden[:, -1])  # (prompts * prefixes, vocab), prompt-major
            prefix_logp = torch.zeros(n_prompts, 1, dtype=torch.float64, device=prompts.device)
            for level in range(max_new_tokens):
                if level:  # every prefix of this level: one of `width` children of a parent
                    rows = len(past[0][0])
                    hidden, own = self._extend_siblings(others.expand(rows, width), past)
                    logits = self.head(hidden).reshape(rows * width, vocab)
                    if level < max_new_tokens - 1:  # the children's caches, for the next level
                        past = [(torch.cat([k.repeat_interleave(width, dim=0),
                                            ok.transpose(1, 2).reshape(rows * width, -1, 1,
                                                                       ok.shape[-1])], dim=2),
                                 torch.cat([v.repeat_interleave(width, dim=0),
                                            ov.transpose(1, 2).reshape(rows * width, -1, 1,
                                                                       ov.shape[-1])], dim=2))
                                for (k, v), (ok, ov) in zip(past, own, strict=True)]
                logq = torch.log_softmax(logits.double() / temperature, dim=-1).view(
                    n_prompts, len(prefixes), vocab)
                columns.append(prefix_logp + logq[..., self.eos_id])
                outputs += [(*prefix, self.eos_id) for prefix in prefixes]
                prefix_logp = (prefix_logp.unsqueeze(2) + logq[..., others]).reshape(n_prompts, -1)
                prefixes = [(*prefix, int(t)) for prefix in prefixes for t in others]
            columns.append(prefix_logp)  # no EOS within max_new_tokens
            outputs += prefixes
        return torch.cat(columns, dim=1), outputs

    def token_logprobs(
        self,
        prompts: torch.Tensor,
        completions: torch.Tensor,
        group_size: int,
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Per-token log-probabilities ``(rows, tokens)`` of the completions.

        The same numbers as :meth:`forward` on each prompt followed by its
        completion, up to float rounding; the prompt's positions are computed
        once per prompt and shared by its ``group_size`` rows (as in
        :meth:`sample`), and the completion's positions attend to them.
        """
        _check_temperature(temperature)
        first, past = self._shared_prompts(prompts, group_size)
        logits = first.unsqueeze(1)
        if completions.shape[1] > 1:
            hidden, _ = self._extend(completions[:, :-1], past)
            logits = torch.cat([logits, self.head(hidden)], dim=1)
        logp = torch.log_softmax(logits / temperature, dim=-1)
        return logp.gather(2, completions.unsqueeze(2)).squeeze(2)
