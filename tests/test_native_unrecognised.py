"""A file no native adapter recognises says why when that is knowable without an adapter (issue
41 fixes): empty, not UTF-8 (random bytes, UTF-16), plain text, a document cut off; still exit 65
with the --agent hint. The CLI runs in process (``pvisor.cli.main``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_inprocess import pvisor

# a document no adapter's detection takes (a recognised one cut off is the adapter's to name)
DOC = b'{"steps": [{"n": 1, "text": "a"},\n  {"n": 2, "text": "b"}]}'


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "it is empty"),
        (b"\n\n  \n", "it holds only blank lines"),
        (bytes(range(128, 256)) * 4, "it is not UTF-8 text, from byte 0"),
        ('{"a": 1}\n'.encode("utf-16"), "it is UTF-16 text"),
        (b"hello world\nplain text\n", "its first line is not JSON"),
        (DOC[:-20], "its JSON is cut off before the document ends"),
    ],
    ids=["empty", "blank", "bytes", "utf16", "text", "cut"],
)
def test_an_unrecognised_file_says_why(capsysbinary, tmp_path: Path, content: bytes, why: str):
    f = tmp_path / "t.traj.json"
    f.write_bytes(content)
    for command in ("export", "show"):
        argv = ["trajectory", command, str(f)] + (["--format", "json"] if command == "export" else [])
        code, _, err = pvisor(capsysbinary, *argv)
        assert code == 65, err
        assert f"no native adapter recognises this file ({why}" in err and "give --agent (one of" in err, err
        assert err.count("\n") == 1
