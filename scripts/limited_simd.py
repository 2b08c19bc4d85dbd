"""numpy's SIMD dispatch targets above its compiled baseline, for ``NPY_DISABLE_CPU_FEATURES``.

``make test`` reruns the numeric unit tests with these targets disabled, so that the
rounding of a CPU without them (numpy then runs its baseline kernels) is exercised on
every run, whatever CPU CI has. Prints the names separated by spaces; with
``--check``, exits 1 unless every dispatch target is reported off by numpy in this
process (so the step cannot silently run the full SIMD kernels).
"""

from __future__ import annotations

import os
import sys

from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        names = os.environ.get("NPY_DISABLE_CPU_FEATURES", "")
        on = [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]
        if on:
            print(f"limited SIMD not in effect: NPY_DISABLE_CPU_FEATURES={names!r}, still on: "
                  f"{' '.join(on)}", file=sys.stderr)
            return 1
        print(f"numpy runs its baseline kernels: {' '.join(__cpu_dispatch__)} off")
        return 0
    print(" ".join(__cpu_dispatch__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
