"""How big a chaos run is: the bounded, seeded form `make test` runs, or the full form
(`make chaos`), sized by environment variables.

    CHAOS_SEED    every random choice of every case derives from it (default 1: CI repeats
                  the same run; `make chaos` draws a new one and prints it)
    CHAOS_ROUNDS  rounds of the control-plane and leader cases (default 1)
    CHAOS_KILLS   operator SIGKILLs in the kill case (default 20, at least 20)
    CHAOS_JOBS    jobs in the kill case (default 4)
    CHAOS_SPECS   generated job specs (default 1000, at least 1000)
    CHAOS_ABUSE_SECONDS  how long workers abuse /progress before the honest worker stops (40)
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Chaos:
    seed: int = 1
    rounds: int = 1
    kills: int = 20
    jobs: int = 4
    specs: int = 1000
    abuse_seconds: float = 40.0

    def rng(self, case: str) -> random.Random:
        """A generator of the case's own: a case's choices do not depend on which cases ran
        before it (or on -k)."""
        return random.Random(f"{self.seed}:{case}")

    def describe(self) -> str:
        return (f"CHAOS_SEED={self.seed} CHAOS_ROUNDS={self.rounds} CHAOS_KILLS={self.kills} "
                f"CHAOS_JOBS={self.jobs} CHAOS_SPECS={self.specs} "
                f"CHAOS_ABUSE_SECONDS={self.abuse_seconds:g}")


def from_env(environ: Mapping[str, str] = os.environ) -> Chaos:
    def number(name: str, default: float, least: float) -> float:
        raw = environ.get(name, "").strip()
        value = float(raw) if raw else default
        if value < least:
            raise ValueError(f"{name}={raw} is below its minimum {least:g}")
        return value

    return Chaos(
        seed=int(number("CHAOS_SEED", 1, 0)),
        rounds=int(number("CHAOS_ROUNDS", 1, 1)),
        kills=int(number("CHAOS_KILLS", 20, 20)),
        jobs=int(number("CHAOS_JOBS", 4, 1)),
        specs=int(number("CHAOS_SPECS", 1000, 1000)),
        abuse_seconds=number("CHAOS_ABUSE_SECONDS", 40, 5),
    )
