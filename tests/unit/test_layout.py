"""The package's layout holds to the rule written in docs/development.md ("One home per kind"):
the root is the public surface only, and a facade at the root holds no code.

The lists are read from the page itself, so the rule and the check cannot drift apart: a new root
module fails here until the page says where it belongs."""

from __future__ import annotations

import ast
import re

from ..conftest import ROOT

PACKAGE = ROOT / "src" / "rankscope"
PAGE = ROOT / "docs" / "development.md"


def _written(label: str) -> set[str]:
    """The names in backticks on the page's line that starts with ``label``."""
    for line in PAGE.read_text().splitlines():
        if line.startswith(label):
            return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", line))
    raise AssertionError(f"docs/development.md has no line starting with {label!r}")


def _root() -> tuple[set[str], set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    return modules, packages


def test_the_root_holds_only_the_modules_the_rule_names() -> None:
    modules, _ = _root()
    allowed = _written("**Root modules:**") | _written("**Root facades:**")
    assert modules - allowed == set(), (
        f"new root modules {sorted(modules - allowed)}: put each in the folder of its kind "
        "(docs/development.md, One home per kind), or add it to the written rule"
    )
    assert allowed - modules == set(), f"the rule names modules that do not exist: {sorted(allowed - modules)}"


def test_the_root_holds_only_the_packages_the_rule_names() -> None:
    _, packages = _root()
    written = _written("**Root packages:**")
    assert packages == written, f"on disk {sorted(packages)}, written {sorted(written)}"


def test_every_facade_is_code_free_and_re_exports_its_adapter() -> None:
    for name in sorted(_written("**Root facades:**")):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        body = tree.body
        assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), f"{name}: no docstring"
        imports = [node for node in body[1:] if isinstance(node, ast.ImportFrom)]
        assert [i.module for i in imports] == [f"integrations.{name}"] and imports[0].level == 1, name
        rest = [node for node in body[1:] if not isinstance(node, ast.ImportFrom)]
        assert len(rest) == 1 and isinstance(rest[0], ast.Assign), f"{name}: a facade holds only imports and __all__"
        target = rest[0].targets[0]
        assert isinstance(target, ast.Name) and target.id == "__all__", name
        exported = ast.literal_eval(rest[0].value)
        assert sorted(exported) == sorted(alias.asname or alias.name for alias in imports[0].names), name


def test_each_subcommand_is_one_module_of_cli() -> None:
    from rankscope.cli import app

    modules = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - {"__init__", "__main__", "app"}
    assert {m.__name__.rsplit(".", 1)[1] for m in app.SUBCOMMANDS} == modules
    parser = app.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    assert set(commands.choices) == modules


MAX_METHODS = 25
MAX_ATTRIBUTES = 27
EXEMPT: dict[str, str] = {}
"""Classes let past the caps, each named with why (``path:Class`` -> the reason): only a
configuration dataclass whose fields are options, not jobs, or a documented facade may be. None
is today: ``SinkConfig`` nests what travels together (24 fields), ``Settings`` holds 26."""


def _sizes(source: str) -> dict[str, tuple[int, int]]:
    """Each class of ``source``: (methods in its body, attributes: ``self.X`` stores and annotated fields)."""
    sizes = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        attributes = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for n in ast.walk(node):
            stored = isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
            if stored and isinstance(n.value, ast.Name) and n.value.id == "self":
                attributes.add(n.attr)
        sizes[node.name] = (len(methods), len(attributes))
    return sizes


def _class_sizes() -> dict[str, tuple[int, int]]:
    return {
        f"{path.relative_to(PACKAGE)}:{name}": size
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, size in _sizes(path.read_text()).items()
    }


def test_every_class_has_a_size() -> None:
    """No class grows past 25 methods or 27 attributes (docs/development.md, "Every class has a
    size"): a new job is a part of its own, not the capped class's neighbour growing instead."""
    sizes = _class_sizes()
    assert set(EXEMPT) <= set(sizes), f"exempt classes that no longer exist: {sorted(set(EXEMPT) - set(sizes))}"
    over = {
        name: size
        for name, size in sizes.items()
        if name not in EXEMPT and (size[0] > MAX_METHODS or size[1] > MAX_ATTRIBUTES)
    }
    assert over == {}, f"(methods, attributes) over ({MAX_METHODS}, {MAX_ATTRIBUTES}): {over}"


def test_the_size_rule_counts_what_it_says() -> None:
    """The counter itself: methods and properties, ``self`` stores anywhere in the class (once
    each) and annotated fields; a nested class is counted on its own."""
    body = "\n".join(f"    def m{i}(self):\n        self.a{i} = self.a0 = 1" for i in range(26))
    source = f"class C:\n    x: int\n{body}\n    class D:\n        def f(self):\n            pass\n"
    assert _sizes(source) == {"C": (26, 27), "D": (1, 0)}


def test_the_sink_stays_a_coordinator() -> None:
    """``Sink`` wires its parts and owns their lifecycle (docs/development.md): a new route, query
    or registry is a part of its own, not one more method here."""
    source = (PACKAGE / "sink" / "service.py").read_text()
    assert len(source.splitlines()) <= 500


def test_tests_reach_the_sinks_stages_through_its_testing_module() -> None:
    """Tests and benchmarks import ``rankscope.sink`` or ``rankscope.sink.testing``, never a stage's
    module: a re-layout of the sink changes ``sink/testing.py``, not the tests."""
    deep = {}
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        found = re.findall(r"(?:from|import) (rankscope\.sink\.[A-Za-z_.]+)", path.read_text())
        found = [m for m in found if m != "rankscope.sink.testing"]
        if found:
            deep[str(path.relative_to(ROOT))] = sorted(set(found))
    assert deep == {}, deep
