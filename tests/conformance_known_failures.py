"""Known failures of the OpInfo conformance suite (tests/test_conformance.py).

Keys are ``(OpInfo name[.variant], dtype)``; the value says why, starting with its category:
- ``"clear error: ..."``: lazy raises an error that names the problem and the fix (acceptable).
- ``"unclear error: ..."``: lazy raises, but the message does not help the user (a bug to fix).
- ``"skip: ..."``: not run at all (say why).
A wrong result is never a known failure: the test fails on any mismatch, listed here or not.
"""

_SPARSE = "clear error: sparse layouts are not held by the lazy device (UnsupportedLayout says: keep them on the cpu)"
_CPU_INDICES = ("clear error: eager's own check, as on any non-cpu device: tensor_split wants its index tensor on the "
                "cpu (the split sizes decide output shapes)")

KNOWN_FAILURES: dict = {
    ("sparse.sampled_addmm", "float32"): _SPARSE,
    ("sparse.mm.reduce", "float32"): _SPARSE,
    ("to_sparse", "float32"): _SPARSE,
    ("to_sparse", "int64"): _SPARSE,
    ("tensor_split", "float32"): _CPU_INDICES,
    ("tensor_split", "int64"): _CPU_INDICES,
}
