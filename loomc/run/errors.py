"""What the executors raise: `RunError` and its kinds. The runtime maps them to HTTP-level errors.

    RunError
    ├── TargetNotBuilt              the target has no runnable back end for this yet
    ├── PolicyFailure               control code rejected its input: fail(status, message)
    ├── DispatchError               a stage call or kernel launch that cannot run as given
    │   ├── StageInputError             an input missing, unknown, or of the wrong dtype/shape
    │   ├── BindingError                a param or state array that disagrees with its declaration
    │   └── KernelArgumentError         a kernel argument that does not fit its signature
    └── VmError                     control code went wrong; the message starts with path:line:col
        ├── VmRuntimeError              a dynamic type error, a missing key, a bad index, ...
        ├── VmBudgetExceeded            instruction budget or call depth used up
        │   └── VmMemoryExceeded        a value or the call's allocations grew past their budget
        └── VmExpectFailed              an `expect` in a check block was false

`code` is the stable name `loomrt.errors` maps each kind to (and the runtime's error code);
a `PolicyFailure` carries the status its `fail` asked for, part of the language (§12).
"""

from __future__ import annotations


class RunError(Exception):
    code = "run_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message


class TargetNotBuilt(RunError):
    code = "not_implemented"


class PolicyFailure(RunError):
    """`fail(status, message)`: the status is the policy's choice, limited to 400..599 (a policy
    cannot answer 200 by failing). `path`/`line`/`column` say which `fail` it was, for logs."""

    code = "policy_failure"

    def __init__(self, status: int, message: str, *, param: str | None = None):
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"a policy failure status is an integer in 400..599, got {status!r}")
        super().__init__(message, param=param)
        self.status = status
        self.path: str | None = None
        self.line = 0
        self.column = 0


class DispatchError(RunError, ValueError):
    """A stage call or kernel launch that cannot run as given (also a ValueError, for callers
    that validate shapes generically)."""

    code = "dispatch_error"


class StageInputError(DispatchError):
    code = "stage_input_error"


class BindingError(DispatchError):
    code = "binding_error"


class KernelArgumentError(DispatchError):
    code = "kernel_argument_error"


class VmError(RunError):
    """Control code failed at run time. `locate` prefixes the source position once.

    Host functions raise these without a position; the interpreter adds the position of
    the instruction that called them. `trace` lists the active calls, innermost first,
    as "path:line:col in fn NAME" (for logs; the message names only the innermost)."""

    code = "control_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message, param=param)
        self.path: str | None = None
        self.line = 0
        self.column = 0
        self.trace: list[str] = []

    def locate(self, path: str, line: int, column: int) -> "VmError":
        if self.path is None:
            self.path, self.line, self.column = path, line, column
            self.message = f"{path}:{line}:{column}: {self.message}"
            self.args = (self.message,)
        return self


class VmRuntimeError(VmError):
    code = "control_runtime_error"


class VmBudgetExceeded(VmError):
    """A runaway policy (endless loop, runaway recursion)."""

    code = "control_budget_exceeded"


class VmMemoryExceeded(VmBudgetExceeded):
    code = "control_memory_exceeded"


class VmExpectFailed(VmError):
    code = "control_expect_failed"


__all__ = ["BindingError", "DispatchError", "KernelArgumentError", "PolicyFailure", "RunError", "StageInputError",
           "TargetNotBuilt", "VmBudgetExceeded", "VmError", "VmExpectFailed", "VmMemoryExceeded", "VmRuntimeError"]
