"""Where a message ends on the wire, so that the parser is fed one message at a time.

No feed of the parser spans two messages, so each wire byte is counted against the message it
belongs to, and parsing can stop between any two: `HeadBudget` finds a head's end within its
budget, `ChunkedEnd` a chunked body's end.
"""

from __future__ import annotations

from optimize.serve.http_layer.limits import HttpLimits, kib

# The head's end, CRLF CRLF: llhttp (strict, as used here) rejects bare LF line ends.
HEAD_END = b"\r\n\r\n"


class HeadBudget:
    """The wire bytes of the head being read (request line and fields, and empty lines before
    them), against a budget of `limit` bytes."""

    __slots__ = ("limit", "line_done", "tail", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reset()

    def reset(self) -> None:
        """A new message begins."""
        self.used = 0
        self.tail = b""  # the head's last 3 bytes, for a CRLF CRLF split across reads
        self.line_done = False  # the request line has ended

    def scan(self, data: bytes, pos: int, n: int) -> int | None:
        """Where to feed up to in `data[pos:n]`: the head's end, or as far as the budget allows.
        None when the budget is spent and the head has not ended: refuse it (`line_done` tells
        a head over its budget from a request line over it)."""
        budget = self.limit - self.used
        stop = min(n, pos + budget)
        if not self.tail:  # the usual case: a whole head in one read
            i = data.find(HEAD_END, pos, stop)
            if i >= 0:
                self.used += i + 4 - pos
                return i + 4
        found = -1
        if self.tail:
            joined = self.tail + data[pos : pos + 3]
            i = joined.find(HEAD_END)
            if i >= 0:
                found = pos + i + 4 - len(self.tail)
        if found < 0:
            i = data.find(HEAD_END, pos, stop)
            found = i + 4 if i >= 0 else -1
        end = found if found >= 0 else stop
        if not self.line_done:
            self.line_done = data.find(b"\n", pos, end) >= 0
        self.used += end - pos
        if found < 0 and end - pos >= budget:
            return None
        self.tail = (self.tail + data[max(pos, end - 3) : end])[-3:]
        return end


class ChunkedEnd:
    """Where a chunked body ends on the wire, so that the parser is fed one message at a time
    and what follows it is counted as the next message's head. llhttp validates the framing;
    this only finds its end, and on input it cannot read it says "not yet" (llhttp then fails
    the request on the same bytes). It also counts the body's chunk-extension bytes."""

    __slots__ = ("ext_done", "left", "line", "size_line", "state")

    # A size line's own bytes: up to 16 hex digits and its CRLF. The rest is extensions.
    _SIZE_LINE_OWN = 18

    def __init__(self) -> None:
        self.state = "size"  # size line, data, CRLF after data, trailer lines
        self.left = 0
        self.line = b""  # the start of a size line split across slices (its hex digits)
        self.size_line = 0  # bytes of the current size line so far, however it was split
        self.ext_done = 0  # extension bytes of the size lines already ended

    @property
    def extension_bytes(self) -> int:
        """Chunk-extension bytes so far (";name=value" after each chunk's size)."""
        return self.ext_done + max(0, self.size_line - self._SIZE_LINE_OWN)

    def scan(self, data: bytes, pos: int, end: int) -> int | None:
        """The position in `data` just past the body's last byte, or None if not in [pos, end)."""
        while pos < end:
            if self.state == "data":
                take = min(self.left, end - pos)
                pos += take
                self.left -= take
                if self.left == 0:
                    self.state = "data-end"
                continue
            lf = data.find(b"\n", pos, end)
            if self.state == "size":
                self.size_line += (end if lf < 0 else lf + 1) - pos
            if lf < 0:
                if self.state == "size":
                    self.line = (self.line + data[pos:end])[:32]  # its hex digits
                elif self.state == "trailer":
                    self.line = (self.line + data[pos:end])[:2]  # enough to tell "\r" from a field
                return None
            line = self.line + data[pos:lf]
            self.line = b""
            pos = lf + 1
            if self.state == "data-end":
                self.state = "size"
            elif self.state == "size":
                self.ext_done = self.extension_bytes
                self.size_line = 0
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self.state = "lost"
                    return None
                self.state, self.left = ("trailer", 0) if size == 0 else ("data", size)
            elif self.state == "trailer":
                if line in (b"", b"\r"):
                    return pos
            else:  # lost: llhttp will reject these bytes
                return None
        return None


def body_wire_refusal(limits: HttpLimits, body_wire: int, chunked_end: ChunkedEnd | None) -> str | None:
    """Why a body that took `body_wire` bytes on the wire so far is refused (413), if it is.

    Every wire byte of a message counts: a chunked body's framing, extensions and trailers may
    add at most one head's budget to its payload's limit, its extensions no more than
    max_chunk_ext_bytes of that."""
    ext = chunked_end.extension_bytes if chunked_end is not None else 0
    if ext > limits.max_chunk_ext_bytes:
        return f"the chunked body's chunk extensions exceed {kib(limits.max_chunk_ext_bytes)}"
    if body_wire > limits.max_body_bytes + limits.max_head_bytes:
        return f"the chunked body's framing and trailers exceed {kib(limits.max_head_bytes)}"
    return None
