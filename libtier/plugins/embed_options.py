#!/usr/bin/env python3
"""Makes a plugin's options header from its options.json (run by Meson at build time).

Usage: embed_options.py options.json OUT.h

options.json is the plugin's option schema (tier_plugin::options_json, docs/plugins.md): the
plugin compiles it in as kPluginOptions from OUT.h, and the build installs the same file beside
the plugin (libtier_backend_disk.json beside libtier_backend_disk.so) so that `tierctl check`
checks a profile's options without loading the plugin. The file must be a JSON array.
"""
import json
import sys


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    try:
        schema = json.loads(text)
    except ValueError as e:
        sys.stderr.write(f"{src}: not JSON: {e}\n")
        return 1
    if not isinstance(schema, list):
        sys.stderr.write(f"{src}: an option schema is a JSON array\n")
        return 1
    if ')JSON"' in text:
        sys.stderr.write(f'{src}: may not contain )JSON"\n')
        return 1
    with open(dst, "w", encoding="utf-8") as f:
        f.write(
            f"// Generated from {src} by embed_options.py at build time: do not edit.\n"
            "#pragma once\n"
            f'inline constexpr char kPluginOptions[] = R"JSON({text})JSON";\n'
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
