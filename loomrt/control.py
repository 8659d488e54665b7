"""A deployment's control program as the runtime calls it: the VM of `loomc.run`, its errors mapped.

Every policy (chat, embedding, decision, sequence) calls control code through a `Control`,
so a `fail(400, ...)` reaches the client as a `PolicyFailure` and a fault of the package as
a `VmError` (500), through `loomrt.errors.run_errors` and nowhere else.
"""

from __future__ import annotations

from typing import Any

from loomc.lower.vm import VmProgram
from loomc.run.host import HostContext
from loomc.run.vm import Vm
from loomrt.errors import run_errors


class Control:
    def __init__(self, program: VmProgram, host: HostContext | None = None):
        self.program = program
        self._vm = Vm(program, host)

    def has(self, fn_name: str) -> bool:
        return self._vm.has(fn_name)

    def call(self, fn_name: str, args: list, budget: int | None = None) -> Any:
        with run_errors():
            return self._vm.call(fn_name, args, budget)


__all__ = ["Control"]
