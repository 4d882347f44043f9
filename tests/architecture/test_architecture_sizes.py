"""Product files and functions stay small enough to read: one concept per module, named steps per function.

Product code is ``sage_tfx/``, ``components/`` and ``pipelines/``. A file holds at most ``MAX_FILE_LINES`` lines; a
function (or method) at most ``MAX_FUNCTION_LINES`` lines from its ``def`` to its last line, docstring included.
Exempt: argparse builders (a function named ``add_parser`` that adds sub-parsers or arguments): a flat list of
options, which reads best in one place.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("sage_tfx", "components", "pipelines")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _product_files():
    return [p for d in PRODUCT_DIRS for p in sorted((ROOT / d).rglob("*.py"))]


def _is_argparse_builder(node):
    """An ``add_parser`` function whose body calls argparse's ``add_parser``/``add_argument``."""
    calls = {c.func.attr for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)}
    return node.name == "add_parser" and bool(calls & {"add_parser", "add_argument"})


def long_functions(path, limit=MAX_FUNCTION_LINES):
    """``(qualified name, lines)`` of every function of ``path`` over ``limit`` lines, argparse builders exempt."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = child.end_lineno - child.lineno + 1
                if lines > limit and not _is_argparse_builder(child):
                    out.append((f"{prefix}{child.name}", lines))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(), str(path)), "")
    return out


def test_no_product_file_is_over_the_line_limit():
    over = [
        f"{p.relative_to(ROOT)} ({n} lines)"
        for p in _product_files()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert over == [], (
        f"product files over {MAX_FILE_LINES} lines: {over}; split them along their concepts "
        "(a facade re-exporting step modules keeps the import paths)"
    )


def test_no_product_function_is_over_the_line_limit():
    over = [f"{p.relative_to(ROOT)}:{name} ({n} lines)" for p in _product_files() for name, n in long_functions(p)]
    assert over == [], (
        f"functions over {MAX_FUNCTION_LINES} lines: {over}; break them into named steps "
        "(argparse add_parser builders are exempt)"
    )


def test_the_limit_finds_a_long_function_and_exempts_an_argparse_builder(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    args = "\n".join(f"    sub.add_argument('--o{i}')" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "m.py"
    path.write_text(
        f"class C:\n  def long(self):\n{body}\n\ndef add_parser(sub):\n{args}\n\ndef short():\n    return 1\n"
    )
    assert long_functions(path) == [("C.long", MAX_FUNCTION_LINES + 1)]
