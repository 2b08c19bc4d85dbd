"""The environment every chapter kernel runs in, owned by the pipeline.

A chapter's outputs must not depend on the shell that started the build. The
kernel inherits its parent's environment, so a caller's ``MPLBACKEND=Agg``
(which makes ``plt.show()`` draw nothing and say nothing), a ``MATPLOTLIBRC``,
a ``matplotlibrc`` in the current directory, a user's IPython profile or
startup files would all change what a notebook shows. :func:`kernel_session`
therefore starts each kernel (through the kernel manager that
:func:`kernel_session` provides) with

- its own IPython directory (a fresh ``profile_default`` whose kernel config
  selects the inline backend, PNG figures at twice the display resolution, a
  quiet kernel log, and the figure counter of :mod:`grpo_companion.book.kernel_hooks`);
- ``MPLBACKEND`` set to the inline backend and ``MATPLOTLIBRC`` pointing at the
  book's own ``matplotlibrc``, which matplotlib reads before any file in the
  current directory or the user's configuration;
- ``PYTHONHASHSEED=0``, so that set and dict orders are the same in every run.

:func:`kernel_digest` hashes all of it, together with the installed
distributions and their versions, for the cache key: a notebook executed under
other settings or other packages is executed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

INLINE_BACKEND = "module://matplotlib_inline.backend_inline"

#: The book's matplotlib configuration: only the backend. The figure style is
#: :func:`grpo_companion.plotting.use_book_style`, which every chapter calls.
MATPLOTLIBRC = f"backend: {INLINE_BACKEND}\n"

#: IPython kernel configuration of every chapter kernel.
IPYTHON_KERNEL_CONFIG = """\
c = get_config()  # noqa: F821
# PNG at twice the display resolution (sharp on high-DPI screens), shown at 1x size
c.InlineBackend.figure_formats = {"retina"}
c.InlineBackend.close_figures = True
# no "Kernel is running over TCP without encryption" on every chapter: errors only
c.IPKernelApp.log_level = "ERROR"
c.InteractiveShellApp.exec_lines = [
    "__import__('grpo_companion.book.kernel_hooks').book.kernel_hooks.install()"
]
"""

#: Variables removed from the kernel's environment because they change what a
#: notebook outputs; they are replaced by the values of :func:`kernel_environment`.
SCRUBBED = ("MPLBACKEND", "MATPLOTLIBRC", "MPLCONFIGDIR", "IPYTHONDIR", "PYTHONSTARTUP",
            "JUPYTER_CONFIG_DIR", "PYTHONHASHSEED")

#: Variables every chapter kernel gets with the same value (the others name private files).
FIXED_ENVIRONMENT = {"MPLBACKEND": INLINE_BACKEND, "PYTHONHASHSEED": "0"}

#: Environment variable naming the file where the kernel logs figures per cell.
FIGURE_LOG_VARIABLE = "GRPO_BOOK_FIGURE_LOG"


@dataclass
class KernelSession:
    """Where one kernel's private files live, and the kernel manager to start it."""

    home: Path
    manager_class: type | None = None

    @property
    def ipython_dir(self) -> Path:
        return self.home / "ipython"

    @property
    def matplotlibrc(self) -> Path:
        return self.home / "matplotlibrc"

    @property
    def kernel_log(self) -> Path:
        return self.home / "kernel.log"

    @property
    def figure_log(self) -> Path:
        return self.home / "figures.jsonl"

    def figures_created(self) -> dict[int, int]:
        """Figures created by each cell, keyed by execution count.

        Written by :mod:`grpo_companion.book.kernel_hooks` inside the kernel.
        """
        counts: dict[int, int] = {}
        if self.figure_log.exists():
            for line in self.figure_log.read_text().splitlines():
                record = json.loads(line)
                counts[int(record["execution_count"])] = int(record["figures"])
        return counts


def kernel_environment(session: KernelSession,
                       base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a chapter kernel starts with: ``base`` (default: this
    process's) without the :data:`SCRUBBED` variables, plus the book's own."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in SCRUBBED}
    env.update(FIXED_ENVIRONMENT)
    env.update({
        "MATPLOTLIBRC": str(session.matplotlibrc),
        "IPYTHONDIR": str(session.ipython_dir),
        FIGURE_LOG_VARIABLE: str(session.figure_log),
    })
    return env


def _write_files(session: KernelSession) -> None:
    profile = session.ipython_dir / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.py").write_text(IPYTHON_KERNEL_CONFIG)
    session.matplotlibrc.write_text(MATPLOTLIBRC)


@contextmanager
def kernel_session() -> Iterator[KernelSession]:
    """A private folder with the kernel's configuration, removed afterwards.

    Pass ``session.manager_class`` to papermill as ``kernel_manager_class``:
    kernels it starts get :func:`kernel_environment`, and their own stderr
    (ZMQ and IPython log lines, not the notebook's output) goes to
    ``session.kernel_log`` instead of the caller's terminal. The caller's
    environment is not modified.
    """
    with tempfile.TemporaryDirectory(prefix="grpo-kernel-") as home:
        session = KernelSession(Path(home))
        _write_files(session)
        with open(session.kernel_log, "ab") as log:
            session.manager_class = _manager_class(session, log)
            yield session


def _manager_class(session: KernelSession, log) -> type:
    from jupyter_client.manager import AsyncKernelManager

    class BookKernelManager(AsyncKernelManager):
        """Starts the kernel with the book's environment and a private stderr."""

        async def start_kernel(self, **kw):  # type: ignore[override]
            kw["env"] = kernel_environment(session)
            kw["stderr"] = log
            return await AsyncKernelManager._async_start_kernel(self, **kw)

    return BookKernelManager


def installed_distributions() -> list[str]:
    """``name==version`` of every installed distribution, sorted."""
    seen = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name:
            seen.add(f"{name}=={dist.version}")
    return sorted(seen)


def kernel_digest() -> str:
    """Hash of everything outside a notebook and the library that shapes its
    outputs: the kernel configuration, the book's matplotlibrc, the variables
    the pipeline sets and the installed distributions."""
    h = hashlib.sha256()
    for part in (IPYTHON_KERNEL_CONFIG, MATPLOTLIBRC,
                 json.dumps(FIXED_ENVIRONMENT, sort_keys=True),
                 *installed_distributions()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()
