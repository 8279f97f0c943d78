"""`printable`: the one way text a server wrote is shown (terminal, logs, report, JUnit).

A server's error body, event or header can hold anything: CR/LF that start a new line under
loadgen's own (`verdict: SLO MET (exit 0)`), escape sequences that clear the screen or move
the cursor, BEL, NUL, and the Unicode line and paragraph separators some terminals and
viewers break on (U+0085, U+2028, U+2029), or bidirectional overrides that reorder what is
shown. Every such character is shown escaped, as Python writes it (`\\r`, `\\n`, `\\x1b`,
`\\u2028`), so server text always stays on the line loadgen put it on and can draw nothing.
Applying it twice changes nothing (the escaped form is printable).
"""

from __future__ import annotations

import re

# C0 controls and DEL, C1 controls (U+0080-U+009F: NEL, CSI), zero-width and bidi format
# characters, the line/paragraph separators, the BOM and interlinear annotation marks.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069"
    "\ufeff\ufff9-\ufffb]"
)
_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control, separator and format character shown escaped."""
    return _UNSAFE.sub(_escaped, text)
