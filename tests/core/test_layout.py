"""The package's layout keeps its promises (docs/architecture.md): no module imports a private
name of another or reaches into a private attribute another module defines, the modules import
each other without a circle (counting imports inside functions), each concept's folder says in
its ``__init__`` what it holds, and no module outside the models grows past about 450 lines."""

import ast
import pkgutil
from pathlib import Path

import pytest

import hvd_bert

ROOT = Path(hvd_bert.__file__).parent
MODULES = {m.name: m for m in pkgutil.walk_packages(hvd_bert.__path__, "hvd_bert.")}
LONGEST = 470  # lines; the models (hvd_bert/*/models/) are exempt


def path_of(name: str) -> Path:
    rel = Path(*name.split(".")[1:])
    return ROOT / rel / "__init__.py" if (ROOT / rel).is_dir() else ROOT / rel.with_suffix(".py")


def imports_of(name: str):
    """``(line, imported module, names)`` of every ``hvd_bert`` import in module ``name``."""
    tree = ast.parse(path_of(name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("hvd_bert"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                yield node.lineno, (sub if sub in MODULES else node.module), a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("hvd_bert."):
                    yield node.lineno, a.name, None


def test_no_private_name_crosses_a_module():
    found = [f"{name}:{line} imports {name_!r} from {mod}" for name in MODULES
             for line, mod, name_ in imports_of(name)
             if name_ and name_.startswith("_") and not mod.endswith(f".{name_}")]
    assert not found, "\n".join(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_defined(tree) -> set[str]:
    """The private names a module defines: functions, classes, module names, attributes it sets."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
            out.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and _private(t.id):
                    out.add(t.id)
    return out


def private_reaches(trees: dict) -> list[str]:
    """``obj._name`` where ``obj`` is not the module's own ``self``, ``cls`` or ``super()`` and
    ``_name`` is defined by another module of the package and not by this one (a third-party
    object's private member is the library's business, not a crossing inside the package)."""
    defined = {name: private_names_defined(tree) for name, tree in trees.items()}
    owners: dict[str, set] = {}
    for name, names in defined.items():
        for n in names:
            owners.setdefault(n, set()).add(name)
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("self", "cls"):
                continue
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                continue
            if node.attr in owners and node.attr not in defined[name]:
                found.append(f"{name}:{node.lineno} reaches {ast.unparse(node)} "
                             f"(defined in {', '.join(sorted(owners[node.attr]))})")
    return found


def test_no_private_attribute_is_reached_from_another_module():
    trees = {name: ast.parse(path_of(name).read_text()) for name in MODULES}
    found = private_reaches(trees)
    assert not found, "\n".join(found)
    # and the check sees a crossing: ZeRO reading an optimizer's private moments, as it once did
    crossing = {"hvd_bert.a": ast.parse("class Opt:\n    def build(self):\n        self._m = []\n"),
                "hvd_bert.b": ast.parse("def slots(opt):\n    return opt._m\n")}
    assert private_reaches(crossing) == ["hvd_bert.b:2 reaches opt._m (defined in hvd_bert.a)"]


def test_no_import_circle():
    graph = {name: {mod for _, mod, _ in imports_of(name) if mod in MODULES and mod != name}
             for name in MODULES}
    # a package's __init__ that re-exports its own modules is not a circle with them
    for name in graph:
        graph[name] = {m for m in graph[name] if not (MODULES[name].ispkg and m.startswith(name + "."))
                       and not (MODULES[m].ispkg and name.startswith(m + "."))}
    state, stack, circles = {}, [], []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                circles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("package", sorted(n for n, m in MODULES.items() if m.ispkg) + ["hvd_bert"])
def test_every_package_says_what_it_holds(package):
    doc = ast.get_docstring(ast.parse(path_of(package).read_text())) or ""
    own = sorted(n.rsplit(".", 1)[1] for n in MODULES if n.rsplit(".", 1)[0] == package)
    missing = [m for m in own if m not in doc and m != "__main__"]
    assert not missing, f"{package}'s __init__ docstring does not name {missing}"


def test_no_module_outside_the_models_is_long():
    long = {n: len(path_of(n).read_text().splitlines()) for n in MODULES if ".models" not in n}
    assert not {n: k for n, k in long.items() if k > LONGEST}, sorted(long.items(), key=lambda x: -x[1])[:3]


def test_train_and_the_jobs_use_only_what_the_engine_protocol_declares():
    """train/ and jobs/ reach an engine through ``train.engine.Engine``'s declared members: no
    getattr or hasattr probing of an engine (a member one framework lacks is declared and set)."""
    import re

    probe = re.compile(r"\b(getattr|hasattr)\((self\.)?engine\b")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for folder in ("train", "jobs")
             for p in sorted((ROOT / folder).glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert not found, found


def test_every_engine_member_train_and_the_jobs_use_is_declared():
    """Each ``engine.<member>`` that train/ and jobs/ use is a member of ``train.engine.Engine``
    (or of the module ``train.engine`` itself), so that both frameworks' engines are held to it."""
    import re

    from hvd_bert.train import engine as E

    declared = set(E.Engine.__annotations__) | set(vars(E.Engine)) | set(vars(E))
    used = {(m, f"{p.relative_to(ROOT)}:{n}") for folder in ("train", "jobs")
            for p in sorted((ROOT / folder).glob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            for m in re.findall(r"\bengine\.([A-Za-z_]\w*)", line)}
    assert not [f"{w}: {m}" for m, w in sorted(used) if m not in declared]
