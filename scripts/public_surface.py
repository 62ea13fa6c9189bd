#!/usr/bin/env python3
"""Counts the public surface of the crate: every item a user can name, every path that names
it, and the items named by two or more paths.

It reads rustdoc's JSON of both crates (a nightly toolchain writes it):

    cargo +nightly rustdoc -p prometheus_parking_lot_actors --all-features -- -Z unstable-options --output-format json
    cargo +nightly rustdoc -p prometheus_parking_lot --lib --all-features -- -Z unstable-options --output-format json
    scripts/public_surface.py target/doc/prometheus_parking_lot.json target/doc/prometheus_parking_lot_actors.json [--paths]

The walk starts at the first crate's root and follows its public modules and re-exports
(into the engine crate where they lead there), skipping `#[doc(hidden)]` items. Modules are
walked, not counted. `--paths` lists every item with its paths.
"""

import collections
import json
import signal
import sys


def load(path):
    with open(path) as file:
        return json.load(file)


def kind_of(item):
    return next(iter(item["inner"])) if isinstance(item["inner"], dict) else item["inner"]


def hidden(item):
    return "hidden" in json.dumps(item.get("attrs", []))


class Surface:
    def __init__(self, root, engine):
        self.docs = {"root": root, "engine": engine}
        self.engine_name = engine["index"][str(engine["root"])]["name"]
        self.engine_paths = {
            tuple(entry["path"]): item_id
            for item_id, entry in engine["paths"].items()
            if entry["crate_id"] == 0
        }
        self.paths = collections.defaultdict(set)

    def resolve(self, doc, item_id):
        """The (document, item) an id of `doc` stands for, following the engine crate."""
        index = self.docs[doc]["index"]
        key = str(item_id)
        if key in index and index[key].get("crate_id", 0) == 0:
            return doc, index[key]
        entry = self.docs[doc]["paths"].get(key)
        if entry is None:
            return None
        crate = self.docs[doc]["external_crates"].get(str(entry["crate_id"]), {}).get("name")
        if doc == "root" and crate == self.engine_name:
            engine_id = self.engine_paths.get(tuple(entry["path"]))
            if engine_id is not None and str(engine_id) in self.docs["engine"]["index"]:
                return "engine", self.docs["engine"]["index"][str(engine_id)]
        # Another crate's item (a dependency re-exported): counted by its own path.
        return "other", {"id": "/".join(entry["path"]), "inner": {entry["kind"]: {}}}

    def walk(self, doc, module, prefix, depth=0):
        if depth > 12:
            return
        for child in module["inner"]["module"]["items"]:
            found = self.resolve(doc, child)
            if found is None:
                continue
            child_doc, item = found
            if child_doc != "other" and (item.get("visibility") != "public" or hidden(item)):
                continue
            if kind_of(item) == "use":
                self.follow_use(child_doc, item["inner"]["use"], prefix, depth)
            else:
                self.add(child_doc, item, prefix + [item["name"]], depth)

    def follow_use(self, doc, use, prefix, depth):
        if use["id"] is None:
            return
        found = self.resolve(doc, use["id"])
        if found is None:
            return
        target_doc, target = found
        if target_doc != "other" and hidden(target):
            return
        if use["is_glob"]:
            if target_doc != "other" and kind_of(target) == "module":
                self.walk(target_doc, target, prefix, depth + 1)
            return
        self.add(target_doc, target, prefix + [use["name"]], depth)

    def add(self, doc, item, path, depth):
        kind = kind_of(item)
        if doc != "other" and kind == "module":
            self.walk(doc, item, path, depth + 1)
            return
        self.paths[(kind, doc, str(item.get("id")))].add("::".join(path))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a reader such as `head` may stop early
    args = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    root, engine = load(args[0]), load(args[1])
    surface = Surface(root, engine)
    crate = root["index"][str(root["root"])]
    surface.walk("root", crate, [crate["name"]])
    items = surface.paths
    several = {key: paths for key, paths in items.items() if len(paths) > 1}
    print(f"public items: {len(items)}")
    print(f"paths to them: {sum(len(paths) for paths in items.values())}")
    print(f"items with two or more paths: {len(several)}")
    for paths in sorted(several.values(), key=lambda paths: sorted(paths)[0].rsplit('::', 1)[-1]):
        print("  " + "  ".join(sorted(paths)))
    if "--paths" in sys.argv:
        for (kind, _, _), paths in sorted(items.items(), key=lambda entry: sorted(entry[1])[0]):
            print(kind, " ".join(sorted(paths)))


if __name__ == "__main__":
    main()
