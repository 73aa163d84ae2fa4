"""Module resolution: which repository files an import names, one resolver per language.

A ``LanguageSpec`` carries its resolver (``modules``). Resolution reads the set of a
snapshot's paths only, never file contents (``codekv.defuse.state`` relies on it: a changed
file cannot move other files' imports).
"""

from __future__ import annotations

import posixpath
from collections import defaultdict


class RepoPaths:
    """A snapshot's paths, indexed by every path suffix; resolvers keep their caches here."""

    def __init__(self, paths):
        self.paths = set(paths)
        self.by_suffix: dict[str, list[str]] = defaultdict(list)
        for path in paths:
            parts = path.split("/")
            for index in range(len(parts)):
                self.by_suffix["/".join(parts[index:])].append(path)
        self.cache: dict[str, dict] = {}  # per resolver: what it worked out from the paths

    def suffix(self, *candidates: str) -> list[str]:
        """The paths ending with the first candidate that any path ends with."""
        for candidate in candidates:
            found = self.by_suffix.get(candidate)
            if found:
                return found
        return []

    def exact(self, *candidates: str) -> list[str]:
        """The first candidate that is a path."""
        return [c for c in candidates if c in self.paths][:1]


class LanguageModules:
    """How one language's imports name files; this base resolves nothing (a language without
    a resolver still links names defined once in the repository)."""

    def resolve(self, paths: RepoPaths, importer: str, module: str) -> list[str]:
        """The files ``module`` (an import's module string, never empty) names."""
        return []

    def imports_all(self, imported) -> bool:
        """Whether an import naming no name (``imported.name`` None) brings in all the names
        its files define (a C header, a Go package), rather than the module itself."""
        return False

    def visible(self, paths: RepoPaths, path: str) -> list[str]:
        """Other files whose definitions ``path`` sees without importing them (its Go or Java
        package, a C header's implementation file). They join the imported names, so a name
        both they and an import define stays ambiguous instead of being guessed."""
        return []


class PythonModules(LanguageModules):
    def resolve(self, paths: RepoPaths, importer: str, module: str) -> list[str]:
        module = module.replace(" ", "")
        if module.startswith("."):
            dots = len(module) - len(module.lstrip("."))
            base = posixpath.dirname(importer)
            for _ in range(dots - 1):
                base = posixpath.dirname(base)
            rest = module[dots:].replace(".", "/")
            stem = posixpath.join(base, rest) if rest else base
            return paths.exact(f"{stem}.py", f"{stem}/__init__.py", f"{stem}.pyi")
        stem = module.replace(".", "/")
        return paths.suffix(f"{stem}.py", f"{stem}/__init__.py", f"{stem}.pyi")


class GoModules(LanguageModules):
    """A package is a directory; an import brings in the whole package, whose names are used
    qualified (``util.Helper``): references carry only ``Helper``, so all are in scope."""

    def package(self, paths: RepoPaths, directory: str) -> list[str]:
        """The .go files directly in ``directory`` (a Go package)."""
        dirs = paths.cache.get("go")
        if dirs is None:
            dirs = paths.cache["go"] = defaultdict(list)
            for path in sorted(paths.paths):
                if path.endswith(".go"):
                    dirs[posixpath.dirname(path)].append(path)
        return dirs.get(directory, [])

    def imports_all(self, imported) -> bool:
        return imported.alias != "_"  # a blank import only runs the package's init

    def visible(self, paths: RepoPaths, path: str) -> list[str]:
        return [p for p in self.package(paths, posixpath.dirname(path)) if p != path]

    def resolve(self, paths: RepoPaths, importer: str, module: str) -> list[str]:
        """``example.com/shop/store`` -> the .go files of the package directory ``store``.

        A directory the import path ends with wins (the longest); else, for a module kept in
        a subdirectory, the directory ending with the path's longest tail of two or more
        segments, when only one does. One-segment paths (``fmt``, ``log``) are the standard
        library's; a package never imports itself.
        """
        segments = [s for s in module.strip("/").split("/") if s]
        if len(segments) < 2:
            return []
        module = "/".join(segments)
        self.package(paths, "")
        packages = paths.cache["go"]
        own = posixpath.dirname(importer)
        dirs = [d for d in packages if d and d != own]
        exact = [d for d in dirs if module == d or module.endswith("/" + d)]
        if exact:
            return list(packages[max(exact, key=len)])
        for start in range(len(segments) - 1):
            tail = "/".join(segments[start:])
            found = [d for d in dirs if d.endswith("/" + tail)]
            if len(found) == 1:
                return list(packages[found[0]])
            if found:
                return []  # several packages end the same way: not guessed
        return []


class RustModules(LanguageModules):
    """Modules are files (a.rs or a/mod.rs), crates are directories with src/."""

    def resolve(self, paths: RepoPaths, importer: str, module: str) -> list[str]:
        parts = [p for p in module.split("::") if p]
        if not parts:
            return []
        head, rest = parts[0], parts[1:]
        if head in ("self", "super"):
            base = self._module_dir(importer)
            while parts and parts[0] in ("self", "super"):
                if parts.pop(0) == "super":
                    base = posixpath.dirname(base)
            return self._module(paths, base, parts)
        crate = self._crate_dir(paths, importer)
        if head == "crate":
            if crate is not None:
                found = self._module(paths, crate, rest)
                if found:
                    return found
            stem = "/".join(rest)
            if not stem:
                return []
            return paths.suffix(
                f"src/{stem}.rs", f"src/{stem}/mod.rs", f"{stem}.rs", f"{stem}/mod.rs"
            )
        # A bare path: a child module (2018 paths), a crate-root module (2015 paths), or
        # another crate of the workspace, by its directory.
        found = self._module(paths, self._module_dir(importer), parts)
        if not found and crate is not None:
            found = self._module(paths, crate, parts)
        if found:
            return found
        stem = "/".join(rest)
        for name in dict.fromkeys((head, head.replace("_", "-"))):
            if stem:
                found = paths.suffix(f"{name}/src/{stem}.rs", f"{name}/src/{stem}/mod.rs")
            else:
                found = paths.suffix(f"{name}/src/lib.rs")
            if found:
                return found
        return []

    @staticmethod
    def _module(paths: RepoPaths, directory: str, parts: list[str]) -> list[str]:
        """The file of module ``parts`` below the module whose children live in ``directory``."""
        stem = posixpath.join(directory, *parts) if parts else directory
        if parts or directory:
            found = paths.exact(f"{stem}.rs", f"{stem}/mod.rs")
            if found or parts:
                return found
        return paths.exact(posixpath.join(stem, "lib.rs"), posixpath.join(stem, "main.rs"))

    @staticmethod
    def _module_dir(path: str) -> str:
        """Where a file's child modules live: ``src/a.rs`` and ``src/a/mod.rs`` -> ``src/a``."""
        directory, name = posixpath.split(path)
        if name in ("mod.rs", "lib.rs", "main.rs"):
            return directory
        return posixpath.join(directory, name[: -len(".rs")] if name.endswith(".rs") else name)

    @staticmethod
    def _crate_dir(paths: RepoPaths, path: str) -> str | None:
        """The nearest directory above ``path`` holding lib.rs or main.rs (a crate root)."""
        directory = posixpath.dirname(path)
        while True:
            roots = (posixpath.join(directory, "lib.rs"), posixpath.join(directory, "main.rs"))
            if paths.exact(*roots):
                return directory
            if not directory:
                return None
            directory = posixpath.dirname(directory)


class ScriptModules(LanguageModules):
    """JavaScript and TypeScript: './x' and '../x' against the importer's directory: x itself,
    x.<ext>, x/index.<ext>, the extensions tried in the language's order. Bare specifiers
    ('react', '@scope/pkg') name packages outside the repository."""

    def __init__(self, extensions: tuple[str, ...]):
        self.extensions = extensions

    def resolve(self, paths: RepoPaths, importer: str, module: str) -> list[str]:
        if module not in (".", "..") and not module.startswith(("./", "../")):
            return []
        stem = posixpath.normpath(posixpath.join(posixpath.dirname(importer), module))
        if stem == ".." or stem.startswith("../"):
            return []
        stem = "" if stem == "." else stem
        candidates = [stem] if stem else []
        root, ext = posixpath.splitext(stem)
        if ext in (".js", ".jsx", ".mjs", ".cjs"):
            # TypeScript's ESM style names the compiled file: './x.js' is x.ts in the source.
            candidates += [root + e for e in self.extensions]
        if stem:
            candidates += [stem + e for e in self.extensions]
        candidates += [posixpath.join(stem, "index" + e) for e in self.extensions]
        return paths.exact(*candidates)


JAVASCRIPT_MODULES = ScriptModules(
    (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx", ".mts", ".cts", ".d.ts"))
TYPESCRIPT_MODULES = ScriptModules(
    (".ts", ".tsx", ".d.ts", ".mts", ".cts", ".js", ".jsx", ".mjs", ".cjs"))


class JavaModules(LanguageModules):
    """A package is a directory, a top-level class a file; a package's classes see each other
    without imports."""

    def package(self, paths: RepoPaths, directory: str) -> list[str]:
        """The .java files directly in ``directory``, or in any directory ending with it."""
        dirs = paths.cache.get("java")
        if dirs is None:
            dirs = paths.cache["java"] = defaultdict(list)
            for path in sorted(paths.paths):
                if path.endswith(".java"):
                    parts = posixpath.dirname(path).split("/")
                    for index in range(len(parts)):
                        dirs["/".join(parts[index:])].append(path)
        return dirs.get(directory, [])

    def visible(self, paths: RepoPaths, path: str) -> list[str]:
        return [p for p in self.package(paths, posixpath.dirname(path)) if p != path]

    def resolve(self, paths: RepoPaths, importer: str, module: str) -> list[str]:
        """``a.b`` (from ``import a.b.C`` or ``a.b.*``) -> the files of package directory a/b.

        The imported name picks its class out of them (C.java defines C). A static or nested
        import names a class: ``a.b.Util`` (``import static a.b.Util.max``) -> a/b/Util.java.
        """
        stem = module.replace(" ", "").replace(".", "/")
        return list(paths.suffix(f"{stem}.java")) or self.package(paths, stem)


class CModules(LanguageModules):
    """C and C++: ``#include "x.h"`` is a path, and brings in all that x.h (and its
    implementation file) defines; a header and its implementation file see each other."""

    HEADERS = (".h", ".hh", ".hpp", ".hxx", ".h++", ".inl", ".ipp")
    SOURCES = (".c", ".cc", ".cpp", ".cxx", ".c++")

    def imports_all(self, imported) -> bool:
        return True

    def visible(self, paths: RepoPaths, path: str) -> list[str]:
        """x.h's implementation files beside it (x.c, x.cc, x.cpp, ...), or x.c's headers."""
        stem, ext = posixpath.splitext(path)
        ext = ext.lower()
        others = (self.SOURCES if ext in self.HEADERS
                  else self.HEADERS if ext in self.SOURCES else ())
        return [stem + e for e in others if stem + e in paths.paths]

    def resolve(self, paths: RepoPaths, importer: str, module: str) -> list[str]:
        """``"x.h"`` next to the importer, else any x.h by path suffix (``<x.h>`` only so),
        plus the header's implementation file: x.c/x.cc/x.cpp beside it, or the only one."""
        system = module.startswith("<")
        # The answer depends on the importer's directory only; big C trees repeat includes.
        key = (None if system else posixpath.dirname(importer), module)
        cache = paths.cache.setdefault("c", {})
        if key not in cache:
            cache[key] = self._resolve(paths, importer, module, system)
        return cache[key]

    def _resolve(self, paths: RepoPaths, importer: str, module: str, system: bool) -> list[str]:
        name = posixpath.normpath(module.strip("<>\" \t"))
        headers: list[str] = []
        if not system:
            local = posixpath.normpath(posixpath.join(posixpath.dirname(importer), name))
            headers = paths.exact(local)
        if not headers:
            while name.startswith("../"):  # relative to an include dir we don't know
                name = name[3:]
            headers = list(paths.suffix(name))
        found = list(headers)
        for header in headers:
            stem, ext = posixpath.splitext(header)
            if ext.lower() not in self.HEADERS:
                continue
            sources = paths.exact(*(stem + e for e in self.SOURCES))
            if not sources:
                base = posixpath.basename(stem)
                unique = [paths.suffix(base + e) for e in self.SOURCES]
                unique = [path for found_paths in unique for path in found_paths]
                sources = unique if len(unique) == 1 else []
            found += [path for path in sources if path not in found]
        return found


NO_MODULES = LanguageModules()
C_MODULES = CModules()
