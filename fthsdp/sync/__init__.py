"""Gradient averaging inside a replica and across replicas (FTAR)."""
