#!/usr/bin/env python3
"""What the builds and tests use, against what setup installs.

    scripts/check-setup.py [--repo DIR] [--no-present]
    scripts/check-setup.py --steps 10-base,20-host-tuning


Cordon's machines are never fresh: a rust target, a Debian package or a tool installed by hand
once hides a setup step that a new machine (and so a newcomer, and CI) lacks. This check reads
both sides from the tree itself, so it holds on any machine:

- **used**, read from the scripts, the Makefile, .ci/run, cargo's configuration, the Rust
  sources and the Python files: every rustup target a build names (a triple rustup knows, other
  than the host's), every program a script or test runs (a shell command word,
  `Command::new("…")` / `which("…")` / an absolute `/usr/bin/…` literal in Rust, a
  `subprocess` argv in Python), every cargo subcommand, and every Python module imported or run
  with `-m` by the host's Python (not the standard library, not the repository's own);
- **installed by setup**, read from scripts/setup.d: the arguments of `apt_install`,
  `apt-get install`, `rustup_target_add`, `pip_install` and `cargo install`, and the programs
  `go_build MODULE VERSION NAME=PACKAGE…` builds from pinned Go modules (the cluster's, in
  $(cordon_data_dir)/k8s/bin).

A program is accounted for when the Debian package that holds it (dpkg -S) is installed by a
setup step, or is part of every Debian system (Essential, or Priority required), or when it is
one of the tools this kind of machine comes with (IMAGE_TOOLS; docs of the machine kind). A
used item setup does not install fails the check, naming the file and line that uses it and
the fix. Unless --no-present is given, every item setup declares must also be present now
(setup.sh runs this at its end, so a missing piece fails setup by name, never a build later).
With --steps (what a partial setup, `scripts/setup.sh PART...`, ran), only what those steps
declare is checked to be present: the rest of the tree may use what a later `cordon setup TIER`
installs.
Exit status: 0 when all is accounted for, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Tools every machine of this kind (`polyglot`) has before anything is installed, outside
# Debian's packages: the rustup toolchain and its proxies, the image's CPython, git, node under
# /usr/local and Go under /usr/local/go. cargo-nextest is not one of them (the earlier kind had
# it; this one does not), so nothing may use it unless a step installs it.
IMAGE_TOOLS = {
    "cargo", "rustc", "rustup", "rustfmt", "rustdoc", "cargo-fmt", "cargo-clippy",
    "clippy-driver", "git", "python3", "pip", "pip3", "node", "npm", "npx", "go", "gofmt",
}
# Python modules the machine's CPython comes with beyond its standard library.
IMAGE_MODULES = {"__future__", "pip"}
# cargo's own subcommands (and rustup's components).
CARGO_BUILTIN = {
    "add", "bench", "build", "check", "clean", "clippy", "config", "doc", "fetch", "fix", "fmt",
    "generate-lockfile", "help", "info", "init", "install", "locate-project", "login",
    "logout", "metadata", "new", "owner", "package", "pkgid", "publish", "remove", "report",
    "run", "rustc", "rustdoc", "search", "test", "tree", "uninstall", "update", "vendor",
    "verify-project", "version", "yank",
}
TRIPLE = re.compile(r"\b(?:x86_64|aarch64|i686|riscv64gc|wasm32|wasm64|armv7|arm)-[a-z0-9_]+(?:-[a-z0-9_.]+){0,2}\b")
COMMAND_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9._+-]*$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
# Words after which the next word is run as a command, and wrappers that run their argument.
SEPARATORS = {";", "|", "||", "&&", "&", "(", "((", "{", "then", "do", "else", "elif", "if",
              "while", "until", "!", "time", "$(", "`", ";;", "|&"}
WRAPPERS = {"sudo", "exec", "nohup", "nice", "command", "builtin", "xargs", "env", "timeout",
            "flock", "setsid", "stdbuf", "unbuffer"}
# Wrappers whose first non-flag argument is not the command (flock LOCKFILE, timeout SECONDS).
WRAPPER_ARG = {"flock": 1, "timeout": 1}


@dataclass
class Use:
    where: str  # file:line


@dataclass
class Found:
    targets: dict[str, list[Use]] = field(default_factory=dict)
    commands: dict[str, list[Use]] = field(default_factory=dict)
    cargo_subcommands: dict[str, list[Use]] = field(default_factory=dict)
    modules: dict[str, list[Use]] = field(default_factory=dict)

    def add(self, kind: dict[str, list[Use]], name: str, where: str) -> None:
        kind.setdefault(name, []).append(Use(where))


@dataclass
class Declared:
    apt: dict[str, str] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)
    pip: dict[str, str] = field(default_factory=dict)
    cargo_bins: dict[str, str] = field(default_factory=dict)
    go_bins: dict[str, str] = field(default_factory=dict)


def run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


def tracked_files(repo: Path) -> list[Path]:
    out = run(["git", "-C", str(repo), "ls-files", "--cached", "--others", "--exclude-standard"])
    files = [repo / line for line in out.splitlines() if line]
    if not files:  # not a checkout: every file
        files = [p for p in repo.rglob("*") if p.is_file() and "target" not in p.parts]
    return [f for f in files if f.is_file()]


def shell_lines(text: str) -> list[tuple[int, str]]:
    """The logical lines of a shell script (continuations and multi-line quotes joined),
    without heredoc bodies."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    heredoc: str | None = None
    while i < len(lines):
        line = lines[i]
        start = i + 1
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            i += 1
            continue
        while i + 1 < len(lines) and (line.endswith("\\") or not balanced(line)) and i + 1 - start < 40:
            i += 1
            line = (line[:-1] if line.endswith("\\") else line + "\n") + " " + lines[i]
        m = re.search(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?", line)
        if m:
            heredoc = m.group(1)
        out.append((start, line))
        i += 1
    return out


def balanced(line: str) -> bool:
    """Whether every quote opened on this line closes on it."""
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        for _ in lexer:
            pass
    except ValueError:
        return False
    return True


def shell_words(line: str) -> list[str]:
    lexer = shlex.shlex(line.replace("$(", " $( ").replace("`", " ` "), posix=True,
                        punctuation_chars="();<>|&")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = []
    try:
        for w in lexer:
            words.append(w)
    except ValueError:  # an unbalanced quote on this line (a multi-line string): what came before
        pass
    return words


@functools.cache
def bash_reserved() -> frozenset[str]:
    return frozenset(run(["bash", "-c", "compgen -b; compgen -k"]).split())


def strip_arithmetic(line: str) -> str:
    """`line` with each `$(( … ))` replaced by the command substitutions inside it (their
    commands still run; the arithmetic's names are variables, not commands)."""
    out, i = [], 0
    while (start := line.find("$((", i)) != -1:
        depth, j = 0, start + 1
        while j < len(line):
            if line[j] == "(":
                depth += 1
            elif line[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        inner = line[start + 3:j - 1]
        subs = []
        k = 0
        while (m := inner.find("$(", k)) != -1:
            d, e = 0, m + 1
            while e < len(inner):
                d += {"(": 1, ")": -1}.get(inner[e], 0)
                if d == 0:
                    break
                e += 1
            subs.append(inner[m:e + 1])
            k = e + 1
        out.append(line[i:start] + (" ".join(subs) if subs else "0"))
        i = j + 1
    out.append(line[i:])
    return "".join(out)


def shell_commands(line: str) -> list[str]:
    """The command words of one logical shell line."""
    words = shell_words(strip_arithmetic(line))
    cmds = []
    expect = True
    skip = 0
    in_case_pattern = False
    in_array = False
    prev = ""
    prev_word = ""
    for w in words:
        if in_array:
            in_array = w != ")"
            continue
        if w in ("(", "()") and prev.endswith("=") and ASSIGNMENT.match(prev):
            in_array = w == "("  # name=( … ) or name=()
            prev = w
            continue
        prev = w
        if w in ("case",):
            in_case_pattern = True
            expect = False
            continue
        if in_case_pattern:
            continue
        if w == "(" and prev_word == "$(":  # $(( arithmetic ))
            expect = False
            prev_word = w
            continue
        prev_word = w
        if w == ")" or w == "))":
            expect = False
            continue
        if w in SEPARATORS or re.fullmatch(r"[;|&(]+|[;|&]+\)*", w):
            expect = True
            skip = 0
            continue
        if not expect:
            continue
        if skip:
            if not w.startswith("-"):
                skip -= 1
            continue
        if ASSIGNMENT.match(w) or w.startswith("-"):
            continue
        name = w.rsplit("/", 1)[-1] if w.startswith(("/usr/", "/bin/", "/sbin/")) else w
        if name in WRAPPERS:
            cmds.append(name)
            skip = WRAPPER_ARG.get(name, 0)
            continue
        expect = False
        if "$" in w or "/" in w or not COMMAND_WORD.match(name):
            continue
        cmds.append(name)
    return cmds


def makefile_text(text: str) -> str:
    """The Makefile's recipes as shell, its $(VARS) replaced by their values."""
    values = {}
    for m in re.finditer(r"^([A-Z_]+)\s*[?:]?=\s*(.*)$", text, re.M):
        values[m.group(1)] = m.group(2)

    def subst(s: str, depth: int = 0) -> str:
        def one(m: re.Match[str]) -> str:
            v = values.get(m.group(1))
            return subst(v, depth + 1) if v is not None and depth < 5 else "_"
        s = re.sub(r"\$\(([A-Za-z_]+)\)", one, s)
        # make's functions ($(or …), $(shell …)): a word that is no program
        while re.search(r"\$\([^()]*\)", s):
            s = re.sub(r"\$\([^()]*\)", "_", s)
        return s

    recipes = [line[1:] if line.startswith("\t") else "" for line in text.splitlines()]
    return "\n".join(subst(r) for r in recipes)


def python_uses(path: Path, text: str, found: Found, rel: str) -> None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.add(found.modules, a.name.split(".")[0], f"{rel}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(found.modules, node.module.split(".")[0], f"{rel}:{node.lineno}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("run", "Popen", "check_output", "check_call", "call"):
                first = node.args[0].elts[0] if node.args[0].elts else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    name = first.value.rsplit("/", 1)[-1]
                    if COMMAND_WORD.match(name):
                        found.add(found.commands, name, f"{rel}:{node.lineno}")


RUST_COMMAND = re.compile(r'(?:Command::new|\bwhich)\(\s*"([^"/\s]+)"\s*\)|"(?:/usr)?/s?bin/([A-Za-z0-9][A-Za-z0-9._+-]*)"')


def scan(repo: Path) -> Found:
    found = Found()
    known_targets = set(run(["rustup", "target", "list"]).split()) - {"(installed)"}
    host = run(["rustc", "-vV"])
    host_triple = next((line.split()[1] for line in host.splitlines() if line.startswith("host:")), "")
    for f in tracked_files(repo):
        rel = str(f.relative_to(repo))
        if rel.startswith(("docs/", "target/")) or f.suffix in (".md", ".json", ".lock", ".txt"):
            continue
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        # Rust targets, wherever a build or test names one.
        if f.suffix in (".sh", ".rs", ".toml", "") or f.name == "Makefile":
            for n, line in enumerate(text.splitlines(), 1):
                for t in TRIPLE.findall(line):
                    if t in known_targets and t != host_triple:
                        found.add(found.targets, t, f"{rel}:{n}")
        is_shell = f.suffix == ".sh" or rel == ".ci/run"
        if f.name == "Makefile":
            text_sh = makefile_text(text)
            is_shell = True
        else:
            text_sh = text
        if is_shell:
            for n, line in shell_lines(text_sh):
                for c in shell_commands(line):
                    found.add(found.commands, c, f"{rel}:{n}")
        if is_shell:
            for n, line in shell_lines(text_sh):
                # `cargo SUB` as two words, or inside one quoted word (`--also 'deny=cargo deny …'`)
                words = shell_words(line)
                joined = " ".join(words)
                for m in re.finditer(r"(?:^|[\s=/])cargo\s+([a-z][a-z0-9-]*)", joined):
                    found.add(found.cargo_subcommands, m.group(1), f"{rel}:{n}")
                for m in re.finditer(r"\bpython3?\s+-m\s+([A-Za-z_][A-Za-z0-9_]*)", joined):
                    found.add(found.modules, m.group(1), f"{rel}:{n}")
        if f.suffix == ".py" and not rel.startswith("guests/"):
            python_uses(f, text, found, rel)
        if f.suffix == ".rs":
            for n, line in enumerate(text.splitlines(), 1):
                for m in RUST_COMMAND.finditer(line):
                    found.add(found.commands, m.group(1) or m.group(2), f"{rel}:{n}")
    # The scripts' own functions are not programs.
    functions = set()
    for f in tracked_files(repo):
        if f.suffix == ".sh" or f.name == "run":
            try:
                functions |= set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*\(\)", f.read_text(), re.M))
            except (UnicodeDecodeError, OSError):
                pass
    for name in list(found.commands):
        if name in functions or name in bash_reserved():
            del found.commands[name]
    return found


def local_modules(repo: Path) -> set[str]:
    names = set()
    for f in tracked_files(repo):
        if f.suffix == ".py":
            names.add(f.stem)
            if f.name == "__init__.py":
                names.add(f.parent.name)
    return names


def shell_vars(repo: Path) -> dict[str, str]:
    values = {}
    for m in re.finditer(r"^([A-Z_][A-Z0-9_]*)=([^\s$`;]+)$", (repo / "scripts/lib.sh").read_text(), re.M):
        values[m.group(1)] = m.group(2).strip("'\"")
    return values


def declared(repo: Path, steps: set[str] | None = None) -> Declared:
    """What the setup steps install; only the steps named in `steps` (file stems) when given."""
    d = Declared()
    values = shell_vars(repo)

    def resolve(w: str) -> str | None:
        m = re.fullmatch(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", w)
        if m:
            return values.get(m.group(1))
        return None if "$" in w else w

    for f in sorted((repo / "scripts/setup.d").glob("*.sh")):
        if steps is not None and f.stem not in steps:
            continue
        rel = str(f.relative_to(repo))
        for n, line in shell_lines(f.read_text()):
            words = shell_words(line)
            for i, w in enumerate(words):
                rest = words[i + 1:]
                stop = next((k for k, x in enumerate(rest) if x in SEPARATORS or x in (">", ">>", "2>&1")), len(rest))
                args = rest[:stop]
                if w == "apt_install" or (w == "install" and i and words[i - 1] == "apt-get"):
                    skip = False
                    for a in args:
                        if skip:
                            skip = False
                        elif a in ("-t", "--target-release", "-o"):
                            skip = True
                        elif not a.startswith("-") and (r := resolve(a)):
                            d.apt.setdefault(r, f"{rel}:{n}")
                elif w == "rustup_target_add" or (w == "add" and words[i - 2:i] == ["rustup", "target"]):
                    for a in args:
                        if (r := resolve(a)):
                            d.targets.setdefault(r, f"{rel}:{n}")
                elif w == "pip_install" or (w == "install" and i and words[i - 1] == "pip"):
                    for a in args:
                        if not a.startswith("-") and (r := resolve(a)):
                            name = re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]
                            d.pip.setdefault(canonical(name), f"{rel}:{n}")
                elif w == "go_build":
                    for a in args[2:]:
                        name, eq, _pkg = a.partition("=")
                        if eq and COMMAND_WORD.match(name):
                            d.go_bins.setdefault(name, f"{rel}:{n}")
                elif w == "install" and i and words[i - 1] == "cargo":
                    skip = False
                    for a in args:
                        if skip:
                            skip = False
                        elif a in ("--version", "--root", "--git", "--path", "--features", "-j"):
                            skip = True
                        elif not a.startswith("-") and (r := resolve(a)):
                            d.cargo_bins.setdefault(r, f"{rel}:{n}")
    return d


def go_bin_dir() -> Path:
    """Where go_build links what it builds (scripts/lib.sh: go_bin_dir, cordon_data_dir)."""
    if os.environ.get("CORDON_HOME"):
        data = Path(os.environ["CORDON_HOME"])
    elif os.geteuid() == 0:
        data = Path("/var/lib/cordon")
    else:
        data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "cordon"
    return data / "k8s" / "bin"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def dpkg_owner(path: str) -> str | None:
    candidates = [path, os.path.realpath(path)]
    for p in list(candidates):
        for a, b in (("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/"), ("/bin/", "/usr/bin/"), ("/sbin/", "/usr/sbin/")):
            if p.startswith(a):
                candidates.append(b + p[len(a):])
    for p in candidates:
        out = run(["dpkg-query", "-S", p])
        for line in out.splitlines():
            pkgs, _, owned = line.partition(": ")
            if owned.strip() == p and "diversion" not in line:
                return pkgs.split(",")[0].strip().split(":")[0]
    return None


@functools.cache
def base_package(pkg: str) -> bool:
    """Part of every Debian system: Essential, or Priority required."""
    out = run(["dpkg-query", "-W", "-f=${Essential} ${Priority}", pkg]).split()
    return "yes" in out or "required" in out


def which(cmd: str) -> str | None:
    return shutil.which(cmd, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


@functools.cache
def pip_distributions() -> dict[str, list[str]]:
    try:
        from importlib.metadata import packages_distributions
        return packages_distributions()
    except ImportError:
        return {}


def check(repo: Path, present: bool) -> list[str]:
    found = scan(repo)
    decl = declared(repo)
    problems: list[str] = []

    def where(uses: list[Use]) -> str:
        more = f" (+{len(uses) - 2} more)" if len(uses) > 2 else ""
        return ", ".join(u.where for u in uses[:2]) + more

    for t, uses in sorted(found.targets.items()):
        if t not in decl.targets:
            problems.append(f"rust target {t}: used at {where(uses)}, but no setup step adds it; "
                            f"fix: `rustup_target_add {t}` in the setup step of that build (scripts/setup.d)")
    cargo_bin_names = {("cargo-" + b.removeprefix("cargo-")) for b in decl.cargo_bins}
    for sub, uses in sorted(found.cargo_subcommands.items()):
        if sub in CARGO_BUILTIN or f"cargo-{sub}" in cargo_bin_names:
            continue
        problems.append(f"cargo subcommand `cargo {sub}`: used at {where(uses)}, but no setup step installs "
                        f"cargo-{sub}; fix: a `cargo install --locked --version V cargo-{sub}` step in scripts/setup.d")
    for cmd, uses in sorted(found.commands.items()):
        if cmd in IMAGE_TOOLS or f"cargo-{cmd.removeprefix('cargo-')}" in cargo_bin_names and cmd.startswith("cargo-"):
            continue
        if cmd in decl.go_bins:  # built by setup from its Go modules; present: checked below
            continue
        path = which(cmd)
        if path is None:
            problems.append(f"program `{cmd}`: used at {where(uses)}, but it is not on this machine; fix: "
                            "`make setup`, and if no setup step installs the package that holds it, add that "
                            "package to an `apt_install` line in scripts/setup.d")
            continue
        pkg = dpkg_owner(path)
        if pkg is None:
            problems.append(f"program `{cmd}` ({path}): used at {where(uses)}, but no Debian package holds it and it "
                            "is not one of the machine's own tools: it was installed by hand; fix: install it from "
                            "a setup step (scripts/setup.d)")
        elif pkg not in decl.apt and not base_package(pkg):
            problems.append(f"program `{cmd}` (Debian package {pkg}): used at {where(uses)}, but no setup step "
                            f"installs {pkg}; fix: add {pkg} to an `apt_install` line in scripts/setup.d")
    local = local_modules(repo)
    stdlib = set(sys.stdlib_module_names)
    dists = pip_distributions()
    for mod, uses in sorted(found.modules.items()):
        if mod in stdlib or mod in local or mod in IMAGE_MODULES:
            continue
        names = {canonical(n) for n in dists.get(mod, [mod])}
        if not names & set(decl.pip):
            problems.append(f"Python module `{mod}`: imported at {where(uses)}, but no setup step installs "
                            f"{'/'.join(sorted(names))}; fix: `pip_install` it in scripts/setup.d")
    if present:
        problems += missing_here(decl)
    return problems


def missing_here(decl: Declared) -> list[str]:
    """What the steps declare that this machine does not have."""
    problems: list[str] = []
    installed_targets = set(run(["rustup", "target", "list", "--installed"]).split())
    for t, w in sorted(decl.targets.items()):
        if t not in installed_targets:
            problems.append(f"rust target {t} ({w}) is not installed; fix: `rustup target add {t}` "
                            "or `make setup`")
    for p, w in sorted(decl.apt.items()):
        status = run(["dpkg-query", "-W", "-f=${Status}", p])
        if "install ok installed" not in status:
            problems.append(f"Debian package {p} ({w}) is not installed; fix: `make setup` "
                            f"(or `apt-get install {p}`)")
    for p, w in sorted(decl.pip.items()):
        try:
            from importlib.metadata import PackageNotFoundError, distribution
            distribution(p)
            have = True
        except PackageNotFoundError:
            have = False
        if not have:
            problems.append(f"Python package {p} ({w}) is not installed for {sys.executable}; fix: `make setup`")
    for b, w in sorted(decl.cargo_bins.items()):
        if which(b) is None:
            problems.append(f"{b} ({w}) is not installed; fix: `make setup`")
    for b, w in sorted(decl.go_bins.items()):
        if not os.access(go_bin_dir() / b, os.X_OK):
            problems.append(f"{b} ({w}) is not built in {go_bin_dir()}; fix: `make setup`")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--no-present", action="store_true",
                    help="only compare what is used with what setup declares; do not check this machine")
    ap.add_argument("--list", action="store_true", help="print what is used and declared, then check")
    ap.add_argument("--steps", help="only check that what these setup steps (comma-separated names, "
                    "e.g. 10-base,20-host-tuning) declare is present: a partial setup's check")
    args = ap.parse_args()
    repo = args.repo.resolve()
    if args.steps is not None:
        steps = {s.strip().removesuffix(".sh") for s in args.steps.split(",") if s.strip()}
        problems = missing_here(declared(repo, steps))
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        if problems:
            print(f"check-setup: {len(problems)} thing(s) the steps {', '.join(sorted(steps))} install "
                  "are missing", file=sys.stderr)
            return 1
        print(f"check-setup: what the steps {', '.join(sorted(steps))} install is present", file=sys.stderr)
        return 0
    if args.list:
        found, decl = scan(repo), declared(repo)
        for kind in ("targets", "cargo_subcommands", "commands", "modules"):
            print(f"used {kind}: {' '.join(sorted(getattr(found, kind)))}")
        for kind in ("apt", "targets", "pip", "cargo_bins", "go_bins"):
            print(f"setup installs {kind}: {' '.join(sorted(getattr(decl, kind)))}")
    problems = check(repo, present=not args.no_present)
    if problems:
        print(f"check-setup: {len(problems)} thing(s) a build or test uses that setup does not provide:",
              file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print("check-setup: every rust target, program, cargo tool and Python module the builds and tests "
          "use is installed by setup", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
