"""``python -m grpo_companion ...``: see :mod:`grpo_companion.cli`."""

from grpo_companion.cli import main

raise SystemExit(main())
