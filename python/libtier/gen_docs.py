#!/usr/bin/env python3
"""Writes the extension's docstrings from the stub (run by Meson at build time).

Usage: gen_docs.py __init__.pyi OUT.h

__init__.pyi is the one place the package's surface is written down. Every function, class,
method and property of the stub that has a docstring becomes an entry {"Store.save", text} of
OUT.h, the text being the stub's signature line, a blank line and the docstring, so that
help(libtier.Store) shows what a type checker sees. _libtier.cpp passes doc("Store.save") to each
definition; python/tests/test_docs.py checks that the two agree at run time.
"""
import ast
import inspect
import sys


def signature(fn: ast.FunctionDef) -> str:
    args = ast.unparse(fn.args)
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    return f"{fn.name}({args}){ret}"


def is_property(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def entries(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                yield node.name, signature(node) + "\n\n" + doc
        elif isinstance(node, ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc:
                yield node.name, doc
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                doc = ast.get_docstring(item)
                if not doc:
                    continue
                name = f"{node.name}.{item.name}"
                if is_property(item):
                    ret = ast.unparse(item.returns) if item.returns is not None else "Any"
                    yield name, f"{item.name}: {ret}\n\n{doc}"
                else:
                    yield name, signature(item) + "\n\n" + doc


def c_string(text: str) -> str:
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        escaped = line.replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'"{escaped}' + ("\\n" if i + 1 < len(lines) else "") + '"')
    return "\n     ".join(out)


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=src)
    lines = [
        "// Generated from __init__.pyi by gen_docs.py at build time: do not edit.",
        "#pragma once",
        "namespace libtier_docs {",
        "struct Doc {",
        "  const char* name;",
        "  const char* text;",
        "};",
        "inline constexpr Doc kDocs[] = {",
    ]
    for name, text in entries(tree):
        lines.append(f'    {{"{name}",\n     {c_string(inspect.cleandoc(text))}}},')
    lines += ["};", "}  // namespace libtier_docs", ""]
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
