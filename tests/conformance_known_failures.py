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

_RESIZING_INPLACE = ("clear error: in-place addbmm_ on a self smaller than the result (every-sample run): eager cpu "
                     "resizes self, the meta kernel refuses as for any in-place op (\"output with shape [1] doesn't "
                     "match the broadcast shape [5, 10]\"), as torch.compile does")

KNOWN_FAILURES: dict = {
    ("addbmm", "float32"): _RESIZING_INPLACE,
    ("addbmm", "int64"): _RESIZING_INPLACE,
    ("sparse.sampled_addmm", "float32"): _SPARSE,
    ("sparse.mm.reduce", "float32"): _SPARSE,
    ("to_sparse", "float32"): _SPARSE,
    ("to_sparse", "int64"): _SPARSE,
    ("tensor_split", "float32"): _CPU_INDICES,
    ("tensor_split", "int64"): _CPU_INDICES,
}
