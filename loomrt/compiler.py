"""Compile a deployment's code: a `ModelDocument`'s control, prepare and sources into runnable parts.

`compile_deployment` is what a registration's compile phase and every variant staging
run, on a worker thread. loomc checks the program exactly as `loomc check` does (package
members are read from the uploaded package, never from the disk) and compiles it into a
`CompiledModule` (stage table, preparation plans, state layout, folded configs, VM code,
command plans); this module builds the module's programs for the device's target and
records the `Contract` a variant must keep: stage declarations, the params the commands
bind (placement: name, dtype, dims, family) and the retained state layout. The runtime
reads only the module, never the compiler's syntax trees.

Failures are `CompileError` (422) carrying every diagnostic as `path:line:col`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loomc.module import UPLOAD, CompiledModule, ModuleError, build_module, package_path
from loomc.run.ahead import Progress, ahead_of_time_units, compile_ahead
from loomc.run.compile import build_programs, compile_kernels
from loomrt.document import FileRef, ModelDocument
from loomrt.errors import CompileError, run_errors
from loomrt.library_pages import release_library_pages
from loomrt.locator import resolve_locator


# The shared library that compiles and links the cpu target's kernels (numba's LLVM).
COMPILER_LIBRARY = "libllvmlite"


def code_path(ref: FileRef, namespace: str = UPLOAD) -> Path:
    """Where the loader reads a code reference: a package member, a server path or a locator's file."""
    if ref.where == "package":
        return package_path(ref.path, namespace)
    if ref.where == "locator":
        return resolve_locator(ref.path)
    return Path(ref.path)


@dataclass(frozen=True)
class Contract:
    """What executables must keep to replace each other on prepared params and retained state."""

    stages: Mapping[str, str]                 # stage name -> its declaration, printed
    params: Mapping[str, tuple]               # param name -> (dtype, dims, family) as commands bind it
    states: Mapping[str, str]                 # state name -> its layout, e.g. f32[<rows>, 8]

    @staticmethod
    def of(module: CompiledModule) -> "Contract":
        params: dict[str, tuple] = {}
        for plan in module.commands.values():
            for name, spec in plan.params.items():
                params[name] = (spec.dtype, tuple(str(d) for d in spec.dims), spec.family)
        return Contract({name: stage.declaration for name, stage in module.stages.items()}, params,
                        {name: str(spec) for name, spec in module.states.items()})

    def differences(self, other: "Contract") -> list[str]:
        """Why `other` cannot run in place of `self` (empty when it can)."""
        out = []
        for name in sorted(set(self.stages) | set(other.stages)):
            if self.stages.get(name) != other.stages.get(name):
                out.append(f"stage '{name}': the base declares {self.stages.get(name) or 'nothing'}, "
                           f"the candidate {other.stages.get(name) or 'nothing'}")
        for name in sorted(other.params):
            if name in self.params and self.params[name] != other.params[name]:
                out.append(f"param '{name}': the base places {_spec(self.params[name])}, "
                           f"the candidate binds {_spec(other.params[name])}")
            elif name not in self.params:
                out.append(f"param '{name}' is bound by the candidate but not prepared for the base")
        for name in sorted(set(self.states) | set(other.states)):
            if self.states.get(name) != other.states.get(name):
                out.append(f"state '{name}': the base retains {self.states.get(name, 'nothing')}, "
                           f"the candidate {other.states.get(name, 'nothing')}")
        return out


def _spec(spec: tuple) -> str:
    dtype, dims, family = spec
    text = f"{dtype}[{', '.join(map(str, dims))}]"
    return text + (f" for members {family[0]}..{family[1]}" if family else "")


@dataclass
class Executables:
    """One provider set compiled for a target: what a variant is, once ready."""

    module: CompiledModule
    programs: dict[str, Any]                  # stage name -> CommandProgram
    contract: Contract
    sources: tuple[str, ...]                  # the providers, as loaded (for records)
    target: str = "cpu"
    notes: list[str] = field(default_factory=list)
    #: The same providers compiled again with other host configs (an image deployment's
    #: size specializations: `rebuild({"width": 96, "height": 64})`); None where not kept.
    rebuild: Callable[[Mapping[str, int]], "Executables"] | None = field(default=None, repr=False, compare=False)

    @property
    def control(self):
        """The control program's VM code."""
        return self.module.control


#: The namespace of the registration's own package while a variant candidate is checked.
MODEL = "model"


#: The configs the host sets on a kind's programs (docs/source-contracts.md): an image source
#: is specialized for one width x height at a time and sized for the registered adapters.
def host_configs(doc: ModelDocument) -> dict[str, int]:
    if doc.kind == "image":
        return {"width": doc.width, "height": doc.height, "adapters": len(doc.loras)}
    return {}


def build_deployment(doc: ModelDocument, package: Mapping[str, bytes] | None,
                     sources: tuple[FileRef, ...] | None = None,
                     upload: Mapping[str, bytes] | None = None,
                     configs: Mapping[str, int] | None = None) -> CompiledModule:
    """The compiled module of `doc`, or of a variant candidate: `sources` replacing the
    document's own, with package references in `sources` naming members of `upload`.
    Config values: the document's, then the host's (`host_configs`), then `configs`."""
    packages: dict[str, Mapping[str, bytes]] = {}
    ns = UPLOAD
    if sources is not None:
        ns = MODEL
        if upload is not None:
            packages[UPLOAD] = upload
    if package is not None:
        packages[ns] = package
    prepare = {"primary": [code_path(doc.prepare, ns)] if doc.prepare else []}
    if sources is None:
        source_paths = [code_path(s, ns) for s in doc.sources]
    else:
        source_paths = [code_path(s, UPLOAD) for s in sources]
    for name, extra in doc.components.items():
        prepare[name] = [code_path(extra.prepare, ns)] if extra.prepare else []
        source_paths += [code_path(s, ns) for s in extra.sources]
    try:
        return build_module(doc.origin or doc.model, code_path(doc.control, ns), prepare, source_paths,
                            {**doc.config, **host_configs(doc), **(configs or {})}, packages)
    except ModuleError as exc:
        raise CompileError(f"model '{doc.model}' does not compile", exc.diagnostics, exc.sources) from None


def compile_deployment(doc: ModelDocument, package: Mapping[str, bytes] | None, *, target: str = "cpu",
                       sources: tuple[FileRef, ...] | None = None, upload: Mapping[str, bytes] | None = None,
                       cache_dir: Path | None = None, kernels_compiled: Progress | None = None,
                       configs: Mapping[str, int] | None = None) -> Executables:
    """Compile a deployment's code (or a candidate provider set) and build it for `target`,
    its kernels (the stages' and the preparations' `compute` kernels) compiled before it is
    returned, so its first request does not compile them; `kernels_compiled` is told
    (compiled, total) as they finish (`loomc.run.ahead`)."""
    module = build_deployment(doc, package, sources, upload, configs)
    with run_errors():
        programs = build_programs(module, target, cache_dir)
        preparing = [launcher for plan in module.components.values() if plan.kernels
                     for launcher in compile_kernels(dict(plan.kernels), target, cache_dir).values()]
        compile_ahead(ahead_of_time_units(programs, preparing), kernels_compiled)
    # The kernels are loaded: LLVM's code is not run again until the next compile.
    release_library_pages(COMPILER_LIBRARY)
    shown = tuple(code_path(s).as_posix() if s.where != "package" else s.path
                  for s in (sources if sources is not None else doc.sources))
    def rebuild(more: Mapping[str, int]) -> Executables:
        return compile_deployment(doc, package, target=target, sources=sources, upload=upload, cache_dir=cache_dir,
                                  configs={**(configs or {}), **more})

    # Only a kind the host specializes keeps the means to rebuild: the closure holds the
    # document's package and a candidate's upload, which staging otherwise releases.
    return Executables(module, programs, Contract.of(module), shown, target,
                       rebuild=rebuild if host_configs(doc) else None)


__all__ = ["Contract", "Executables", "build_deployment", "code_path", "compile_deployment", "host_configs"]
