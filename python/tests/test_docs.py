"""The docstrings at run time agree with the stub, __init__.pyi (help(libtier.Store) shows what a
type checker sees): each function, class, method and property the stub documents carries that
docstring at run time, and every public name of the package is in the stub, documented."""

import ast
import inspect
import os

import pytest

import libtier

STUB = os.path.join(os.path.dirname(libtier.__file__), "__init__.pyi")


def stub_entries():
    """(qualified name, docstring, kind) of every def, class and class attribute of the stub;
    kind is "def", "class" or "attr" (an annotated attribute: the class docstring covers it)."""
    with open(STUB, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, ast.get_docstring(node), "def"
        elif isinstance(node, ast.ClassDef):
            yield node.name, ast.get_docstring(node), "class"
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield f"{node.name}.{item.name}", ast.get_docstring(item), "def"
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    yield f"{node.name}.{item.target.id}", None, "attr"


def runtime(name):
    owner, _, attr = name.rpartition(".")
    if not owner:
        return getattr(libtier, name)
    cls = getattr(libtier, owner)
    return inspect.getattr_static(cls, attr)


def runtime_doc(obj):
    doc = obj.__doc__ if not isinstance(obj, (staticmethod, classmethod)) else obj.__func__.__doc__
    return inspect.cleandoc(doc or "")


ENTRIES = [e for e in stub_entries() if e[1]]


@pytest.mark.parametrize("name,doc,kind", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_stub_docstring_at_run_time(name, doc, kind):
    got = runtime_doc(runtime(name))
    want = inspect.cleandoc(doc)
    # The extension's docstrings start with the stub's signature line (gen_docs.py); the
    # package's Python functions carry the docstring alone.
    assert got == want or got.endswith("\n\n" + want), f"{name}:\n{got}\n---\n{want}"


def test_every_public_name_is_in_the_stub_and_documented():
    documented = {name for name, doc, kind in stub_entries() if doc or kind == "attr"}
    in_stub = {name for name, _, _ in stub_entries()}
    missing, undocumented = [], []
    for name in libtier.__all__:
        obj = getattr(libtier, name)
        if not (inspect.isclass(obj) or callable(obj)) or isinstance(obj, int):
            continue
        if issubclass(obj, Exception) if inspect.isclass(obj) else False:
            continue  # the errors are libtier._errors' own classes, documented there
        if name == "Code":
            continue
        if name not in in_stub:
            missing.append(name)
        elif name not in documented:
            undocumented.append(name)
        if inspect.isclass(obj) and obj.__module__.startswith("libtier"):
            for attr, value in vars(obj).items():
                if attr.startswith("_") or not (callable(value) or isinstance(value, property)):
                    continue
                qual = f"{name}.{attr}"
                if qual not in in_stub:
                    missing.append(qual)
                elif qual not in documented:
                    undocumented.append(qual)
    assert not missing, f"public at run time, absent from __init__.pyi: {missing}"
    assert not undocumented, f"in __init__.pyi without a docstring: {undocumented}"


def test_help_shows_the_docstrings():
    text = pydoc_text(libtier.Store)
    assert "save(self, keys: Sequence[KeyLike], buffers: Sequence[Regions]) -> list[Code]" in text
    assert "Stores each key's regions" in text
    assert "Where each key is stored and how large it is" in text


def pydoc_text(obj):
    import pydoc
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)
