"""grpo_companion: the tested library behind the executable companion book to
Mroueh, *Reinforcement Learning with Verifiable Rewards: GRPO's Loss, Dynamics,
and Success Amplification* (arXiv 2503.06639).

Subpackages (import them explicitly; none is imported here, so that
``import grpo_companion`` stays cheap and does not pull in torch):

- :mod:`grpo_companion.theory`: numpy/scipy calibration weights, closed-form
  optimal policies and success-probability dynamics.
- :mod:`grpo_companion.symbolic`: SymPy derivations displayed by the book.
- :mod:`grpo_companion.rl`: PyTorch tasks, policies, GRPO losses and trainer.
- :mod:`grpo_companion.book`: the notebook pipeline (jupytext, papermill, jupyter-book).
- :mod:`grpo_companion.plotting`: the figure style shared by every chapter.
"""

__version__ = "0.1.0"
