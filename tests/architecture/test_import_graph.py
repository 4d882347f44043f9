"""The privacy core's modules import one way: no import cycle, each importable alone.

The graph is read statically from every ``import`` statement of the core's modules, including the ones inside
functions (a lazy import is still a dependency), so a cycle hidden behind a function-level import is found too.
Imports under ``if TYPE_CHECKING:`` are left out: they never run (annotations only).
A package's ``__init__`` is left out of the cycle check: it only gathers its modules' names for the public surface.
The store package's one-way rule (it imports neither the ledger facade nor the audit; the audit imports the store's
SQL module, never the ledger) is checked on what each module REACHES, ``__init__`` files included, since importing
``sage_tfx.privacy.store.sql`` runs the package's ``__init__`` first.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE_PACKAGES = ("sage_tfx.privacy", "sage_tfx.adaptive", "sage_tfx.simulate")


def _modules(packages=False):
    """The core's modules by name; with ``packages``, each package's ``__init__`` too (under the package's name)."""
    out = {}
    for package in CORE_PACKAGES:
        folder = ROOT.joinpath(*package.split("."))
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts)
            if name.endswith(".__init__"):
                if not packages:
                    continue
                name = name[: -len(".__init__")]
            out[name] = path
    return out


def _type_checking_block(node):
    """``if TYPE_CHECKING:``: imports for the type checker only (annotations), never run, so not a dependency."""
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imports(name, path, known):
    """The core modules ``name`` imports (absolute names), from its source."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found, tree = set(), ast.parse(path.read_text(), str(path))
    typing_only = {
        id(n) for block in ast.walk(tree) if _type_checking_block(block) for stmt in block.body for n in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def _cycle(graph):
    """One cycle of ``graph`` as a list of names, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_core_import_graph_has_no_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "sage_tfx.privacy.ledger" not in graph["sage_tfx.privacy.audit"], "the audit imports the ledger facade"
    assert "sage_tfx.privacy.audit" in graph["sage_tfx.privacy.ledger"]  # the one direction
    assert graph["sage_tfx.privacy.vocabulary"] == set()  # every module may import it
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def _reached(graph, start):
    """Every module importing ``start`` runs: what it imports, transitively, and the packages above each of those
    (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first)."""
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        parts = node.split(".")
        for nxt in list(graph.get(node, ())) + [".".join(parts[:i]) for i in range(1, len(parts))]:
            if nxt in graph and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    seen.discard(start)
    return seen


def test_the_store_package_and_the_audit_import_one_way():
    """The store package (every module, its ``__init__`` too) reaches neither the ledger facade nor the audit; the
    audit reaches the store's SQL module and never the ledger."""
    # the core packages' own __init__ files gather the public surface (sage_tfx.privacy's imports the ledger):
    # left out, as in the cycle check; a subpackage's __init__ (the store's) is in
    modules = {m: p for m, p in _modules(packages=True).items() if m not in CORE_PACKAGES}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    store = sorted(m for m in graph if m == "sage_tfx.privacy.store" or m.startswith("sage_tfx.privacy.store."))
    assert {
        "sage_tfx.privacy.store",
        "sage_tfx.privacy.store.base",
        "sage_tfx.privacy.store.sql",
        "sage_tfx.privacy.store.sqlite",
        "sage_tfx.privacy.store.postgres",
    } <= set(store)
    for module in store:
        reached = _reached(graph, module)
        for banned in ("sage_tfx.privacy.ledger", "sage_tfx.privacy.audit"):
            assert banned not in reached, f"{module} imports {banned} (the store must import neither)"
    assert graph["sage_tfx.privacy.store.sql"] == set(), "the SQL module imports nothing"
    audit = _reached(graph, "sage_tfx.privacy.audit")
    assert "sage_tfx.privacy.store.sql" in graph["sage_tfx.privacy.audit"]
    assert "sage_tfx.privacy.ledger" not in audit, "the audit reaches the ledger facade"
    assert "sage_tfx.privacy.store" in graph["sage_tfx.privacy.ledger"]  # the one direction


LEDGER_STEPS = (
    "streams",
    "blocks",
    "charges",
    "grants",
    "session",
    "draws",
    "anchor",
    "migrations",
)  # the facade's step modules


def test_the_ledger_facade_is_imported_only_from_above_and_its_steps_never_import_it():
    """The ledger's step modules (``LEDGER_STEPS``) reach neither the ``Ledger`` facade nor the audit; the facade
    imports each of them; no module of the core imports the facade (only the package's ``__init__`` does, for the
    public surface, and the CLI and higher layers outside the core)."""
    modules = {m: p for m, p in _modules(packages=True).items() if m not in CORE_PACKAGES}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    facade = "sage_tfx.privacy.ledger"
    for step in LEDGER_STEPS:
        module = f"sage_tfx.privacy.{step}"
        assert module in graph, f"{module} is missing"
        assert module in graph[facade], f"the facade does not import {module}"
        reached = _reached(graph, module)
        for banned in (facade, "sage_tfx.privacy.audit"):
            assert banned not in reached, f"{module} imports {banned} (a ledger step imports neither)"
    importers = sorted(m for m, targets in graph.items() if facade in targets)
    assert importers == [], f"core modules import the ledger facade: {importers}"
    init = _imports("sage_tfx.privacy", ROOT / "sage_tfx" / "privacy" / "__init__.py", _modules(packages=True))
    assert facade in init  # the public surface: sage_tfx.privacy.Ledger


BLOCK_STORE = ("layout", "sealed", "access", "staging", "store")  # sage_tfx.ingest's block store, lowest first


def test_the_block_store_modules_import_one_way():
    """The ingest block store is layered: ``layout`` (paths, names, modes) <- ``sealed`` (every encryption of a block
    file or part list) <- ``access`` (block keys) <- ``staging`` (runs in progress) <- ``store`` (writer, commit).
    Each module imports only modules before it in ``BLOCK_STORE``, lazy imports included, so no cycle hides behind
    an import inside a function."""
    folder = ROOT / "sage_tfx" / "ingest"
    modules = {f"sage_tfx.ingest.{path.stem}": path for path in sorted(folder.glob("*.py")) if path.stem != "__init__"}
    for i, name in enumerate(BLOCK_STORE):
        module = f"sage_tfx.ingest.{name}"
        below = {f"sage_tfx.ingest.{m}" for m in BLOCK_STORE[:i]}
        upward = {m for m in _imports(module, modules[module], modules) if m.split(".")[-1] in BLOCK_STORE} - below
        assert not upward, f"{module} imports {sorted(upward)}: the block store imports downwards only ({BLOCK_STORE})"


def test_the_reach_finder_follows_imports_and_parent_packages():
    graph = {"p": set(), "p.a": {"p.b"}, "p.b": set(), "q": {"p.a"}, "r": set(), "p.c": {"r"}}
    assert _reached(graph, "q") == {"p", "p.a", "p.b"}
    assert _reached(graph, "p.c") == {"p", "r"}
    assert _reached({"a": {"b"}, "b": {"a"}}, "a") == {"b"}


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m.startswith("sage_tfx.privacy.")))
def test_each_privacy_module_imports_alone_in_a_fresh_interpreter(module):
    code = f"import sys, {module}\nassert 'tensorflow' not in sys.modules, 'the privacy core imported TensorFlow'\n"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


# ---------------------------------------------------------------- the packages above the core
PACKAGE_DIRS = {
    "sage_tfx": ROOT / "sage_tfx",
    "sage_tfx.components": ROOT / "components",
    "sage_tfx.pipelines": ROOT / "pipelines",
}


def _all_modules():
    """Every product module by name, ``__init__`` files under their package's name (components/ and pipelines/ are
    installed as sage_tfx.components and sage_tfx.pipelines)."""
    out = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if package == "sage_tfx" and parts[0] in ("components", "pipelines"):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package] + parts)] = path
    return out


def _targets(name, path):
    """Every ``sage_tfx`` module name ``name`` imports, at any depth of its source (a lazy import counts)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {t for t in found if t.startswith("sage_tfx.")}


def _subpackage(name):
    """``sage_tfx.X...`` -> X (a top-level module is its own; the package's ``__init__`` is ``sage_tfx``)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_nothing_outside_the_cli_imports_the_cli():
    """The CLI is the top: no module outside ``sage_tfx.cli`` (and ``__main__``, its entry) imports it, lazily or
    not; the library carries its own vocabulary (e.g. a release session's ``SessionStatus``) and the CLI maps it."""
    offenders = sorted(
        f"{name} -> {t}"
        for name, path in _all_modules().items()
        if _subpackage(name) not in ("cli", "__main__")
        for t in _targets(name, path)
        if _subpackage(t) == "cli"
    )
    assert offenders == [], f"imports of the CLI from the library: {offenders}"


def test_no_package_cycle_among_the_subpackages():
    """sage_tfx's subpackages (privacy, adaptive, release, pipelines, simulate, demos, cli, ...) import one way,
    counting function-level imports."""
    graph = {}
    for name, path in _all_modules().items():
        here = _subpackage(name)
        graph.setdefault(here, set()).update(_subpackage(t) for t in _targets(name, path) if _subpackage(t) != here)
    graph = {k: {t for t in v if t in graph} for k, v in graph.items()}
    assert _cycle(graph) is None, f"package cycle: {' -> '.join(_cycle(graph))}"


CLI_MAX_LINES = 500  # argparse builders, option parsing and messages; library code belongs below


def test_the_cli_stays_a_thin_shell():
    """No CLI module holds a class beyond argparse's own or grows past ``CLI_MAX_LINES`` lines: sessions, runners and
    workers live in the library (sage_tfx.release, sage_tfx.pipelines, sage_tfx.adaptive)."""
    allowed_bases = {"argparse.ArgumentParser", "ArgumentParser", "Exception", "logging.Filter"}  # terminal handling
    for path in sorted((ROOT / "sage_tfx" / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        assert len(path.read_text().splitlines()) <= CLI_MAX_LINES, f"{path.name} is over {CLI_MAX_LINES} lines"
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.decorator_list:
                bases = {ast.unparse(b) for b in node.bases}
                assert bases <= allowed_bases, f"{path.name}: class {node.name} ({bases}) is library code"
