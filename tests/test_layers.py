"""The layers import one way (ARCHITECTURE.md), and no two modules import each other."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SERVICES = {"gateway", "gpu_agent", "pool_manager"}
ALLOWED_IMPORTS = {
    "spotgate": {"spotgate"},
    **{service: {"spotgate", service} for service in SERVICES},
    "stack": {"spotgate", *SERVICES, "stack"},
    "loadtest": {"spotgate", *SERVICES, "stack", "loadtest"},
    "cli": {"spotgate", *SERVICES, "stack", "loadtest", "cli"},
}
"""What each package may import of ours: the core nothing above it, the services only the
core, whatever wires several services (`stack`, the load tests, the CLI) what is below it."""
OURS = set(ALLOWED_IMPORTS)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, ours: set[str] = OURS) -> Iterator[str]:
    """Every module of `ours` that `path` imports, at its top or inside a function."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # `from . import x` names the package's `x`
            base = package[: len(package) - node.level + 1] if node.level else []
            if node.module:
                names = [".".join([*base, node.module])]
            else:
                names = [".".join([*base, alias.name]) for alias in node.names]
        else:
            continue
        yield from (name for name in names if name.split(".")[0] in ours)


MODULES = {_module_name(path): path for package in OURS for path in (ROOT / package).rglob("*.py")}


@pytest.mark.parametrize("package", sorted(OURS))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    upward = sorted(
        f"{module} imports {imported}"
        for module, path in MODULES.items()
        if module.split(".")[0] == package
        for imported in _imports(path)
        if imported.split(".")[0] not in ALLOWED_IMPORTS[package]
    )
    assert upward == []


def _resolve(name: str) -> str | None:
    """The module an import names (`from pkg.mod import thing` names `pkg.mod`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_no_modules_import_each_other() -> None:
    graph = {
        module: {target for name in _imports(path) if (target := _resolve(name)) != module}
        for module, path in MODULES.items()
    }
    cycles = []
    for start in graph:
        # A path back to `start`, if there is one (the graph is small: a search per module).
        stack, seen = [(start, [start])], set()
        while stack:
            module, trail = stack.pop()
            for target in graph[module] - {None}:
                if target == start:
                    cycles.append(" → ".join([*trail, start]))
                elif target not in seen and target is not None:
                    seen.add(target)
                    stack.append((target, [*trail, target]))
    assert cycles == []


IO_LIBRARIES = {
    "aiohttp",
    "aioboto3",
    "boto3",
    "botocore",
    "redis",
    "prometheus_client",
    "websockets",
}
"""Libraries that do I/O (sockets, AWS, Redis, metrics exposition)."""
DECISION_MODULES = (
    "gateway.failover",
    "gateway.moves",
    "gateway.fair_queue",
    "pool_manager.policy",
    "spotgate.admission",
    "gpu_agent.drain",
)
"""Pure decisions over plain data (ARCHITECTURE.md): they run in tests and the simulator
with no I/O library loaded."""


def test_decision_modules_import_no_io_library() -> None:
    """No decision module imports an I/O library, itself or through any module of ours.

    Imports under `if TYPE_CHECKING:` are left out: they never run, only the type checker
    reads them. Imports inside functions count: they run when the function is called. A
    module's packages count too: importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py`.
    """

    def path_of(module: str) -> Path | None:
        base = ROOT.joinpath(*module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    def type_checking_only(node: ast.AST) -> bool:
        test = node.test if isinstance(node, ast.If) else None
        return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )

    def imported(module: str, path: Path) -> Iterator[str]:
        """Every name `module` imports when it runs (`from m import x`: `m` and `m.x`)."""
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        nodes: list[ast.AST] = [ast.parse(path.read_text(), str(path))]
        while nodes:
            node = nodes.pop()
            if type_checking_only(node):
                continue
            nodes.extend(ast.iter_child_nodes(node))
            if isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                yield source
                yield from (f"{source}.{alias.name}" for alias in node.names)

    def modules_run(name: str) -> list[str]:
        """The modules of ours importing `name` runs: each package on the way, and itself."""
        parts = name.split(".")
        prefixes = (".".join(parts[:end]) for end in range(1, len(parts) + 1))
        return [prefix for prefix in prefixes if path_of(prefix) is not None]

    found = []
    for decision in DECISION_MODULES:
        assert path_of(decision) is not None, decision
        trail = {module: [module] for module in modules_run(decision)}
        queue = list(trail)
        while queue:
            module = queue.pop()
            path = path_of(module)
            assert path is not None
            for name in imported(module, path):
                top = name.split(".")[0]
                if top in IO_LIBRARIES:
                    found.append(" → ".join([*trail[module], name]))
                elif top in OURS:
                    for ran in modules_run(name):
                        if ran not in trail:
                            trail[ran] = [*trail[module], ran]
                            queue.append(ran)
    assert found == []


CDK_APP = ROOT / "infra" / "cdk"
CDK_OWN = {"stacks", "app"}
"""The CDK app's own modules, imported from its directory (`cdk synth` runs there)."""
LAMBDAS = CDK_APP / "stacks" / "functions"


def _imported_names(path: Path) -> Iterator[tuple[str, str]]:
    """(module, name) for every `from module import name` in `path`."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield from ((node.module, alias.name) for alias in node.names)


def _cdk_app_modules() -> list[Path]:
    """The CDK app's code: not its tests, which check the template against the services."""
    return [
        path for path in CDK_APP.rglob("*.py") if "tests" not in path.relative_to(CDK_APP).parts
    ]


def test_the_cdk_app_imports_only_the_core_the_pool_managers_constants_and_its_own() -> None:
    ours = OURS | CDK_OWN
    wrong = sorted(
        f"{path.relative_to(ROOT)} imports {imported}"
        for path in _cdk_app_modules()
        for imported in _imports(path, ours)
        if imported.split(".")[0] not in {"spotgate", "pool_manager", *CDK_OWN}
    )
    # Of the pool manager, only the names it shares with the deployment (tags, event patterns).
    not_constants = sorted(
        f"{path.relative_to(ROOT)} imports {module}.{name}"
        for path in _cdk_app_modules()
        for module, name in _imported_names(path)
        if module.split(".")[0] == "pool_manager" and not name.isupper()
    )
    assert wrong == []
    assert not_constants == []


def test_the_lambdas_import_nothing_of_ours() -> None:
    ours = OURS | CDK_OWN
    assert (
        sorted(
            f"{path.relative_to(ROOT)} imports {imported}"
            for path in LAMBDAS.rglob("*.py")
            for imported in _imports(path, ours)
        )
        == []
    )


def _module_runs(path: Path) -> Iterator[str]:
    """The modules `path` runs as processes: `-m <module>` in a literal argument list."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List | ast.Tuple):
            words = [item.value if isinstance(item, ast.Constant) else None for item in node.elts]
            yield from (
                str(module) for flag, module in itertools.pairwise(words) if flag == "-m" and module
            )


def test_the_stack_makes_no_call_up_into_the_cli() -> None:
    calls = sorted(
        f"{path.relative_to(ROOT)} runs {module}"
        for path in (ROOT / "stack").rglob("*.py")
        for module in _module_runs(path)
        if module.split(".")[0] == "cli"
    )
    assert calls == []
