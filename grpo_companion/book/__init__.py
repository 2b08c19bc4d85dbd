"""The notebook pipeline behind ``make book`` (see :mod:`grpo_companion.book.pipeline`)."""

from grpo_companion.book.pipeline import BookBuildError, BuildOptions, build

__all__ = ["BookBuildError", "BuildOptions", "build"]
