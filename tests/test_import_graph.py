"""The import graph of the project's own packages, read from the source with `ast` (nothing is imported).

Two rules of docs/design.md §2, checked on every module of assets/, pipelines/, the library
(k3model/, kernels/, datagen/, envs/) and benchmarks/:
- no circle of imports, counting module-level imports (`TYPE_CHECKING` ones included) and, separately,
  function-local ones too: a function-local import may defer a heavy dependency, never hide a circle;
- dependencies point one way: the library never imports assets/, pipelines/, dagster, ray or mlflow;
  assets/ never imports pipelines/; a benchmark imports `benchmarks.common`, never another
  benchmark, and takes sizes and evaluators from the library, never from assets/ (benchmarks/README.md).

An edge A → B is an import statement in A naming module B (`from B import name`, `import B`, or
`from P import B` when P.B is a module). Circles are the strongly connected components of more than one
module (Tarjan's algorithm). `python tests/test_import_graph.py` prints the circles of both graphs.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("assets", "pipelines", "k3model", "kernels", "datagen", "envs", "benchmarks")
LIBRARY = ("k3model", "kernels", "datagen", "envs")
FRAMEWORKS = ("dagster", "ray", "mlflow")


def module_files() -> dict[str, Path]:
    """{dotted module name: file} of every .py file under PACKAGES (a package as its __init__)."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, name: str, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported module, function-local?) of every import statement in `path` (module `name`),
    resolved to a dotted name (project modules resolved to the module, others kept as written)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, local) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    # A relative import: drop `level` trailing parts (one fewer inside a package's __init__).
                    anchor = name.split(".")[: len(name.split(".")) - child.level + is_package]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    out.append((sub if sub in modules else base, local))
            visit(child, inner)

    visit(tree, False)
    return out


@functools.cache
def project_imports() -> dict[str, list[tuple[str, bool]]]:
    """`imports` of every project module (parsed once per test session)."""
    modules = module_files()
    return {name: imports(path, name, modules) for name, path in modules.items()}


def graph(function_local: bool) -> dict[str, set[str]]:
    """Edges among the project's modules; with `function_local`, imports inside functions count too."""
    found = project_imports()
    edges: dict[str, set[str]] = {m: set() for m in found}
    for name, targets in found.items():
        for target, local in targets:
            if target in edges and target != name and (function_local or not local):
                edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, each sorted (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_circles_finds_a_planted_circle_and_nothing_in_a_chain():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert circles({"a": {"b", "c"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_imports_resolve_relative_and_submodule_forms(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom k3model.train import ladder\nfrom k3model.train.evaluate import evaluate\n"
                   "def f():\n    from .grpo import train\n")
    modules = {"k3model.train.ladder": src, "k3model.train.evaluate": src, "k3model.train.grpo": src}
    assert imports(src, "k3model.train.mopd", modules) == [
        ("os", False), ("k3model.train.ladder", False), ("k3model.train.evaluate", False),
        ("k3model.train.grpo", True)]


def test_no_circle_of_module_level_imports():
    assert circles(graph(function_local=False)) == []


def test_no_circle_hidden_by_a_function_local_import():
    assert circles(graph(function_local=True)) == []


def upward_imports(layer: tuple[str, ...], above: tuple[str, ...]) -> list[str]:
    """"A → B" for every import (module-level or function-local) from a module of `layer` into `above`."""
    return sorted({f"{name} → {target}" for name, targets in project_imports().items()
                   if name.split(".")[0] in layer for target, _ in targets if target.split(".")[0] in above})


def test_the_library_imports_no_asset_pipeline_or_framework():
    assert upward_imports(LIBRARY, ("assets", "pipelines", *FRAMEWORKS)) == []


def test_assets_import_no_pipelines():
    assert upward_imports(("assets",), ("pipelines",)) == []


def test_benchmarks_import_no_other_benchmark_and_no_asset():
    others = sorted({f"{name} → {target}" for name, targets in project_imports().items() if name.startswith("benchmarks")
                     for target, _ in targets if target.startswith("benchmarks") and target != "benchmarks.common"})
    assert others == []
    assert upward_imports(("benchmarks",), ("assets",)) == []


if __name__ == "__main__":
    for local in (False, True):
        print(f"function-local imports {'counted' if local else 'not counted'}: {circles(graph(local)) or 'no circle'}")
