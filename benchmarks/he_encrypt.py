"""Encryption cost in ``vflbench.he``: phe's ``raw_encrypt`` against the raw-integer path, with and without CRT.

Times ``rows`` fresh encryptions per method, ``rounds`` times interleaved, and prints milliseconds per value
(median and min). docs/notes/performance_history.md records a run.

Run: .venv/bin/python benchmarks/he_encrypt.py [--bits 1024 2048] [--rows 64] [--rounds 9]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from vflbench.he import PaillierKeyHolder, PaillierOps


def methods(holder: PaillierKeyHolder, plaintexts: np.ndarray) -> dict[str, Callable[[], Any]]:
    """The three ways to encrypt ``plaintexts``."""
    public_only = PaillierOps(holder.public_key)

    def raw_no_crt() -> list[Any]:
        obf = public_only.obfuscators(len(plaintexts))
        return [public_only._embed(m) * r % public_only.n2 for m, r in zip(plaintexts.tolist(), obf, strict=True)]

    return {
        "phe raw_encrypt (public key only)": lambda: public_only.encrypt(plaintexts),
        "raw integers, no CRT": raw_no_crt,
        "raw integers, CRT (key holder)": lambda: holder.ops.encrypt(plaintexts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    for bits in args.bits:
        holder = PaillierKeyHolder(bits)
        plaintexts = np.empty(args.rows, dtype=object)
        plaintexts[:] = [secrets.randbelow(holder.n) for _ in range(args.rows)]
        timed = methods(holder, plaintexts)
        ms: dict[str, list[float]] = {k: [] for k in timed}
        for _ in range(args.rounds):
            for name, run in timed.items():
                tic = time.perf_counter()
                run()
                ms[name].append((time.perf_counter() - tic) / args.rows * 1e3)
        for name, values in ms.items():
            print(f"{bits} bits  {name}: median {statistics.median(values):.2f} ms/value, min {min(values):.2f}")


if __name__ == "__main__":
    main()
