"""The Python SDK's directory streams (kibotos.access_common.TarSource / TarSink), on real tar
streams through real pipes and threads: what files.upload_dir sends and what files.download_dir
makes of what a server sends. A workspace's tar stream is data from the guest: a hostile or broken
server must not get anything written outside the target directory, through a link, or as a device."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
from kibotos.access_common import TarSink, TarSource


def _entry(
    archive: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o4755 if name.endswith("setuid") else 0o644
    info.uid = info.gid = 4242
    archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _unpack(stream: bytes, into: Path, piece: int = 7) -> None:
    with TarSink(into) as sink:
        for start in range(0, len(stream), piece * 512):
            sink.write(stream[start : start + piece * 512])
        sink.finish()


def _tar(*entries: tuple[str, bytes, bytes, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, kind, data, link in entries:
            _entry(archive, name, kind, data, link)
    return buffer.getvalue()


def test_a_tree_with_symlinks_goes_through_both_ends_as_it_is(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "a" / "b").mkdir(parents=True)
    (source / "a" / "b" / "file").write_bytes(os.urandom(300_000))
    (source / "empty").mkdir()
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o751)
    (source / "relative").symlink_to("a/b/file")
    (source / "absolute").symlink_to("/etc/passwd")
    (source / "dangling").symlink_to("nowhere/at/all")

    with TarSource(source) as tar:
        stream = tar.reader.read()
        while piece := tar.reader.read():
            stream += piece
        tar.check()
    _unpack(stream, tmp_path / "copy")

    copy = tmp_path / "copy"
    assert (copy / "a" / "b" / "file").read_bytes() == (source / "a" / "b" / "file").read_bytes()
    assert (copy / "empty").is_dir() and not list((copy / "empty").iterdir())
    assert stat.S_IMODE((copy / "run.sh").stat().st_mode) == 0o751
    # Links stay links, as written, never followed (the absolute one is not /etc/passwd's content).
    for name in ("relative", "absolute", "dangling"):
        assert (copy / name).is_symlink(), name
        assert os.readlink(copy / name) == os.readlink(source / name), name


# (entry, its type, link target): each refused, the stream's unpacking failing with its reason.
HOSTILE = [
    pytest.param("../outside/escaped", tarfile.REGTYPE, "", id="dot-dot"),
    pytest.param("up/through", tarfile.REGTYPE, "", id="through-a-link"),
    pytest.param("hard", tarfile.LNKTYPE, "/etc/passwd", id="hard-link-out"),
    pytest.param("hard", tarfile.LNKTYPE, "../outside/target", id="hard-link-up"),
]


@pytest.mark.parametrize(("name", "kind", "link"), HOSTILE)
def test_a_hostile_entry_is_refused_and_nothing_lands_outside(
    tmp_path: Path, name: str, kind: bytes, link: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_text("kept")
    into = tmp_path / "into"
    # A link to the outside is kept as a link (as `docker cp` keeps one); what follows may not use it.
    stream = _tar(
        ("fine", tarfile.REGTYPE, b"ok", ""), ("up", tarfile.SYMTYPE, b"", str(outside)), (name, kind, b"x", link)
    )
    with pytest.raises(tarfile.FilterError):
        _unpack(stream, into)
    assert sorted(p.name for p in outside.iterdir()) == ["target"] and (outside / "target").read_text() == "kept"
    assert (into / "fine").read_bytes() == b"ok" and os.readlink(into / "up") == str(outside)
    assert not (into / "hard").exists()


def test_an_absolute_name_lands_inside_and_devices_are_skipped(tmp_path: Path) -> None:
    into = tmp_path / "into"
    _unpack(
        _tar(
            (f"{tmp_path}/outside/absolute", tarfile.REGTYPE, b"x", ""),
            ("device", tarfile.CHRTYPE, b"", ""),
            ("fifo", tarfile.FIFOTYPE, b"", ""),
            ("after", tarfile.REGTYPE, b"still", ""),
        ),
        into,
    )
    assert not (tmp_path / "outside").exists()
    assert (into / str(tmp_path).lstrip("/") / "outside" / "absolute").read_bytes() == b"x"
    assert not (into / "device").exists() and not (into / "fifo").exists()
    assert (into / "after").read_bytes() == b"still"


def test_owners_and_setuid_bits_of_the_stream_are_not_applied(tmp_path: Path) -> None:
    _unpack(
        _tar(("tool-setuid", tarfile.REGTYPE, b"#!", ""), ("link", tarfile.SYMTYPE, b"", "tool-setuid")),
        tmp_path / "into",
    )
    made = tmp_path / "into" / "tool-setuid"
    assert made.stat().st_uid == os.geteuid()
    assert not made.stat().st_mode & stat.S_ISUID
    assert (tmp_path / "into" / "link").lstat().st_uid == os.geteuid()


def test_a_cut_stream_raises_and_a_file_is_no_directory(tmp_path: Path) -> None:
    whole = _tar(("file", tarfile.REGTYPE, b"y" * 10_000, ""))
    with pytest.raises(tarfile.ReadError):
        _unpack(whole[:1536], tmp_path / "cut")  # cut inside a member
    (tmp_path / "plain").write_text("x")
    with pytest.raises(NotADirectoryError):
        TarSource(tmp_path / "plain")
