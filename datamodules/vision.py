"""Download and parse MNIST, EMNIST and CIFAR-10 without torchvision.

On-disk layout (the same as torchvision's, so an existing torchvision data folder works):

* MNIST:    ``<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``
* EMNIST:   ``<root>/EMNIST/raw/emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]``
  (extracted from NIST's ``gzip.zip``, which is kept in the same folder)
* CIFAR-10: ``<root>/cifar-10-batches-py/{data_batch_1..5,test_batch}``
  (extracted from ``<root>/cifar-10-python.tar.gz``)

Every loader returns ``(x, y)`` with ``x`` float32 [N, C, H, W] scaled to [0, 1] and
``y`` int64 [N]. URLs and MD5 sums live in one table, :data:`RESOURCES`.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import pickle
import shutil
import struct
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np
import torch

try:  # numpy >= 2
    from numpy._core import multiarray as _np_multiarray
    from numpy._core import numeric as _np_numeric
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray as _np_multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as _np_numeric  # type: ignore[no-redef]

__all__ = [
    "EMNIST_NUM_CLASSES",
    "EMNIST_SPLITS",
    "RESOURCES",
    "ChecksumError",
    "DownloadError",
    "RemoteSource",
    "download_url",
    "load_cifar10",
    "load_emnist",
    "load_mnist",
    "md5sum",
    "read_idx",
]


# --------------------------------------------------------------------------------------
# Constants: where the files live and what their MD5 sums are.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteSource:
    """Files of one data set: base URLs tried in order, and ``{file name: md5}``."""

    mirrors: tuple[str, ...]
    files: Mapping[str, str | None] = field(default_factory=dict)

    def urls(self, filename: str) -> list[str]:
        """Every candidate URL of ``filename``, one per mirror."""
        return [m.rstrip("/") + "/" + filename for m in self.mirrors]


#: The one table of download locations and checksums (the same as torchvision's).
RESOURCES: dict[str, RemoteSource] = {
    "mnist": RemoteSource(
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        files={
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
    ),
    "emnist": RemoteSource(
        mirrors=("https://biometrics.nist.gov/cs_links/EMNIST/",),
        files={"gzip.zip": "58c8d27c78d21e728a6bc7b3cc06412e"},
    ),
    "cifar10": RemoteSource(
        mirrors=("https://www.cs.toronto.edu/~kriz/",),
        files={"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
    ),
}

#: EMNIST splits and their number of classes ("letters" labels are shifted to 0..25).
EMNIST_NUM_CLASSES: dict[str, int] = {
    "byclass": 62,
    "bymerge": 47,
    "balanced": 47,
    "letters": 26,
    "digits": 10,
    "mnist": 10,
}
EMNIST_SPLITS: tuple[str, ...] = tuple(EMNIST_NUM_CLASSES)

_CIFAR10_FOLDER = "cifar-10-batches-py"
_CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR10_TEST = ("test_batch",)
_CHUNK = 1 << 20


# --------------------------------------------------------------------------------------
# Downloading
# --------------------------------------------------------------------------------------


class DownloadError(RuntimeError):
    """A file could not be fetched (no network, HTTP error, bad checksum, ...)."""


class ChecksumError(DownloadError):
    """A downloaded (or present) file does not have the expected MD5 sum."""


def md5sum(path: str | Path) -> str:
    """Hex MD5 digest of a file, read in 1 MiB chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def download_url(url: str, path: str | Path, md5: str | None = None, timeout: float = 60.0) -> Path:
    """Download ``url`` to the file ``path`` (parents are created), verifying ``md5``.

    If ``path`` already exists with the right checksum (or ``md5`` is None) nothing is
    fetched. The data go to ``<path>.part`` first and are renamed only after the checksum
    matched, so an interrupted or corrupted download never leaves a file at ``path``.

    Args:
        url: ``http(s)://`` or ``file://`` URL.
        path: destination file.
        md5: expected hex MD5 of the file, or None to skip the check.
        timeout: socket timeout in seconds.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        DownloadError: the URL could not be read (e.g. the machine is offline).
        ChecksumError: the fetched file's MD5 differs from ``md5`` (the file is removed).
    """
    path = Path(path)
    if path.is_file() and (md5 is None or md5sum(path) == md5.lower()):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    request = urllib.request.Request(url, headers={"User-Agent": "audit-callbacks/0.1"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(part, "wb") as out:
            shutil.copyfileobj(response, out, _CHUNK)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        part.unlink(missing_ok=True)
        reason = getattr(exc, "reason", exc)
        raise DownloadError(
            f"could not download {url} ({reason}). If this machine is offline, fetch the "
            f"file elsewhere and place it at {path}"
        ) from exc
    if md5 is not None:
        got = md5sum(part)
        if got != md5.lower():
            part.unlink(missing_ok=True)
            raise ChecksumError(f"MD5 mismatch for {url}: expected {md5.lower()}, got {got}")
    part.replace(path)
    return path


def _fetch(source: RemoteSource, filename: str, folder: Path) -> Path:
    """Download ``filename`` of ``source`` into ``folder``, trying each mirror in turn."""
    errors: list[str] = []
    for url in source.urls(filename):
        try:
            return download_url(url, folder / filename, md5=source.files.get(filename))
        except DownloadError as exc:
            errors.append(str(exc))
    raise DownloadError(f"every mirror failed for {filename}:\n  " + "\n  ".join(errors))


def _missing_error(dataset: str, missing: list[Path], source: RemoteSource) -> FileNotFoundError:
    urls = ", ".join(u for f in source.files for u in source.urls(f))
    names = "\n  ".join(str(p) for p in missing)
    return FileNotFoundError(
        f"{dataset} files not found:\n  {names}\n"
        f"Pass download=True to fetch them from {urls} "
        f"(or download and place them there by hand)."
    )


# --------------------------------------------------------------------------------------
# IDX parsing (MNIST / EMNIST)
# --------------------------------------------------------------------------------------

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _open_maybe_gzip(path: Path) -> BinaryIO:
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (the MNIST format), gzip-compressed or not.

    Layout: two zero bytes, a type code (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), the number of dimensions ``d``, then ``d`` big-endian
    uint32 sizes, then the values in C order, big-endian. Compression is detected from the
    gzip magic bytes, not the file name.

    Returns:
        Array with the stored shape, in native byte order.

    Raises:
        ValueError: bad magic number, unknown type code, or a payload whose length does not
            match the header.
    """
    path = Path(path)
    with _open_maybe_gzip(path) as fh:
        data = fh.read()
    if len(data) < 4:
        raise ValueError(f"{path}: too short to be an IDX file ({len(data)} bytes)")
    if data[0] != 0 or data[1] != 0:
        raise ValueError(
            f"{path}: bad IDX magic number 0x{data[:4].hex()} (must start with two zero bytes)"
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX data type code 0x{code:02x}")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares zero dimensions")
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise ValueError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", data[4:offset])
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - offset != expected:
        raise ValueError(
            f"{path}: IDX header says shape {shape} ({expected} bytes of data) but the file "
            f"has {len(data) - offset} bytes after the header"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _find_idx(folder: Path, stem: str) -> Path | None:
    """``folder/stem`` or ``folder/stem.gz``, whichever exists."""
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 [N, H, W] -> float32 [N, 1, H, W] in [0, 1]."""
    if images.ndim != 3:
        raise ValueError(f"expected images of shape [N, H, W], got {images.shape}")
    return torch.from_numpy(np.ascontiguousarray(images)).unsqueeze(1).float().div_(255.0)


def _check_pair(images: np.ndarray, labels: np.ndarray, what: str) -> None:
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{what}: {images.shape[0]} images but labels of shape {tuple(labels.shape)}"
        )


def load_mnist(
    root: str | Path, train: bool = True, download: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load MNIST from ``<root>/MNIST/raw``.

    Args:
        root: data folder.
        train: the 60k training split if True, else the 10k test split.
        download: fetch the missing ``.gz`` files (MD5-checked) first.

    Returns:
        ``x`` float32 [N, 1, 28, 28] in [0, 1], ``y`` int64 [N] in 0..9.

    Raises:
        FileNotFoundError: files missing and ``download=False`` (names the files and URLs).
        DownloadError: ``download=True`` but no mirror could be reached.
    """
    source = RESOURCES["mnist"]
    folder = Path(root) / "MNIST" / "raw"
    prefix = "train" if train else "t10k"
    stems = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    paths = [_find_idx(folder, s) for s in stems]
    if any(p is None for p in paths):
        if not download:
            raise _missing_error(
                "MNIST",
                [folder / (s + ".gz") for s, p in zip(stems, paths, strict=True) if p is None],
                source,
            )
        paths = [
            p if p is not None else _fetch(source, s + ".gz", folder)
            for s, p in zip(stems, paths, strict=True)
        ]
    images, labels = read_idx(paths[0]), read_idx(paths[1])  # type: ignore[arg-type]
    _check_pair(images, labels, "MNIST")
    return _images_to_tensor(images), torch.from_numpy(labels.astype(np.int64))


def _extract_emnist(archive: Path, split: str, folder: Path) -> None:
    """Copy the ``emnist-<split>-*`` members of NIST's ``gzip.zip`` into ``folder``."""
    prefix = f"emnist-{split}-"
    found = False
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            name = PurePosixPath(info.filename).name
            if info.is_dir() or not name.startswith(prefix):
                continue
            found = True
            with zf.open(info) as src, open(folder / name, "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
    if not found:
        raise ValueError(f"{archive} has no members named {prefix}*")


def load_emnist(
    root: str | Path, split: str = "balanced", train: bool = True, download: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one EMNIST split from ``<root>/EMNIST/raw``.

    NIST stores EMNIST images transposed (column-major); they are transposed back here so
    that digits look the same as in MNIST. The ``letters`` split's labels 1..26 are
    shifted to 0..25; other splits keep their labels (see :data:`EMNIST_NUM_CLASSES`).

    Args:
        root: data folder.
        split: one of :data:`EMNIST_SPLITS`.
        train: training split if True, else test split.
        download: fetch NIST's ``gzip.zip`` (MD5-checked; ~560 MB, kept for the other
            splits) and extract this split's files if they are missing.

    Returns:
        ``x`` float32 [N, 1, 28, 28] in [0, 1], ``y`` int64 [N].

    Raises:
        ValueError: unknown ``split``.
        FileNotFoundError: files missing and ``download=False``.
        DownloadError: ``download=True`` but the archive could not be fetched.
    """
    if split not in EMNIST_NUM_CLASSES:
        raise ValueError(f"unknown EMNIST split {split!r}; choose from {EMNIST_SPLITS}")
    source = RESOURCES["emnist"]
    folder = Path(root) / "EMNIST" / "raw"
    part = "train" if train else "test"
    stems = (f"emnist-{split}-{part}-images-idx3-ubyte", f"emnist-{split}-{part}-labels-idx1-ubyte")
    paths = [_find_idx(folder, s) for s in stems]
    if any(p is None for p in paths):
        if not download:
            raise _missing_error(
                "EMNIST",
                [folder / (s + ".gz") for s, p in zip(stems, paths, strict=True) if p is None],
                source,
            )
        (archive_name,) = source.files
        archive = _fetch(source, archive_name, folder)
        _extract_emnist(archive, split, folder)
        paths = [_find_idx(folder, s) for s in stems]
        if any(p is None for p in paths):
            raise FileNotFoundError(f"{archive} did not contain {stems}")
    images, labels = read_idx(paths[0]), read_idx(paths[1])  # type: ignore[arg-type]
    _check_pair(images, labels, "EMNIST")
    images = images.transpose(0, 2, 1)
    y = labels.astype(np.int64)
    if split == "letters":
        y = y - 1
    return _images_to_tensor(images), torch.from_numpy(y)


# --------------------------------------------------------------------------------------
# CIFAR-10
# --------------------------------------------------------------------------------------

_PICKLE_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}
for _mod in ("numpy.core", "numpy._core"):
    _PICKLE_ALLOWED[(f"{_mod}.multiarray", "_reconstruct")] = _np_multiarray._reconstruct
    _PICKLE_ALLOWED[(f"{_mod}.multiarray", "scalar")] = _np_multiarray.scalar
    _PICKLE_ALLOWED[(f"{_mod}.numeric", "_frombuffer")] = _np_numeric._frombuffer


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that only resolves the few globals a CIFAR batch needs (numpy arrays),
    so a tampered batch file cannot run arbitrary code."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _PICKLE_ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"CIFAR batch refers to {module}.{name}, which is not allowed"
            ) from None


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled CIFAR batch -> (uint8 [n, 3, 32, 32], int64 [n])."""
    with open(path, "rb") as fh:
        batch = _RestrictedUnpickler(fh, encoding="latin1").load()
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(batch).__name__}")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or ("labels" not in batch and "fine_labels" not in batch):
        raise ValueError(f"{path}: CIFAR batch lacks 'data'/'labels' (keys: {sorted(batch)})")
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch.get("labels", batch.get("fine_labels")), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise ValueError(f"{path}: bad CIFAR batch shapes data {data.shape}, labels {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _extract_cifar10(archive: Path, root: Path) -> None:
    """Extract the regular files under ``cifar-10-batches-py/`` of the tarball into
    ``<root>/cifar-10-batches-py`` (member paths are reduced to their base name)."""
    out = root / _CIFAR10_FOLDER
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar:
        for member in tar.getmembers():
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or len(parts) != 2 or parts[0] != _CIFAR10_FOLDER:
                continue
            src = tar.extractfile(member)
            if src is None:  # pragma: no cover - isfile() members always have data
                continue
            with src, open(out / parts[1], "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)


def load_cifar10(
    root: str | Path, train: bool = True, download: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load CIFAR-10 from ``<root>/cifar-10-batches-py``.

    The batches are Python pickles; they are read with a restricted unpickler that only
    builds numpy arrays, dicts, lists and strings.

    Args:
        root: data folder.
        train: the 50k training split (``data_batch_1..5``) if True, else ``test_batch``.
        download: fetch and extract ``cifar-10-python.tar.gz`` (MD5-checked, ~170 MB) if
            the batches are missing.

    Returns:
        ``x`` float32 [N, 3, 32, 32] in [0, 1], ``y`` int64 [N] in 0..9.

    Raises:
        FileNotFoundError: files missing and ``download=False``.
        DownloadError: ``download=True`` but the archive could not be fetched.
    """
    source = RESOURCES["cifar10"]
    root = Path(root)
    folder = root / _CIFAR10_FOLDER
    names = _CIFAR10_TRAIN if train else _CIFAR10_TEST
    missing = [folder / n for n in names if not (folder / n).is_file()]
    if missing:
        if not download:
            raise _missing_error("CIFAR-10", missing, source)
        (archive_name,) = source.files
        archive = _fetch(source, archive_name, root)
        _extract_cifar10(archive, root)
        missing = [folder / n for n in names if not (folder / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{archive} did not contain {[p.name for p in missing]}")
    batches = [_read_cifar_batch(folder / n) for n in names]
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    return x, torch.from_numpy(labels)
