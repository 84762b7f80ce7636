"""The tensor element types the protocol carries."""
from __future__ import annotations

# Element sizes of the tensor dtypes the protocol carries (names as NumPy/ml_dtypes spell them).
DTYPE_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complex64": 8, "complex128": 16,
}

# The dtypes of the released protocol; the rest of DTYPE_ITEMSIZE is our extension, which
# the server returns only to clients that opt in (released clients cannot decode them).
RELEASED_DTYPES: frozenset[str] = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8",
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
})


def tensor_nbytes(dtype: str, shape: list[int]) -> int:
    n = DTYPE_ITEMSIZE[dtype]
    for d in shape:
        n *= d
    return n
