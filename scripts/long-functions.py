#!/usr/bin/env python3
"""Lists product functions over N lines (default 100; crates/*/src, leaving out tests/, benches/, examples/ and #[cfg(test)] modules), longest first, and prints their count on stderr: issue 50 counts them. A rough brace matcher (strings and comments stripped per line), not a parser.

    scripts/long-functions.py [N] [DIR]
"""
import re, sys, pathlib
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100
root = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "crates")
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
out = []
for p in root.rglob("*.rs"):
    s = str(p)
    if "/tests/" in s or "/benches/" in s or "/examples/" in s or "/target" in s:
        continue
    lines = p.read_text(errors="replace").split("\n")
    # cut at #[cfg(test)] mod
    for i, l in enumerate(lines):
        if l.strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(r'\s*mod\s+\w+', lines[i+1]):
            lines = lines[:i]
            break
    i = 0
    while i < len(lines):
        m = fn_re.match(lines[i])
        if m:
            depth = 0; started = False; j = i
            while j < len(lines):
                code = re.sub(r'//.*', '', lines[j])
                code = re.sub(r'"(\\.|[^"\\])*"', '""', code)
                code = re.sub(r"'(\\.|[^'\\])'", "''", code)
                for ch in code:
                    if ch == '{': depth += 1; started = True
                    elif ch == '}': depth -= 1
                if started and depth <= 0: break
                if not started and code.rstrip().endswith(';'): break
                j += 1
            n = j - i + 1
            if started and n > N:
                out.append((n, s, i + 1, m.group(7)))
            i = i + 1 if not started else i + 1
        i += 1
out.sort(reverse=True)
for n, s, l, name in out:
    print(f"{n:5} {s}:{l} {name}")
print(f"total {len(out)}", file=sys.stderr)
