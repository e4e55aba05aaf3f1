"""What counting ParameterStatus (session 25) adds to the relay's upstream→client scanner:
``BoundaryScanner.feed`` of this checkout against the one of 5ac7d65 (the commit before),
alternating blocks over the same bytes: pgbench -S replies (RowDescription, DataRow,
CommandComplete, ReadyForQuery, one chunk each) and a large result (10,000 DataRows in
64 KiB chunks). Run from the checkout's root: ``.venv/bin/python
bench/results/scanner-s25/scanner_cost.py``."""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from imp_proxy.protocol import framing

BEFORE = "5ac7d65"
ROW_DESCRIPTION = (b"T\x00\x00\x00\x21\x00\x01abalance\x00\x00\x00\x40\x01\x00\x03"
                   b"\x00\x00\x00\x17\x00\x04\xff\xff\xff\xff\x00\x00")
SMALL = [ROW_DESCRIPTION, b"D\x00\x00\x00\x0b\x00\x01\x00\x00\x00\x01" + b"0",
         b"C\x00\x00\x00\x0dSELECT 1\x00", b"Z\x00\x00\x00\x05I"]
ROW = b"D\x00\x00\x00\x18\x00\x02\x00\x00\x00\x04" + b"1234" + b"\x00\x00\x00\x06" + b"abcdef"


def _old_framing() -> ModuleType:
    text = subprocess.run(["git", "show", f"{BEFORE}:imp_proxy/protocol/framing.py"],
                          check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "framing_before.py"
    path.write_text(text.replace("from ._struct", "from imp_proxy.protocol._struct")
                    .replace("from .messages", "from imp_proxy.protocol.messages"))
    spec = importlib.util.spec_from_file_location("framing_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["framing_before"] = module
    spec.loader.exec_module(module)
    return module


def _block(scanner_class: type, chunks: list[bytes], repeat: int) -> float:
    """Microseconds per ``repeat`` passes over ``chunks``, on a new scanner."""
    s = scanner_class()
    started = time.perf_counter()
    for _ in range(repeat):
        for chunk in chunks:
            s.feed(chunk)
    return (time.perf_counter() - started) * 1e6


def main() -> None:
    old = _old_framing().BoundaryScanner
    stream = ROW * 10_000 + SMALL[2] + SMALL[3]
    big = [stream[i:i + 65536] for i in range(0, len(stream), 65536)]
    for scanner_class in (old, framing.BoundaryScanner):   # the bytes are what they claim
        s = scanner_class()
        assert sum(s.feed(c) for c in big) == 1 and s.at_boundary
        assert sum(s.feed(c) for c in SMALL) == 1 and s.at_boundary
    for name, chunks, repeat, per in (("pgbench -S reply", SMALL, 20_000, 20_000),
                                      ("10,000-row result", big, 20, 20)):
        pairs = [(_block(old, chunks, repeat), _block(framing.BoundaryScanner, chunks, repeat))
                 for _ in range(9)]
        before = statistics.median(a for a, _ in pairs) / per
        after = statistics.median(b for _, b in pairs) / per
        print(f"{name}: before {before:.2f} µs, after {after:.2f} µs per reply,"
              f" ratio {after / before:.3f} (9 alternating blocks)")


if __name__ == "__main__":
    main()
