"""`.loombc`: the binary twin of a checked `.loom` module (DESIGN §2; layout in `format.py`).

`write_module` encodes a module's AST; `read_module` rebuilds exactly the AST that
parsing the `dis` text would give, spans included, or raises `LoomBytecodeError`.
`loomc build` and `loomc dis` live in `cli.py`; `Program.load` reads `.loombc` files
wherever it reads `.loom`.
"""

from loomc.bytecode.errors import LoomBytecodeEncodeError, LoomBytecodeError
from loomc.bytecode.files import read_bytecode_file, write_atomically
from loomc.bytecode.format import SUFFIX
from loomc.bytecode.reader import read_module
from loomc.bytecode.writer import write_module

__all__ = [
    "SUFFIX",
    "LoomBytecodeEncodeError",
    "LoomBytecodeError",
    "read_bytecode_file",
    "read_module",
    "write_atomically",
    "write_module",
]
