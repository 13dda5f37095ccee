#!/usr/bin/env python3
"""Checks that shared objects export exactly the symbols their version scripts list, and writes
the candidate list of a library's version script after an API change.

Usage:
  exports_test.py MAP SO [SO ...]    exit 0 when every SO's exported set equals MAP's list
  exports_test.py --write MAP SO     rewrite MAP's list from SO's object files (docs/abi.md)

A version script (liburing's src/liburing.map is the model) names each exported symbol: a C
symbol bare (`tier_plugin_entry;`), a C++ one as its demangled name in quotes inside
`extern "C++" { ... }` (quotes make ld match the name exactly, not as a pattern). The `local: *;`
section hides the rest. A pattern in the global section is refused: the list must be the API.
Reported: symbols exported but not listed (a leak) and listed but not exported (a stale entry).

--write reads every global symbol the SO's object files define (the inputs ninja links it from,
so symbols the current list hides are seen too) and keeps the API of the library's installed
headers (LIBRARIES below): C symbols those headers name; C++ symbols in namespace tier whose every
name is declared there, minus tier::detail, private members (and nested types) of the headers'
classes, template instantiations (tier's or anyone's: std, fmt, nlohmann) and inline functions
the headers define (weak: every user compiles its own). Kept as well: the vtables, type info and
thunks of those classes, and static data. A human reviews the diff before committing it.
"""
import json
import os
import re
import subprocess
import sys

LINKER = {"_init", "_fini", "_edata", "_end", "__bss_start"}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Each library: its version script and the installed headers that declare its API (files or
# folders, from the source root).
LIBRARIES = [
    ("libtier/libtier.map", ["libtier/include/tier"]),
    ("engine/libtier_engine.map", ["engine/include/tier/engine"]),
    ("codecs/dsv4/libtier_dsv4.map", ["codecs/dsv4/include/tier/dsv4"]),
    ("layouts/dsv4/libtier_dsv4_layout.map", ["layouts/dsv4/include/tier/dsv4"]),
    ("hip/libtier_gpu.map", ["hip/gpu.hpp"]),
    ("capi/libtier_c.map", ["capi/include/tier/tier.h"]),
    ("sizing/libtier_sizing.map", ["sizing/include/tier/sizing"]),
]


def listed(path):
    text = re.sub(r"/\*.*?\*/", "", open(path, encoding="utf-8").read(), flags=re.S)
    text = re.sub(r"#[^\n]*", "", text)
    glob = text.split("global:", 1)[1].split("local:", 1)[0]
    names = set()
    for block in re.finditer(r'extern\s+"C\+\+"\s*\{(.*?)\};', glob, re.S):
        for entry in re.findall(r'"((?:[^"\\]|\\.)*)"\s*;', block.group(1)):
            names.add(entry)
        rest = re.sub(r'"(?:[^"\\]|\\.)*"\s*;', "", block.group(1)).strip()
        if rest:
            sys.exit(f"{path}: unquoted C++ entries (patterns) in the global section: {rest[:80]}")
    plain = re.sub(r'extern\s+"C\+\+"\s*\{.*?\};', "", glob, flags=re.S)
    for entry in re.findall(r"([^\s;]+)\s*;", plain):
        if any(c in entry for c in "*?["):
            sys.exit(f"{path}: a pattern in the global section: {entry}")
        names.add(entry)
    return names


def exported(so):
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", so], capture_output=True, text=True,
                         check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[2] not in LINKER:
            names.add(parts[2])
    return names


def check(map_path, sos):
    want = listed(map_path)
    bad = 0
    for so in sos:
        have = exported(so)
        leak, stale = sorted(have - want), sorted(want - have)
        for s in leak:
            print(f"{so}: exports {s}, which {map_path} does not list")
        for s in stale:
            print(f"{so}: does not export {s}, which {map_path} lists")
        bad += len(leak) + len(stale)
        if not leak and not stale:
            print(f"{so}: {len(have)} exported symbols, exactly the list of {map_path}")
    return bad


# ---- --write: the candidate list ----------------------------------------------------------------

def build_dir_of(path):
    d = os.path.dirname(os.path.abspath(path))
    while d != "/":
        if os.path.exists(os.path.join(d, "build.ninja")):
            return d
        d = os.path.dirname(d)
    sys.exit(f"{path}: not inside a ninja build directory")


def release_build(build):
    """Refuses a build whose compiler emits other weak symbols than the release build's: an
    unoptimized or sanitized build keeps weak copies of inline constants and vtables, which would
    enter the list and then be missing from every release build."""
    info = os.path.join(build, "meson-info", "intro-buildoptions.json")
    opts = {o["name"]: o["value"] for o in json.load(open(info, encoding="utf-8"))}
    if opts.get("buildtype") != "release" or opts.get("b_sanitize") not in ("none", []):
        sys.exit(f"{build}: buildtype {opts.get('buildtype')}, b_sanitize "
                 f"{opts.get('b_sanitize')}; write the lists from a release build without "
                 "sanitizers (meson setup build: its default)")


def objects_of(so):
    """The object files ninja links `so` from."""
    build = build_dir_of(so)
    release_build(build)
    target = os.path.relpath(os.path.realpath(so), build)
    out = subprocess.run(["ninja", "-C", build, "-t", "query", target], capture_output=True,
                         text=True, check=True).stdout
    objs = []
    section = None
    for line in out.splitlines()[1:]:
        s = line.strip()
        if re.match(r"\w+:", s):  # "input: RULE", "outputs:"
            section = s
            continue
        if section and section.startswith("input") and s.endswith(".o"):
            objs.append(os.path.join(build, s))
    if not objs:
        sys.exit(f"{so}: ninja names no object files for {target}")
    return objs


def defined(objs):
    """{demangled name: set of nm type letters} of the global symbols the objects define."""
    syms = {}
    for obj in objs:
        raw = subprocess.run(["nm", "-g", "--defined-only", obj], capture_output=True, text=True,
                             check=True).stdout.splitlines()
        dem = subprocess.run(["nm", "-g", "--defined-only", "-C", obj], capture_output=True,
                             text=True, check=True).stdout.splitlines()
        for r, d in zip(raw, dem):
            rp, dp = r.split(None, 2), d.split(None, 2)
            if len(rp) == 3 and len(dp) == 3:
                syms.setdefault(dp[2], set()).add(rp[1])
    return syms


def strip_source(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)
    text = re.sub(r"'(?:[^'\\\n]|\\.)*'", "''", text)
    return re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)


TOKEN = re.compile(r"[A-Za-z_]\w*|::|->|[^\s\w]")


def header_files(paths):
    files = []
    for p in paths:
        full = os.path.join(ROOT, p)
        if os.path.isdir(full):
            for dirpath, _, names in os.walk(full):
                files += [os.path.join(dirpath, n) for n in sorted(names)
                          if n.endswith((".hpp", ".h"))]
        else:
            files.append(full)
    return files


def scan_headers(files):
    """(every name the headers use, the classes they define, {class: names declared in its
    private sections}). A private member that an inline body of its class names stays public:
    users' code calls it."""
    names, classes, private, ctors, inline = set(), set(), {}, {}, {}
    for path in files:
        toks = TOKEN.findall(strip_source(open(path, encoding="utf-8").read()))
        names.update(t for t in toks if t[0].isalpha() or t[0] == "_")
        # Scopes: ("class", name, access) or ("block",). A class body's statements at paren
        # depth 0 declare its members.
        stack, i, parens = [], 0, 0
        pending = None  # the class a following "{" opens
        while i < len(toks):
            t = toks[i]
            top = stack[-1] if stack else None
            if top and top[0] == "block":  # an inline body: what it names, per enclosing class
                for scope in stack:
                    if scope[0] == "class":
                        inline.setdefault(scope[1], set()).add(t)
            if t in ("class", "struct", "union") and i + 1 < len(toks) and \
                    toks[i + 1][0].isalpha() and (i == 0 or toks[i - 1] not in ("enum", "<", ",")):
                j = i + 2
                while j < len(toks) and toks[j] not in ("{", ";", "(", ")", ">", "="):
                    j += 1
                if j < len(toks) and toks[j] == "{":
                    pending = (toks[i + 1], "private" if t == "class" else "public")
                    classes.add(toks[i + 1])
                if top and top[0] == "class" and parens == 0 and top[2] == "private":
                    private.setdefault(top[1], set()).add(toks[i + 1])
                i += 2
                continue
            if t == "{":
                if pending:
                    stack.append(["class", pending[0], pending[1]])
                    pending = None
                else:
                    stack.append(["block"])
            elif t == "}":
                if stack:
                    stack.pop()
            elif t == ";":
                pending = None
            elif t == "(":
                if top and top[0] == "class" and parens == 0 and i > 0:
                    name = toks[i - 1]
                    if name[0].isalpha() or name[0] == "_":
                        if name == top[1] and (i < 2 or toks[i - 2] != "~"):
                            ctors.setdefault(name, set()).add(top[2])
                        elif top[2] == "private":
                            private.setdefault(top[1], set()).add(name)
                parens += 1
            elif t == ")":
                parens = max(0, parens - 1)
            elif top and top[0] == "class" and parens == 0:
                if t in ("public", "private", "protected") and i + 1 < len(toks) and \
                        toks[i + 1] == ":":
                    top[2] = t
                elif top[2] == "private" and (t[0].isalpha() or t[0] == "_") and \
                        i + 1 < len(toks) and toks[i + 1] in (";", "=", "[", "{") and \
                        toks[i - 1] not in ("class", "struct", "enum"):
                    private.setdefault(top[1], set()).add(t)  # a data member
            i += 1
    # A constructor is private when its class declares no other.
    for cls, access in ctors.items():
        if access == {"private"}:
            private.setdefault(cls, set()).add(cls)
    return names, classes, {cls: members - inline.get(cls, set())
                            for cls, members in private.items()}


SPECIAL = ["vtable for ", "typeinfo name for ", "typeinfo for ", "VTT for ",
           "guard variable for ", "non-virtual thunk to ", "virtual thunk to "]


# An operator's name, which may hold "<", "(" or "::" (operator<<, operator(), a conversion).
OPERATOR = re.compile(r"operator\s*(?:\(\)|\[\]|<=>|<<=|>>=|<<|>>|->\*|->|[^\s(]+|"
                      r"\s+[\w:<>*& ]+?(?=\())")


def split_scope(entity):
    """The components of an entity's qualified name (before its parameter list), each with its
    template arguments: "tier::Result<int>::ok() const" -> ["tier", "Result<int>", "ok"]."""
    depth, start, parts = 0, 0, []
    i = 0
    while i < len(entity):
        c = entity[i]
        if entity.startswith("operator", i) and depth == 0:
            m = OPERATOR.match(entity, i)
            i += len(m.group(0)) if m else len("operator")
            continue
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            parts.append(entity[start:i])
            return parts
        elif c == ":" and depth == 0 and entity.startswith("::", i):
            parts.append(entity[start:i])
            start = i + 2
            i += 2
            continue
        i += 1
    parts.append(entity[start:])
    return parts


def candidate(name, types, names, classes, private):
    """Whether a global symbol of the objects belongs to the library's list."""
    if name in LINKER:
        return False
    if re.fullmatch(r"[A-Za-z_]\w*", name) and not name.startswith("_Z"):  # a C symbol
        return name in names
    kind = next((s for s in SPECIAL if name.startswith(s)), "")
    entity = name[len(kind):]
    if name.startswith("construction vtable for ") or not entity.startswith("tier::"):
        return False
    parts = split_scope(entity)
    if any("<" in p and not p.startswith("operator") for p in parts):
        return False  # a template instantiation, tier's or a standard one
    if "detail" in parts or "(anonymous namespace)" in entity or "{lambda" in entity:
        return False
    if not kind and types <= {"W", "V"} and "(" in entity:
        return False  # an inline function of a header: users compile their own copy
    idents = []
    for p in parts[1:]:
        idents.append("operator" if p.startswith("operator") else p.split("[")[0])
    if any(i.lstrip("~") not in names for i in idents):
        return False  # not declared by the installed headers
    if kind in ("vtable for ", "typeinfo for ", "typeinfo name for ", "VTT for ") and \
            idents[-1] not in classes:
        return False  # a class of another library's headers: that library exports its own
    for outer, inner in zip(idents, idents[1:]):
        if inner in private.get(outer, ()):  # ~X (never in the set) is public
            return False  # a private member or nested type
    return True


def write(map_path, so, headers):
    files = header_files(headers)
    if not files:
        sys.exit(f"{map_path}: no headers in {headers}")
    names, classes, private = scan_headers(files)
    syms = defined(objects_of(so))
    keep = sorted(n for n, t in syms.items() if candidate(n, t, names, classes, private))
    c_syms = [n for n in keep if not n.startswith(tuple(SPECIAL)) and "::" not in n]
    cxx = [n for n in keep if n not in c_syms]
    head = ""
    if os.path.exists(map_path):
        m = re.match(r"\s*(/\*.*?\*/)", open(map_path, encoding="utf-8").read(), re.S)
        head = m.group(1) + "\n" if m else ""
    lines = [head + "{", "  global:"]
    if cxx:
        lines.append('    extern "C++" {')
        lines += [f'      "{n}";' for n in cxx]
        lines.append("    };")
    lines += [f"    {n};" for n in c_syms]
    lines += ["  local:", "    *;", "};", ""]
    with open(map_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"{map_path}: {len(keep)} symbols ({len(c_syms)} C, {len(cxx)} C++) of "
          f"{len(syms)} defined in {so}'s objects; review the diff")


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--write":
        map_path = os.path.abspath(args[1])
        rel = os.path.relpath(map_path, ROOT)
        headers = dict(LIBRARIES).get(rel)
        if headers is None:
            sys.exit(f"{rel}: not a version script of LIBRARIES in {sys.argv[0]}")
        write(map_path, args[2], headers)
        return 0
    if len(args) < 2 or args[0].startswith("--"):
        sys.exit(__doc__)
    return 1 if check(args[0], args[1:]) else 0


if __name__ == "__main__":
    sys.exit(main())
