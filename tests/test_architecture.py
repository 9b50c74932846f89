"""docs/architecture.md is the map a new engineer reads first: it must match the code.

Every path it names exists, every `module` `Name.attr` pair it names resolves, every room of
bot/ is on it, and its tables are the order import-linter enforces (pyproject.toml).
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()
PATH = re.compile(r"`(bot/[\w/]*(?:\.py)?)`")
PAIR = re.compile(r"`(bot/[\w/]+\.py)`\s+`([A-Za-z_][\w.]*)`")
STANDALONE = {"bot.gateway", "bot.engine"}


def module_of(path: str) -> str:
    return path.removesuffix(".py").rstrip("/").replace("/", ".")


def test_every_path_the_map_names_exists() -> None:
    named = set(PATH.findall(DOC))
    assert len(named) > 30, "the map names the modules of both paths"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_function_the_map_names_is_in_its_module() -> None:
    pairs = PAIR.findall(DOC)
    assert len(pairs) >= 10
    wrong = []
    for path, dotted in pairs:
        found: object = importlib.import_module(module_of(path))
        for part in dotted.split("."):
            found = getattr(found, part, None)
        if found is None:
            wrong.append(f"{path} {dotted}")
    assert not wrong, f"docs/architecture.md names what its module does not define: {wrong}"


def table_rows(heading: str) -> list[set[str]]:
    """The modules each row of one of the map's tables names, top to bottom."""
    table = DOC.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `bot/")]
    return [{module_of(p) for p in PATH.findall(row)} for row in rows]


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]


def split(layer: str) -> set[str]:
    return {part.strip() for part in re.split(r"[|:]", layer)}


def test_the_map_shows_the_rooms_import_linter_enforces() -> None:
    (rooms,) = [c["layers"] for c in contracts() if "containers" not in c]
    assert table_rows("The rooms, top to bottom") == [split(layer) for layer in rooms]


def test_the_map_shows_each_rooms_floors_in_the_order_its_contract_enforces() -> None:
    """Inside a room, the map's rows run top to bottom as the room's contract does; the room's
    own row stands for its own modules (the floor above its sub-folders)."""
    inner = [m for row in table_rows("Inside the rooms, top to bottom") for m in sorted(row)]
    rooms = [c for c in contracts() if "containers" in c]
    assert len(rooms) >= 6
    for contract in rooms:
        (room,) = contract["containers"]
        floors = [{f"{room}.{name}" for name in split(layer)} for layer in contract["layers"]]
        if room in inner:  # the room's own modules: its top floor
            floors[0] = {room}
        floor_of = {module: i for i, floor in enumerate(floors) for module in floor}
        named = [floor_of[m] for m in inner if m in floor_of]
        assert set(named) == set(range(len(floors))), f"{room}: a floor is missing from the map"
        assert named == sorted(named), f"{room}: the map's rows are not in the contract's order"


def test_every_package_is_on_the_map() -> None:
    packages = {
        module_of(str(p.parent.relative_to(ROOT))) for p in (ROOT / "bot").glob("*/__init__.py")
    }
    rooms = set().union(*table_rows("The rooms, top to bottom"))
    for name in STANDALONE:
        assert f"`{name.replace('.', '/')}`" in DOC
    # Data folders beside the rooms (templates, the packaged defaults) need no row of their own.
    data = {"bot.shipped", "bot.templates"}
    missing = sorted(packages - rooms - STANDALONE - data)
    assert not missing, f"rooms missing from docs/architecture.md: {missing}"
    loose = sorted(p.name for p in (ROOT / "bot").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside any room: {loose}"


def awaits_inside_a_transaction(source: str) -> list[int]:
    """Lines of `with ....transaction()` / `.begin()` blocks that await inside them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.With | ast.AsyncWith):
            continue
        if not any(
            isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Attribute)
            and item.context_expr.func.attr in ("transaction", "begin")
            for item in node.items
        ):
            continue
        if any(isinstance(sub, ast.Await) for sub in ast.walk(node)):
            found.append(node.lineno)
    return found


def test_nothing_awaits_while_a_store_transaction_is_open() -> None:
    """On SQLite a unit of work holds the write lock from its start (BEGIN IMMEDIATE): awaiting
    inside one lets other work on the loop wait for that lock until "database is locked" (a
    test that drained the bot's tasks inside one failed CI that way)."""
    held = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("bot", "tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in awaits_inside_a_transaction(path.read_text())
    ]
    assert not held, f"await inside an open store transaction: {held}"
    bad = "async def f(db):\n    with db.transaction() as s:\n        await g(s)\n"
    assert awaits_inside_a_transaction(bad) == [2]  # the check itself sees the fault


def test_every_error_class_is_in_the_error_tree() -> None:
    """bot/kernel/errors.py's docstring is the map of what ruleloop raises on purpose: a RuleloopError
    defined anywhere in bot/ that it does not name is an error nobody will look for."""
    import bot.kernel.errors

    named = set(re.findall(r"[├└]── (\w+)", bot.kernel.errors.__doc__ or ""))
    bases: dict[str, set[str]] = {}
    for path in (ROOT / "bot").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = {b.id for b in node.bases if isinstance(b, ast.Name)}
    ours, grew = {"RuleloopError"}, True
    while grew:  # the classes that are RuleloopErrors, through any chain of bases
        found = {name for name, of in bases.items() if of & ours}
        grew, ours = not found <= ours, ours | found
    missing = sorted(ours - named - {"RuleloopError"})
    assert not missing, f"error classes missing from bot/kernel/errors.py's tree: {missing}"


LONG_FUNCTION_LINES = 60


def test_no_function_in_bot_is_over_60_lines() -> None:
    """A function that walks more than a screenful of steps hides which step owns what: each
    step gets a name of its own. Lines run from `def` to the last line, decorators excluded;
    migrations are frozen history and are not counted."""
    too_long = []
    for path in sorted((ROOT / "bot").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("bot/kernel/store/migrations/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            name = f"{relative}:{node.name}"
            if lines > LONG_FUNCTION_LINES:
                too_long.append(f"{name} ({lines} lines)")
    assert not too_long, f"functions over {LONG_FUNCTION_LINES} lines: {too_long}"


def cycles(imports: dict[str, set[str]]) -> list[set[str]]:
    """The import cycles of a graph (module -> the modules it imports): each strongly connected
    set of two or more modules (Tarjan's algorithm, iterative: the graph is a few hundred deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = set(stack[stack.index(node) :])
                del stack[stack.index(node) :]
                if len(part) > 1:
                    found.append(part)
    return found


def bench_imports() -> dict[str, set[str]]:
    """bench/'s scripts import each other by file name (the folder is on sys.path, no package):
    each one's imports of the others, at any depth of the file."""
    names = {path.stem for path in (ROOT / "bench").glob("*.py")}
    imports: dict[str, set[str]] = {}
    for name in names:
        tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text(encoding="utf-8"))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        imports[name] = imported & names
    return imports


def test_no_import_cycles_in_bot_or_bench() -> None:
    """Two modules that import each other (even only for a type, or inside a function) are one
    module in two files: neither can be read, tested or moved alone. The fix is to move the
    shared type to where it belongs. Counted: every import, type-checking ones included."""
    import grimp

    graph = grimp.build_graph("bot", exclude_type_checking_imports=False)
    bot = {name: set(graph.find_modules_directly_imported_by(name)) for name in graph.modules}
    found = cycles(bot) + cycles(bench_imports())
    assert not found, f"import cycles (move the type they share): {found}"
    # The check itself sees a cycle, a longer one, and none in a chain.
    assert cycles({"a": {"b"}, "b": {"a"}}) == [{"a", "b"}]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def readme_layout() -> list[str]:
    """The entries of README's layout block under bot/, with their room: 'app/', 'app/cli/',
    'app/server.py', 'remediation/', ..."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listed, room = [], ""
    for indent, name in re.findall(r"^( {2}| {4})(\w+/|\w+\.py)\s", block, re.MULTILINE):
        if len(indent) == 2:
            room = name
            listed.append(name)
        else:
            listed.append(room + name)
    return listed


def test_readme_layout_lists_every_package_of_bot() -> None:
    """README's layout block is the first map a reader sees: every room of bot/ and every folder
    inside one is on it, each under its room, and nothing on it is gone."""
    listed = readme_layout()
    assert "app/cli/" in listed and "app/server.py" in listed  # the block was found and read
    packages = {f"{p.parent.relative_to(ROOT / 'bot').as_posix()}/" for p in
                [*(ROOT / "bot").glob("*/__init__.py"), *(ROOT / "bot").glob("*/*/__init__.py")]}
    missing = sorted(packages - set(listed))
    gone = sorted(name for name in listed if not (ROOT / "bot" / name).exists())
    assert not missing, f"README's layout block leaves out packages of bot/: {missing}"
    assert not gone, f"README's layout block names what bot/ no longer has: {gone}"


# A row of a package docstring's table of its modules: 'name.py   what it does' or 'name/  ...'.
TABLE_ROW = re.compile(r"^\s*(\w+)(?:\.py|/)\s+\S", re.MULTILINE)


def unlisted_modules(package: Path) -> tuple[list[str], list[str]]:
    """A package docstring's table of its modules against the package: the modules it leaves
    out and the names it lists that are gone. A docstring without such a table is a one-line
    summary of the package (docs/architecture.md maps those), and is not held to one."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text("utf-8"))) or ""
    listed = set(TABLE_ROW.findall(doc))
    if not listed:
        return [], []
    have = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    have |= {p.parent.name for p in package.glob("*/__init__.py")}
    return sorted(have - listed), sorted(listed - have)


def test_a_package_that_lists_its_modules_lists_all_of_them(tmp_path: Path) -> None:
    """A table of a package's modules that leaves some out says the package holds less than it
    does (remediation/'s listed 5 of 16): where a package lists its modules, it lists each."""
    for name in ("__init__", "a", "b"):  # the check itself sees a module left out, one gone
        (tmp_path / f"{name}.py").write_text('"""P.\n\na.py  one\nc.py  gone\n"""\n')
    assert unlisted_modules(tmp_path) == (["b"], ["c"])
    tables = 0
    wrong = {}
    for init in sorted((ROOT / "bot").rglob("__init__.py")):
        missing, gone = unlisted_modules(init.parent)
        tables += bool(missing or gone or TABLE_ROW.search(init.read_text("utf-8")))
        if missing or gone:
            wrong[init.parent.relative_to(ROOT).as_posix()] = {"missing": missing, "gone": gone}
    assert tables >= 5, "the package tables were found"
    assert not wrong, f"package docstrings whose module table is not the package's: {wrong}"


def faces() -> list[Path]:
    """Every package with a face: those whose ``__init__`` lists names under TYPE_CHECKING."""
    return sorted(
        init for init in (ROOT / "bot").rglob("__init__.py") if "face_of(__name__" in init.read_text()
    )


def test_every_face_resolves_each_name_it_lists_to_the_object_in_its_module() -> None:
    """A face lists its names once (TYPE_CHECKING imports, read by mypy and by the lazy loader)
    and in ``__all__``: the two agree, and each name loads as the very object of its module."""
    from bot.kernel.lazy import names_of

    found = faces()
    assert len(found) >= 20, "the rooms and their packages have faces"
    wrong = []
    for init in found:
        package = module_of(init.parent.relative_to(ROOT).as_posix())
        loaded = importlib.import_module(package)
        table = names_of(init)
        listed = set(loaded.__all__)
        public_modules = {n for n in listed - set(table) if (init.parent / f"{n}.py").exists()}
        own = {n for n in listed - set(table) - public_modules if n in vars(loaded)}
        if listed != set(table) | public_modules | own:
            wrong.append(f"{package}: __all__ and the TYPE_CHECKING names differ")
        for name, (module, attribute) in table.items():
            if getattr(loaded, name) is not getattr(importlib.import_module(module), attribute):
                wrong.append(f"{package}.{name} is not {module}.{attribute}")
    assert not wrong, wrong


def test_a_deep_import_across_rooms_breaks_the_face_contracts() -> None:
    """Every room has a face contract (pyproject.toml); each one protects the room's modules,
    letting through only its faces and the modules its faces list as public."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    faced = {
        c["protected_modules"][0].removesuffix(".*"): c
        for c in config["contracts"]
        if c["type"] == "protected"
    }
    rooms = {f"bot.{p.parent.name}" for p in (ROOT / "bot").glob("*/__init__.py")}
    assert set(faced) == rooms, "one face contract per room"
    for room, contract in faced.items():
        assert contract["allowed_importers"] == [room]
        for rule in contract.get("ignore_imports", []):
            target = rule.split(" -> ")[1]
            face, _, name = target.rpartition(".")
            if (ROOT / Path(*target.split(".")) / "__init__.py").exists():
                continue  # a face
            listed = importlib.import_module(face).__all__
            assert name in listed, f"{room}: {target} is let through but its face does not list it"
