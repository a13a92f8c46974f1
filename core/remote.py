"""Traces on object storage: `s3://bucket/prefix`, read and written through pyarrow.fs.

DuckDB's own S3 extension cannot be installed offline, and the reader's safety checks (regular
files only, nothing outside the trace) are made on local files; so a remote trace is mirrored
into a private local folder first, and read from there like any other. Credentials and the
endpoint come from the usual environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL), as pyarrow's S3 client reads them.
`push` writes a local trace back (what `compact` of a remote trace does): new and changed files
up, files gone locally deleted remotely, manifests last.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from vllm_contract import schema
from vllm_contract.errors import TraceError


def as_url(path: str | os.PathLike) -> str | None:
    """The remote URL a path names, or None for a local path. A `Path` made from
    `s3://b/p` has lost a slash (`s3:/b/p`): it is taken back."""
    text = os.fspath(path)
    if text.startswith("s3://"):
        return text.rstrip("/")
    if text.startswith("s3:/"):
        return "s3://" + text[4:].rstrip("/")
    return None


def _filesystem(url: str):
    import pyarrow.fs as pafs

    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    try:
        if endpoint:
            scheme = "https" if endpoint.startswith("https") else "http"
            host = endpoint.split("://", 1)[-1]
            fs = pafs.S3FileSystem(endpoint_override=host, scheme=scheme,
                                   region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        else:
            fs = pafs.S3FileSystem(region=os.environ.get("AWS_DEFAULT_REGION") or None)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for bad settings
        raise TraceError(f"{url}: cannot set up the S3 client: {e}") from None
    return fs, url.split("://", 1)[1]


def _safe_relative(base: str, key: str) -> PurePosixPath:
    rel = PurePosixPath(key).relative_to(base)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise TraceError(f"s3://{key}: a key outside the trace prefix")
    return rel


def _list(fs, base: str, url: str) -> list:
    import pyarrow.fs as pafs

    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as e:
        raise TraceError(f"{url}: cannot list the trace: {str(e).splitlines()[0]}") from None
    return [i for i in infos if i.type == pafs.FileType.File]


def fetch(url: str) -> Path:
    """A private local copy of the remote trace, removed when the process ends."""
    fs, base = _filesystem(url)
    files = _list(fs, base, url)
    if not files:
        raise TraceError(f"{url}: no such trace (nothing under that prefix)")
    local = Path(tempfile.mkdtemp(prefix="vllm-contract-s3-"))
    atexit.register(shutil.rmtree, local, True)
    for info in files:
        rel = _safe_relative(base, info.path)
        if any(p.startswith(".") for p in rel.parts):
            continue  # a writer's temporaries: readers skip them anyway
        target = local.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with fs.open_input_stream(info.path) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except OSError as e:
            raise TraceError(f"s3://{info.path}: cannot read: {str(e).splitlines()[0]}") from None
    return local


def push(local: Path, url: str) -> dict:
    """Make the remote trace equal the local one: upload what is new or of another size,
    delete what is gone, manifests last (a reader never finds a manifest naming files that are
    not there yet)."""
    fs, base = _filesystem(url)
    remote = {str(_safe_relative(base, i.path)): i.size for i in _list(fs, base, url)}
    here = {p.relative_to(local).as_posix(): p for p in sorted(local.rglob("*"))
            if p.is_file() and not any(s.startswith(".") for s in p.relative_to(local).parts)}
    order = sorted(here, key=lambda k: k.endswith(schema.MANIFEST))
    stats = {"uploaded": 0, "deleted": 0}
    try:
        for rel in order:
            path = here[rel]
            if remote.get(rel) == path.stat().st_size and not rel.endswith(schema.MANIFEST):
                continue
            with open(path, "rb") as src, fs.open_output_stream(f"{base}/{rel}") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            stats["uploaded"] += 1
        for rel in remote:
            if rel not in here and not any(s.startswith(".") for s in rel.split("/")):
                fs.delete_file(f"{base}/{rel}")
                stats["deleted"] += 1
    except OSError as e:
        raise TraceError(f"{url}: cannot write: {str(e).splitlines()[0]}") from None
    return stats
