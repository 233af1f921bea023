"""Caches of compiled graphs."""
