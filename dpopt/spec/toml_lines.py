"""Line numbers of TOML keys, for error messages that point at the line.

``tomllib`` forgets where each key was. :func:`key_lines` walks the same (already valid) text
and records the line of every key path, e.g. ``("measure", 1, "share")`` for the share key of
the second ``[[measure]]`` table. Best effort: on anything it does not follow it stops and
keeps what it found (a missing line only makes a message less precise).
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["key_lines"]


def key_lines(text: str) -> dict[tuple, int]:
    """Map every key path of a (valid) TOML document to its 1-based line number."""
    scanner = _Scanner(text)
    try:
        scanner.document()
    except (IndexError, ValueError):
        pass
    return scanner.found


_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.t = text
        self.n = len(text)
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.found: dict[tuple, int] = {}

    # ---- helpers ------------------------------------------------------------------------
    def record(self, path: tuple, pos: int) -> None:
        self.found.setdefault(path, bisect_right(self.starts, pos))

    def skip(self, pos: int, newlines: bool = True) -> int:
        """Skip blanks (and newlines and comments when ``newlines``)."""
        t, n = self.t, self.n
        while pos < n:
            c = t[pos]
            if c in " \t\r" or (newlines and c == "\n"):
                pos += 1
            elif c == "#" and newlines:
                end = t.find("\n", pos)
                pos = n if end < 0 else end + 1
            else:
                break
        return pos

    def string(self, pos: int) -> tuple[str, int]:
        """Read a quoted string at ``pos``; return its raw content and the position after it."""
        t = self.t
        for quote in ('"""', "'''"):
            if t.startswith(quote, pos):
                end = pos + 3
                while True:
                    end = t.index(quote, end)
                    if quote == "'''" or not _escaped(t, end):
                        break
                    end += 1
                while t.startswith(quote[0], end + 3):  # up to two quotes may end the content
                    end += 1
                return t[pos + 3 : end], end + 3
        quote = t[pos]
        end = pos + 1
        while True:
            end = t.index(quote, end)
            if quote == "'" or not _escaped(t, end):
                break
            end += 1
        return t[pos + 1 : end], end + 1

    def key(self, pos: int) -> tuple[tuple[str, ...], int]:
        """Read a (dotted) key; return its parts and the position after it."""
        parts = []
        while True:
            pos = self.skip(pos, newlines=False)
            if self.t[pos] in "\"'":
                part, pos = self.string(pos)
            else:
                start = pos
                while pos < self.n and self.t[pos] in _BARE:
                    pos += 1
                if pos == start:
                    raise ValueError("no key")
                part = self.t[start:pos]
            parts.append(part)
            pos = self.skip(pos, newlines=False)
            if pos < self.n and self.t[pos] == ".":
                pos += 1
                continue
            return tuple(parts), pos

    # ---- grammar --------------------------------------------------------------------------
    def document(self) -> None:
        table: tuple = ()
        arrays: dict[tuple, int] = {}  # array-of-tables path -> number of tables so far
        pos = 0
        while True:
            pos = self.skip(pos)
            if pos >= self.n:
                return
            if self.t[pos] == "[":
                double = self.t.startswith("[[", pos)
                parts, end = self.key(pos + (2 if double else 1))
                resolved: list = []
                for i, part in enumerate(parts):
                    resolved.append(part)
                    last = i == len(parts) - 1
                    if tuple(resolved) in arrays and not (double and last):
                        resolved.append(arrays[tuple(resolved)] - 1)
                if double:
                    base = tuple(resolved)
                    index = arrays.get(base, 0)
                    arrays[base] = index + 1
                    table = base + (index,)
                else:
                    table = tuple(resolved)
                self.record(table, pos)
                pos = self.t.index("]", end) + (2 if double else 1)
            else:
                pos = self.keyval(pos, table)

    def keyval(self, pos: int, prefix: tuple) -> int:
        start = pos
        parts, pos = self.key(pos)
        if self.t[pos] != "=":
            raise ValueError("expected '='")
        path = prefix + parts
        self.record(path, start)
        return self.value(pos + 1, path)

    def value(self, pos: int, path: tuple) -> int:
        pos = self.skip(pos, newlines=False)
        c = self.t[pos]
        if c == "[":
            return self.array(pos, path)
        if c == "{":
            return self.inline(pos, path)
        if c in "\"'":
            return self.string(pos)[1]
        while pos < self.n and self.t[pos] not in ",]}\n#":
            pos += 1
        return pos

    def array(self, pos: int, path: tuple) -> int:
        pos += 1
        index = 0
        while True:
            pos = self.skip(pos)
            if self.t[pos] == "]":
                return pos + 1
            self.record(path + (index,), pos)
            pos = self.value(pos, path + (index,))
            pos = self.skip(pos)
            if self.t[pos] == ",":
                pos += 1
                index += 1

    def inline(self, pos: int, path: tuple) -> int:
        pos += 1
        while True:
            pos = self.skip(pos)
            if self.t[pos] == "}":
                return pos + 1
            pos = self.keyval(pos, path)
            pos = self.skip(pos)
            if self.t[pos] == ",":
                pos += 1


def _escaped(text: str, pos: int) -> bool:
    """True when the character at ``pos`` is preceded by an odd number of backslashes."""
    count = 0
    while pos - count - 1 >= 0 and text[pos - count - 1] == "\\":
        count += 1
    return count % 2 == 1
