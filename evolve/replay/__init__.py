"""Replaying search strategies on recorded landscapes (see docs/evolve.md, "Replay")."""
