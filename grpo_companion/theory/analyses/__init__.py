"""Chapter analyses: modules that each compute the results of one chapter or reference page.

They are built on the core of :mod:`grpo_companion.theory` (calibrations, policies, the
success-probability maps, their roots and regimes) and add nothing the trainer needs; the core
never imports them. This package exports nothing itself: import each module by name, e.g.
``from grpo_companion.theory.analyses import table1``.

Modules, by the chapter they serve:

- ``surrogate``: the clipped surrogate and its contrastive form (ch. 2, The contrastive loss;
  also the errata); its clip check is shared by ``clip_bias`` and ``sample_weighting``.
- ``numerical``: the regularised objective maximised numerically against the closed-form
  policies, and a policy's success log-odds (ch. 3, Optimal policies); the error in chosen
  units by which chapters 1, 5 and 10 compare a curve with its reference.
- ``amplification``: success amplification (Theorem 3) and the fixed point near 1 (ch. 4,
  The success-probability recurrence and amplification).
- ``table1``: the recurrences of Table 1 checked row by row (ch. 5, Dynamics and stability;
  also ch. 7 and ch. 10).
- ``bifurcation``: regime maps, orbit tails and cobweb paths (ch. 5; also ch. 10).
- ``beta_sweep``: fixed points and regimes along a sweep of ``beta`` (ch. 5).
- ``contraction``: local and reference-map contraction, Theorems 6 and 7 (ch. 5).
- ``staged``: staged and moving-reference recurrences (ch. 5; also ch. 11 and the trainer's
  moving reference in exact mode).
- ``relaxed``: relaxed steps, a fraction of the exact step per iteration (ch. 8, A tiny
  language model).
- ``trained_loss``: the recurrence of the loss a sampled run trains (ch. 8).
- ``parametric``: GRPO iterations of a policy with parameters shared across prompts,
  Theorem 10 (ch. 9, The parametric gap).
- ``clipped``: clipped GRPO solved exactly (ch. 14, Beyond the paper).
- ``clip_bias``: the drift that clipping causes under random rewards (ch. 14).
- ``entropy``: policy entropy under GRPO steps (ch. 14).
- ``sample_weighting``: rank bias and the positive and negative halves of the contrastive
  loss (ch. 14).
- ``seed_statistics``: means, standard errors, t statistics and paired differences over
  seeds, for the chapters that train over several seeds (ch. 7, Bandit trainings; ch. 10;
  ch. 14).
"""
