"""The registry of export formats (pvisor.adapters.exports, issue 36): every format declares its
writer and capabilities, the commands offer exactly what the registry holds, and a format
registered in this process is offered and called by ``pvisor journal export``, ``pvisor
trajectory export`` and ``pvisor report`` with no other change. The CLI is driven in process
(``pvisor.cli.main(argv)``) against a journal written by the real writer and a real native file."""

from __future__ import annotations

import tomllib
from pathlib import Path

import orjson
import pytest
from native_helpers import native_dir

from cli_inprocess import pvisor
from pvisor.adapters.exports import FORMATS, format_names, formats, get_format, register, unregister
from pvisor.adapters.exports.base import (
    ExportFormat,
    JournalSource,
    NativeSource,
    Option,
    Output,
    Settings,
    Source,
    Written,
)
from pvisor.journal.model import Run
from pvisor.journal.writer import Journal

REPO = Path(__file__).resolve().parents[1]
CODEX_ROLLOUT = native_dir() / "codex" / "real-0.171.0_single-then-resume.jsonl"


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "j.sqlite"
    with Journal.open(path) as j:
        j.create_run(Run(id="r-1", agent="codex"))
        j.record_exchange(
            "r-1", "POST", "/v1/responses", [], protocol="openai-responses", status=200, request_body=b"{}"
        )
    return path


@pytest.fixture
def fake():
    """Register formats for one test and take them back after it."""
    names: list[str] = []

    def add(fmt: ExportFormat) -> ExportFormat:
        register(fmt)
        names.append(fmt.name)
        return fmt

    yield add
    for name in names:
        unregister(name)


def test_every_registered_format_declares_a_writer_and_its_capabilities():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert format_names() == list(FORMATS)
    for name in format_names():
        fmt = get_format(name)
        assert fmt.name == name and callable(fmt.write), name
        assert fmt.accepts and fmt.accepts <= set(Source), name
        assert all(isinstance(text, str) and text for text in fmt.describe.values()), name
        assert fmt.reads <= set(Option) and isinstance(fmt.output, Output), name
        assert fmt.unit and fmt.extension and not fmt.extension.startswith("."), name
        if fmt.extra is not None:  # the extra exists and installs the module the format needs
            assert any(req.startswith(fmt.extra.module) for req in extras[fmt.extra.name]), name
    assert get_format("parquet").extra.module == "pyarrow" and get_format("parquet").binary
    assert get_format("report").output is Output.FILES and get_format("report").extension == "html"
    with pytest.raises(KeyError):
        get_format("no-such-format")


def _format_param(command):
    [param] = [p for p in command.params if p.name == "fmt"]
    return param


def test_format_choices_and_help_are_the_registrys(capsysbinary, journal):
    from pvisor.commands.journal import export as journal_export
    from pvisor.commands.trajectory import export as trajectory_export

    journal_formats = [f.name for f in formats(Source.RUN, Output.STREAM)]
    native_formats = [f.name for f in formats(Source.NATIVE, Output.STREAM)]
    assert journal_formats == ["jsonl", "atif", "otel", "har", "rows", "parquet"]
    assert native_formats == ["atif", "rows", "parquet", "json"]
    assert list(_format_param(journal_export).type.choices) == journal_formats
    assert list(_format_param(trajectory_export).type.choices) == native_formats

    code, out, _ = pvisor(capsysbinary, "--journal", str(journal), "journal", "export", "--help")
    text = " ".join(out.decode().split())
    assert code == 0 and f"--format [{'|'.join(journal_formats)}]" in text
    for f in formats(Source.RUN, Output.STREAM):
        assert "".join(f"{f.name}: {f.describe[Source.RUN]}".split()) in "".join(text.split())
    code, out, _ = pvisor(capsysbinary, "trajectory", "export", "--help")
    text = " ".join(out.decode().split())
    assert code == 0 and "--format [atif|rows|parquet|json]" in text
    # click wraps the help where it likes (after a hyphen too): compared without the white space
    assert "atif:HarborATIFv1.7;rows:oneJSONrowpermain-loopstep" in "".join(text.split())
    assert "json:pvisor.native-trajectory/v1." in "".join(text.split())


def test_a_format_registered_in_the_process_is_offered_and_called_by_journal_export(
    capsysbinary, journal, tmp_path, fake
):
    calls = []

    def write(source, out, settings):
        calls.append((source, settings))
        out.write(f"fake of {source.run_id}\n".encode())
        return Written(1)

    fake(
        ExportFormat(
            name="fake",
            describe={Source.RUN: "a format of this test"},
            write=write,
            unit="marks",
            extension="fake",
            reads=frozenset({Option.NO_BODIES}),
        )
    )
    code, out, _ = pvisor(capsysbinary, "--journal", str(journal), "journal", "export", "--help")
    text = " ".join(out.decode().split())
    assert "[jsonl|atif|otel|har|rows|parquet|fake]" in text and "fake: a format of this test" in text
    assert "Leave the bodies out (jsonl, har, rows, parquet, fake)" in text

    target = tmp_path / "out" / "run.fake"
    code, out, err = pvisor(
        capsysbinary, "--journal", str(journal), "journal", "export", "r-1", "--format", "fake",
        "--no-bodies", "-o", str(target), "--json",
    )  # fmt: skip
    assert code == 0, err
    assert target.read_bytes() == b"fake of r-1\n"
    assert orjson.loads(out) == {"path": str(target), "format": "fake", "count": 1, "unit": "marks"}
    [(source, settings)] = calls
    assert isinstance(source, JournalSource) and source.run_id == "r-1"
    assert settings.bodies is False and settings.with_content is False

    # to stdout, and the capabilities it declared decide the refusals
    code, out, err = pvisor(
        capsysbinary, "--journal", str(journal), "journal", "export", "r-1", "--format", "fake"
    )
    assert (code, out) == (0, b"fake of r-1\n"), err
    code, _, err = pvisor(capsysbinary, "--journal", str(journal), "journal", "export", "--format", "fake")
    assert code == 2
    assert err == "pvisor: error: --format fake exports one run: give RUN (pvisor journal ls lists them)\n"
    code, _, err = pvisor(
        capsysbinary,
        "--journal",
        str(journal),
        "journal",
        "export",
        "r-1",
        "--format",
        "fake",
        "--with-content",
    )
    assert (code, err) == (2, "pvisor: error: --with-content is for --format otel\n")
    assert len(calls) == 2

    # a format that takes no native file is not offered by trajectory export
    code, _, err = pvisor(capsysbinary, "trajectory", "export", str(CODEX_ROLLOUT), "--format", "fake")
    assert code == 2 and "'fake' is not one of 'atif', 'rows', 'parquet', 'json'" in err


@pytest.mark.parametrize("name", [n for n in FORMATS if n not in ("atif", "rows", "parquet", "json")])
def test_a_format_that_takes_no_native_file_is_refused_by_trajectory_export(capsysbinary, name):
    assert Source.NATIVE not in get_format(name).accepts
    code, out, err = pvisor(capsysbinary, "trajectory", "export", str(CODEX_ROLLOUT), "--format", name)
    assert (code, out) == (2, b"")
    assert err == (
        f"pvisor: error: Invalid value for '--format': '{name}' is not one of "
        "'atif', 'rows', 'parquet', 'json' "
        "(see 'pvisor trajectory export --help')\n"
    )


def test_a_native_format_registered_in_the_process_is_called_by_trajectory_export(capsysbinary, fake):
    seen = []

    def write(source, out, settings):
        seen.append(source)
        out.write(f"{source.adapter}: {len(source.result.trajectory.steps)} steps\n".encode())
        return Written(len(source.result.trajectory.steps))

    fake(
        ExportFormat(
            name="steps-count",
            describe={Source.NATIVE: "a format of this test"},
            write=write,
            unit="steps",
            extension="txt",
        )
    )
    code, out, err = pvisor(
        capsysbinary,
        "trajectory",
        "export",
        str(CODEX_ROLLOUT),
        "--format",
        "steps-count",
        "--agent",
        "codex",
    )
    assert code == 0, err
    [source] = seen
    assert isinstance(source, NativeSource) and source.adapter == "codex"
    assert out == f"codex: {len(source.result.trajectory.steps)} steps\n".encode()
    # a journal command does not offer it
    code, out, err = pvisor(capsysbinary, "journal", "export", "--format", "steps-count")
    assert (
        code == 2 and "'steps-count' is not one of 'jsonl', 'atif', 'otel', 'har', 'rows', 'parquet'" in err
    )


def test_pvisor_report_writes_through_the_registry(capsysbinary, journal, tmp_path, monkeypatch, fake):
    # the report is the registry's format "report": a format registered under that name replaces
    # it, and pvisor report calls it with the path and options it was given
    calls = []

    def write(source, output, settings):
        calls.append((source.run_id, output, settings))
        output.write_text("a page\n")
        return Written(1, (output,))

    real = get_format("report")
    fake(
        ExportFormat(
            name="report",
            describe=real.describe,
            write=write,
            unit=real.unit,
            extension="page",
            reads=real.reads,
            output=Output.FILES,
        )
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = pvisor(
        capsysbinary, "--journal", str(journal), "report", "r-1", "--body-limit", "2KiB", "--no-parent"
    )
    assert code == 0, err
    assert out == b"r-1.page\n" and (tmp_path / "r-1.page").read_text() == "a page\n"
    [(run_id, output, settings)] = calls
    assert (run_id, output) == ("r-1", Path("r-1.page"))
    assert settings == Settings(body_limit=2048, with_parent=False)
