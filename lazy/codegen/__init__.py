"""Renderers of the kernel IR: one table op -> text per backend (cpp now, triton later)."""
