"""cffi build script of ``transport.native._native`` (API mode: compiled C, no Python spin loops).

``pip install`` runs it through setup.py's ``cffi_modules``; during development
``python -m transport.native.build`` builds the module in place.
"""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADER = (HERE / "tp_native.h").read_text()

ffibuilder = FFI()
# cffi's cdef takes no comments or #defines with expressions: strip comments, keep the constants.
_cdef = re.sub(r"/\*.*?\*/", "", HEADER, flags=re.S)
ffibuilder.cdef(_cdef)
ffibuilder.set_source(
    "transport.native._native",
    (HERE / "tp_native.c").read_text(),
    include_dirs=[str(HERE)],
    extra_compile_args=["-O2", "-std=gnu11"],
    libraries=["rt"],
)


def build_in_place() -> str:
    """Compile next to this file (``transport/native/_native*.so``); returns its path."""
    path = str(ffibuilder.compile(tmpdir=str(HERE.parents[1]), verbose=False))
    for leftover in ("_native.c", "_native.o"):
        (HERE / leftover).unlink(missing_ok=True)
    return path


if __name__ == "__main__":
    print(build_in_place())
