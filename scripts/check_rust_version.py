#!/usr/bin/env python3
"""Checks the `rust-version` the published crates declare against what their dependencies need.

The toolchain of that version cannot be installed everywhere CI runs, so this checks what can
be read instead: every crate the published packages build with (normal and build
dependencies, on Linux, for each feature set below, as Cargo.lock resolves them) declares its
own `rust-version`; none may be newer than ours. Clippy's `incompatible_msrv` lint, in
`.ci/run`, checks our own code's use of the standard library against it.

Checked with the default features, the set `rust-version` promises; the other features are
reported with the rustc they need, which the guide states (docs/guide/README.md).
"""

import json
import subprocess
import sys

PUBLISHED = ["prometheus_parking_lot", "prometheus_parking_lot_actors"]
TARGET = "x86_64-unknown-linux-gnu"


def version(text):
    parts = [int(part) for part in text.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def shown(parts):
    return ".".join(str(part) for part in parts[:2]) if parts[2] == 0 else ".".join(map(str, parts))


def needs(features):
    """The newest rust-version among what the published crates build with, and who needs it."""
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", TARGET]
            + features,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {package["id"]: package for package in metadata["packages"]}
    nodes = {node["id"]: node for node in metadata["resolve"]["nodes"]}
    roots = [id for id, package in packages.items() if package["name"] in PUBLISHED and id in nodes]
    declared = {packages[id]["name"]: version(packages[id]["rust_version"]) for id in roots}
    seen, stack = set(), list(roots)
    while stack:
        id = stack.pop()
        if id in seen:
            continue
        seen.add(id)
        for dep in nodes[id]["deps"]:
            if any(kind["kind"] in (None, "build") for kind in dep["dep_kinds"]):
                stack.append(dep["pkg"])
    newest = max(
        (version(packages[id]["rust_version"]), packages[id]["name"] + " " + packages[id]["version"])
        for id in seen - set(roots)
        if packages[id].get("rust_version")
    )
    return declared, newest


def main():
    declared, (default_needs, default_who) = needs([])
    _, (all_needs, all_who) = needs(["--all-features"])
    ours = min(declared.values())
    print(f"rust-version declared: {shown(ours)}")
    print(f"the default features need rustc {shown(default_needs)} ({default_who})")
    print(f"every feature needs rustc {shown(all_needs)} ({all_who})")
    if default_needs > ours:
        print(
            f"error: {default_who} needs rustc {shown(default_needs)}, newer than the rust-version "
            f"{shown(ours)} the crates declare; raise [workspace.package] rust-version",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
