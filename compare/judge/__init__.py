"""Judging parity: tolerances, tensor and loss errors, the first divergent module forward and
backward, distributions, curves, noise floors, the statistical and determinism checks, the
verdict."""
