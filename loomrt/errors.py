"""The one error hierarchy of the runtime: every failure `loomrt` reports is a `LoomError`.

Each class fixes an HTTP `status`, an OpenAI-style `type` and a stable `code`;
instances carry the `message` (written for the client) and, where one field is to
blame, its `param`. `loomd` maps these to `{"error": {message, type, param, code}}`
in one place, and anything that is not a `LoomError` becomes a 500 there.

    LoomError                       500 internal_error
    ├── InvalidRequest              400 invalid_request_error
    ├── NotFound                    404 invalid_request_error
    │   └── LocatorNotFound             a `package:MODULE/path` locator names no installed file
    ├── Conflict                    409 invalid_request_error
    ├── Gone                        410: the registration was removed while the caller waited
    ├── PayloadTooLarge             413: a request body over the server's bound
    ├── ExpectationFailed           417: `Expect` is unsupported
    ├── CompileError                422: source that does not compile; carries every diagnostic
    ├── InvalidDecision             422: a decision request whose state or questions break the schema
    ├── TooManyRequests             429: a bounded pool (variants, observation credit) is full
    ├── NotImplementedFeature       501: the deployment does not offer this capability
    ├── Unavailable                 503: the deployment does not admit work now (drained, removing)
    │   ├── QueueFull                   its bounded pending queue is full
    │   └── DeviceMemoryExhausted       a device budget cannot fit what must be resident
    ├── PolicyFailure               4xx/5xx chosen by control code with fail(status, message)
    ├── CheckpointError             500: a checkpoint file cannot be read, or lacks a tensor
    │   └── PrepareError                a param's preparation failed or disagrees with its declaration
    ├── DispatchError               500: a stage call or kernel launch that cannot run as given
    │   ├── StageInputError             an input missing, unknown, or of the wrong dtype/shape
    │   ├── BindingError                a param or state array that disagrees with its declaration
    │   └── KernelArgumentError         a kernel argument that does not fit its signature
    └── VmError                     500: control code went wrong; the message starts with path:line:col
        ├── VmRuntimeError              a dynamic type error, a missing key, a bad index, ...
        ├── VmBudgetExceeded            instruction budget or call depth used up
        │   └── VmMemoryExceeded        a value or the call's allocations grew past their budget
        └── VmExpectFailed              an `expect` in a check block was false (loomc test only)

The executors (control VM, kernel launchers, command programs) live in `loomc.run` and
raise `loomc.run.errors.RunError`s, which know nothing of HTTP; `from_run_error` (and
`run_errors()`, the context manager the runtime wraps every executor call in) is the one
place they become the classes above: PolicyFailure, DispatchError and VmError with their
kinds, and TargetNotBuilt as NotImplementedFeature.

Control-code faults are 500s, not 400s: the policy is part of the deployed package, so
a policy that indexes null or loops forever is the package's fault, never the client's.
A policy that wants to reject a request says so with `fail(400, ...)`.
"""

from __future__ import annotations

import logging
from typing import Any

from loomc.run import errors as run


def type_for_status(status: int) -> str:
    """The OpenAI-style error type of a status class: 4xx are the client's, 5xx the server's."""
    return "invalid_request_error" if 400 <= status < 500 else "internal_error"


class LoomError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        """The HTTP error body; `loomd` renders exactly this."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequest(LoomError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class NotFound(LoomError):
    status, type, code = 404, "invalid_request_error", "not_found"


class LocatorNotFound(NotFound):
    """A `package:` locator (`loomrt.locator`) whose module is not installed or lacks the file."""

    code = "locator_not_found"


class Conflict(LoomError):
    status, type, code = 409, "invalid_request_error", "conflict"


class Gone(LoomError):
    status, type, code = 410, "invalid_request_error", "model_removed"


class PayloadTooLarge(LoomError):
    status, type, code = 413, "invalid_request_error", "request_too_large"


class ExpectationFailed(LoomError):
    status, type, code = 417, "invalid_request_error", "expectation_failed"


class CompileError(LoomError):
    """Source that does not compile. `diagnostics` are `loomc` diagnostics (file:line:col);
    the message is the summary followed by each diagnostic's header line, so the one
    string a client or log sees names every position."""

    status, type, code = 422, "invalid_request_error", "compile_error"

    def __init__(self, summary: str, diagnostics: list | tuple = (), sources: dict[str, str] | None = None):
        self.summary = summary
        self.diagnostics = list(diagnostics)
        self.sources = dict(sources or {})
        lines = [d.header() for d in self.diagnostics[:MAX_DIAGNOSTIC_LINES]]
        if len(self.diagnostics) > MAX_DIAGNOSTIC_LINES:
            lines.append(f"... and {len(self.diagnostics) - MAX_DIAGNOSTIC_LINES} more")
        super().__init__("\n".join([summary] + lines))

    def rendered(self) -> list[str]:
        """Every diagnostic with its source line and caret (for detailed records)."""
        return [d.render(self.sources.get(d.path)) for d in self.diagnostics]


MAX_DIAGNOSTIC_LINES = 20


class InvalidDecision(InvalidRequest):
    """A decision request whose questions or state break the schema (spec: 422)."""

    status, code = 422, "invalid_decision"


class TooManyRequests(LoomError):
    status, type, code = 429, "invalid_request_error", "capacity_exhausted"


class NotImplementedFeature(LoomError):
    status, type, code = 501, "invalid_request_error", "not_implemented"


class Unavailable(LoomError):
    status, type, code = 503, "internal_error", "model_unavailable"


class QueueFull(Unavailable):
    code = "queue_full"


class DeviceMemoryExhausted(Unavailable):
    code = "device_memory_exhausted"


class PolicyFailure(LoomError):
    """Control code rejected the request: `fail(status, message)`.

    The status is the policy's choice (400..599); the type follows its class. `path`/`line`/
    `column` say which `fail` it was, for logs only: the message is the policy's own and goes
    to the client unchanged."""

    status, type, code = 400, "invalid_request_error", "policy_failure"

    def __init__(self, status: int, message: str, *, param: str | None = None):
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"a policy failure status is an integer in 400..599, got {status!r}")
        super().__init__(message, param=param)
        self.status = status
        self.type = type_for_status(status)
        self.path: str | None = None
        self.line = 0
        self.column = 0


class CheckpointError(LoomError):
    """A checkpoint cannot be opened or read, or has no tensor of the name asked for.

    A deployment's weights are the package's (or operator's) business, never the client's: 500."""

    status, type, code = 500, "internal_error", "checkpoint_error"


class PrepareError(CheckpointError):
    """Weight preparation failed: a `param` got a tensor of the wrong dtype or shape, or a
    preparation function cannot apply. The message names the param, the family member and
    the checkpoint tensor(s) it was prepared from."""

    code = "prepare_error"


class DispatchError(LoomError, ValueError):
    """A stage call or kernel launch that cannot run as given. The host builds these calls, so a
    mismatch is the server's bug (or the package's), never the client's: 500. Also a ValueError,
    for callers that validate shapes generically."""

    status, type, code = 500, "internal_error", "dispatch_error"


class VmError(LoomError):
    """Control code failed at run time; the message starts with its `path:line:col`, and
    `trace` lists the active calls, innermost first (for logs)."""

    status, type, code = 500, "internal_error", "control_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message, param=param)
        self.path: str | None = None
        self.line = 0
        self.column = 0
        self.trace: list[str] = []


def _kind_of(run_kind: type, family: type[LoomError]) -> type[LoomError]:
    """The runtime class of an executor error kind: its family's status, the kind's name and code."""
    return type(run_kind.__name__, (family,), {"code": run_kind.code, "__doc__": run_kind.__doc__,
                                               "__module__": __name__})


StageInputError = _kind_of(run.StageInputError, DispatchError)
BindingError = _kind_of(run.BindingError, DispatchError)
KernelArgumentError = _kind_of(run.KernelArgumentError, DispatchError)
VmRuntimeError = _kind_of(run.VmRuntimeError, VmError)
VmBudgetExceeded = _kind_of(run.VmBudgetExceeded, VmError)  # a runaway policy: the package's fault, so 500
VmMemoryExceeded = _kind_of(run.VmMemoryExceeded, VmBudgetExceeded)
VmExpectFailed = _kind_of(run.VmExpectFailed, VmError)

# Each executor error kind and the runtime error it becomes (the most specific kind wins).
_FROM_RUN: dict[type, type[LoomError]] = {
    run.TargetNotBuilt: NotImplementedFeature, run.DispatchError: DispatchError, run.VmError: VmError,
    **{getattr(run, cls.__name__): cls for cls in (StageInputError, BindingError, KernelArgumentError,
                                                   VmRuntimeError, VmBudgetExceeded, VmMemoryExceeded,
                                                   VmExpectFailed)},
}


def from_run_error(exc: run.RunError) -> LoomError:
    """The runtime's error for an executor's: same message, param and source position."""
    if isinstance(exc, run.PolicyFailure):
        out: LoomError = PolicyFailure(exc.status, exc.message, param=exc.param)
    else:
        cls = next((_FROM_RUN[c] for c in type(exc).__mro__ if c in _FROM_RUN), LoomError)
        out = cls(exc.message, param=exc.param)
    for name in ("path", "line", "column", "trace"):
        if hasattr(exc, name):
            setattr(out, name, getattr(exc, name))
    out.__cause__ = exc
    return out


def internal_error(log: logging.Logger, what: str, exc: BaseException) -> LoomError:
    """A failure that is nobody's request's fault (a bug below us): logged with its traceback,
    returned as the 500 the client sees, which names what failed but carries no traceback."""
    log.error("%s: %s: %s", what, type(exc).__name__, exc, exc_info=exc)
    error = LoomError(f"{what}: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error


class _RunErrors:
    """`run_errors`' context manager: a class, not a generator, because it wraps every control
    call, per token and row (the generator's frame cost about 2 us of a 5-us `publish` call)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, trace: Any) -> bool:
        if kind is not None and issubclass(kind, run.RunError):
            raise from_run_error(exc) from exc
        return False


_RUN_ERRORS = _RunErrors()


def run_errors() -> _RunErrors:
    """Around a call into `loomc.run` (a policy, a stage): its errors leave as LoomErrors."""
    return _RUN_ERRORS


__all__ = [
    "BindingError", "CheckpointError", "CompileError", "Conflict", "DeviceMemoryExhausted", "DispatchError", "ExpectationFailed", "Gone",
    "InvalidDecision", "InvalidRequest", "KernelArgumentError", "LocatorNotFound", "LoomError", "NotFound", "NotImplementedFeature",
    "PayloadTooLarge", "PolicyFailure", "PrepareError", "QueueFull", "StageInputError", "TooManyRequests", "Unavailable",
    "VmBudgetExceeded", "VmError", "VmExpectFailed", "VmMemoryExceeded", "VmRuntimeError", "from_run_error",
    "internal_error", "run_errors", "type_for_status",
]
