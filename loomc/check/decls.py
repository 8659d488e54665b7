"""Top-level declarations: config values, param preparation, state scopes, stage/command contracts."""

from __future__ import annotations

import re

from loomc.check import types as T
from loomc.check.core import ConstError, Core
from loomc.check.intrinsics import PREPARE_FUNCTIONS, STATE_SCOPES
from loomc.check.kernels import signature
from loomc.check.program import ModuleInfo
from loomc.syntax import ast

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def check_config(core: Core, info: ModuleInfo, cfg: ast.Config) -> None:
    want = core.config_type(info, cfg)
    if want is None:
        core.error(info, cfg.type.span, "L0605", "a config is bool, an integer or float type, or str")
        return
    if isinstance(want, T.Scalar) and want.name in T.QUANT_TYPES:
        return
    try:
        value, got = core.const_eval(info, cfg.value)
    except ConstError:
        return
    if not core.assignable(got, want):
        code = "L0301" if isinstance(got, T.Scalar) and isinstance(want, T.Scalar) else "L0300"
        core.error(info, cfg.value.span, code, f"config '{cfg.name}' is {want}, but its value is {got}")
        return
    if isinstance(want, T.Scalar) and want.is_int:
        lo, hi = T.INT_RANGES[want.name]
        if not lo <= value <= hi:
            core.error(info, cfg.value.span, "L0605", f"{value} does not fit in {want}")


def check_param(core: Core, info: ModuleInfo, p: ast.Param) -> None:
    family_var = None
    if p.family is not None:
        family_var = p.family.var
        for bound in (p.family.start, p.family.end):
            try:
                _, t = core.const_eval(info, bound)
            except ConstError:
                continue
            if not T.is_integral(t):
                core.error(info, bound.span, "L0300", f"family bounds are integers, got {t}")
    if not isinstance(p.type, ast.TensorTypeRef):
        core.error(info, p.type.span, "L0604", "a param is a tensor: DTYPE[dims]")
    else:
        try:
            core.tensor_type(info, p.type, None)
        except ConstError:
            pass
    PrepareChecker(core, info, family_var).param_value(p)


def check_state(core: Core, info: ModuleInfo, s: ast.State) -> None:
    if s.scope not in STATE_SCOPES:
        core.error(info, s.scope_span, "L0602", f"unknown state scope '{s.scope}'",
                   notes=(f"scopes: {', '.join(STATE_SCOPES)}",))
    if not isinstance(s.type, ast.TensorTypeRef):
        core.error(info, s.type.span, "L0602", "state is a tensor: DTYPE[dims] (the per-unit shape)")
        return
    if s.type.dtype in T.QUANT_TYPES:
        core.error(info, s.type.span, "L0307", "state cannot be block-quantized; the host writes it")
        return
    try:
        core.tensor_type(info, s.type, None)
    except ConstError:
        pass


class PrepareChecker:
    """Weight preparation: checkpoint(...) composed with transpose, cast, concat, reshape, quantize, repack."""

    def __init__(self, core: Core, info: ModuleInfo, family_var: str | None):
        self.core, self.info, self.family_var = core, info, family_var

    def error(self, span: ast.Span, message: str, code: str = "L0604") -> None:
        self.core.error(self.info, span, code, message)

    def param_value(self, p: ast.Param) -> None:
        e = p.value
        if isinstance(e, ast.Call) and isinstance(e.callee, ast.Name) and e.callee.name == "compute":
            self.compute(e)
        else:
            self.tensor(e)

    def compute(self, e: ast.Call) -> None:
        """compute(KERNEL, args...): the param is the kernel's one `out` tensor, its last argument,
        run once at preparation on `args` (prepared tensors, or constant scalars)."""
        if not e.args or not isinstance(e.args[0], ast.Name):
            self.error(e.span, "compute takes a kernel name, then that kernel's arguments but its last")
            return
        sym = self.core.lookup(self.info, e.args[0].name)
        if sym is None or not isinstance(sym.item, ast.Kernel):
            self.error(e.args[0].span, f"compute needs a kernel; '{e.args[0].name}' is "
                                       f"{'not declared' if sym is None else 'not a kernel'}",
                       code="L0200" if sym is None else "L0604")
            return
        kernel = sym.item
        params = kernel.args
        if not params or params[-1].mode not in ("out", "inout") or not isinstance(params[-1].type, ast.TensorTypeRef):
            self.error(e.args[0].span, f"kernel '{kernel.name}' must end with the `out` tensor compute fills")
            return
        given = e.args[1:]
        if len(given) != len(params) - 1:
            self.error(e.span, f"kernel '{kernel.name}' takes {len(params) - 1} argument(s) before its output, "
                               f"got {len(given)}", code="L0302")
            return
        for arg, decl in zip(given, params):
            if isinstance(decl.type, ast.TensorTypeRef):
                self.tensor(arg)
                continue
            try:
                value, t = self.core.const_eval(self.info, arg)
            except ConstError:
                self.error(arg.span, f"'{decl.name}' of '{kernel.name}' is a scalar: pass a constant")
                continue
            if isinstance(t, T.Untyped):
                ok = t.kind == "int" or decl.type.name in T.FLOAT_TYPES
            else:
                ok = isinstance(t, T.Scalar) and t.name == decl.type.name
            if not ok:
                self.error(arg.span, f"'{decl.name}' of '{kernel.name}' is {decl.type.name}, got {t}", code="L0300")

    def tensor(self, e: ast.Expr) -> None:
        if not isinstance(e, ast.Call) or not isinstance(e.callee, ast.Name):
            self.error(e.span, "a param is prepared by checkpoint(...), transpose, cast, concat, reshape, quantize, "
                               "repack or compute")
            return
        name, args = e.callee.name, e.args
        if name == "compute":
            self.error(e.span, "compute(...) makes a whole param: it cannot be nested in another preparation")
            return
        if name not in PREPARE_FUNCTIONS:
            self.error(e.callee.span, f"unknown preparation '{name}'",
                       code="L0200" if self.core.lookup(self.info, name) is None else "L0604")
            return
        arity = {"checkpoint": 1, "transpose": 1, "cast": 2, "concat": 2, "reshape": 2, "quantize": 2, "repack": 2}[name]
        if len(args) != arity:
            self.error(e.span, f"{name} takes {arity} argument{'s' * (arity != 1)}, got {len(args)}", code="L0302")
            return
        if name == "checkpoint":
            self.checkpoint_name(args[0])
        elif name == "transpose":
            self.tensor(args[0])
        elif name in ("cast", "quantize"):
            self.tensor(args[0])
            t = args[1]
            ok = isinstance(t, ast.TypeName) and t.name in (T.PLAIN_QUANT_TYPES if name == "quantize" else T.NUMERIC_TYPES)
            if not ok:
                self.error(t.span, f"{name} takes a {'block-quantized' if name == 'quantize' else 'numeric'} type, "
                                   f"e.g. {'q8_0' if name == 'quantize' else 'f32'}")
        elif name == "repack":
            self.tensor(args[0])
            t = args[1]
            if not (isinstance(t, ast.TypeName) and t.name in T.PANEL_ROWS):
                self.error(t.span, f"repack takes a panel type: {', '.join(T.PANEL_ROWS)}")
        elif name == "concat":
            if not isinstance(args[0], ast.ListLit) or not args[0].items:
                self.error(args[0].span, "concat takes a non-empty list of tensors and an axis")
            else:
                for item in args[0].items:
                    self.tensor(item)
            self.integer(args[1])
        elif name == "reshape":
            self.tensor(args[0])
            if not isinstance(args[1], ast.ListLit) or not args[1].items:
                self.error(args[1].span, "reshape takes a list of dimensions")
            else:
                for d in args[1].items:
                    try:
                        self.core.dim(self.info, d, None)
                    except ConstError:
                        pass

    def integer(self, e: ast.Expr) -> None:
        try:
            _, t = self.core.const_eval(self.info, e)
        except ConstError:
            return
        if not T.is_integral(t):
            self.error(e.span, f"expected an integer, got {t}", code="L0300")

    def checkpoint_name(self, e: ast.Expr) -> None:
        if not isinstance(e, ast.StrLit):
            self.error(e.span, "checkpoint takes the tensor's name as a string literal")
            return
        unknown = [m.group(1) for m in _PLACEHOLDER.finditer(e.value) if m.group(1) != self.family_var]
        for m in _PLACEHOLDER.finditer(e.value):
            if m.group(1) != self.family_var:
                where = f"the family index is '{self.family_var}'" if self.family_var else "this param has no family index"
                self.core.error(self.info, e.span, "L0603", f"unknown placeholder '{{{m.group(1)}}}' in checkpoint name; "
                                                            f"{where}")
        if self.family_var and not unknown and "{" + self.family_var + "}" not in e.value:
            self.core.error(self.info, e.span, "L0603",
                            f"every member of family '{self.family_var}' would read the same tensor; "
                            f"put {{{self.family_var}}} in the name")


def check_stage(core: Core, info: ModuleInfo, s: ast.Stage) -> None:
    signature(core, info, s.args + (s.results or []), "stage")
    for a in s.args:
        if a.mode is not None:
            core.error(info, a.span, "L0600", "stage arguments are inputs; declare outputs after '->'")


def compare_signatures(core: Core, cmd_info: ModuleInfo, cmd: ast.Command, stage_info: ModuleInfo,
                       stage: ast.Stage) -> None:
    """A command implementing a stage must match it argument for argument and result for result."""
    where = f"stage '{stage.name}' is declared at {stage_info.path}:{stage.name_span.line}:{stage.name_span.column}"
    for label, mine, theirs in (("argument", cmd.args, stage.args), ("result", cmd.results or [], stage.results or [])):
        if len(mine) != len(theirs):
            core.error(cmd_info, cmd.name_span, "L0600",
                       f"command '{cmd.name}' has {len(mine)} {label}s but its stage declares {len(theirs)}",
                       notes=(where,))
            continue
        cmd_sig = signature(core, cmd_info, mine, "command")
        stage_sig = signature(core, stage_info, theirs, "stage")
        for (a, at), (b, bt) in zip(cmd_sig, stage_sig):
            if a.name != b.name or a.mode != b.mode or at != bt:
                core.error(cmd_info, a.span, "L0600",
                           f"{label} '{a.name}: {at}' does not match the stage's '{b.name}: {bt}'",
                           notes=(where,))
