"""Tests of datamodules: partitions, offline loaders, IDX/EMNIST/CIFAR parsing, downloads and
the federated LightningDataModule. Every file the parsers read is written by the test."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from datamodules import (
    RESOURCES,
    ChecksumError,
    DownloadError,
    FederatedDataModule,
    RemoteSource,
    dirichlet_partition,
    download_url,
    iid_partition,
    label_entropy,
    load_breast_cancer_tensors,
    load_cifar10,
    load_digits_tensors,
    load_emnist,
    load_mnist,
    md5sum,
    read_idx,
    zscore,
)

# ----------------------------------------------------------------------------- helpers

_IDX_CODES = {
    np.dtype(np.uint8): 0x08,
    np.dtype(np.int8): 0x09,
    np.dtype(np.int16): 0x0B,
    np.dtype(np.int32): 0x0C,
    np.dtype(np.float32): 0x0D,
    np.dtype(np.float64): 0x0E,
}


def idx_bytes(arr: np.ndarray) -> bytes:
    """Serialise ``arr`` in IDX format: magic (0, 0, type, ndim), big-endian dims and data."""
    arr = np.asarray(arr)
    code = _IDX_CODES[arr.dtype]
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, arr: np.ndarray, compress: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = idx_bytes(arr)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def fake_images(n: int, size: int = 28, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size), dtype=np.uint8)


def assert_partition(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert joined.dtype == np.int64
    assert joined.size == n, "partition must not drop or duplicate examples"
    np.testing.assert_array_equal(np.sort(joined), np.arange(n))


@pytest.fixture(scope="module")
def digits_labels() -> np.ndarray:
    return load_digits_tensors()[1].numpy()


# ----------------------------------------------------------------------------- partitions


@pytest.mark.parametrize("n,k", [(10, 1), (10, 3), (10, 10), (1797, 100)])
def test_iid_partition_disjoint_cover_balanced(n: int, k: int) -> None:
    parts = iid_partition(n, k, seed=1)
    assert len(parts) == k
    assert_partition(parts, n)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_iid_partition_seeded() -> None:
    a, b, c = iid_partition(50, 5, 0), iid_partition(50, 5, 0), iid_partition(50, 5, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_partition_errors() -> None:
    with pytest.raises(ValueError, match="larger than the number of examples"):
        iid_partition(5, 6, 0)
    with pytest.raises(ValueError):
        iid_partition(5, 0, 0)
    with pytest.raises(ValueError):
        iid_partition(0, 1, 0)


@pytest.mark.parametrize("alpha", [0.05, 0.5, 10.0])
def test_dirichlet_partition_disjoint_cover_min_size(
    digits_labels: np.ndarray, alpha: float
) -> None:
    parts = dirichlet_partition(digits_labels, 30, alpha, seed=3, min_size=5)
    assert len(parts) == 30
    assert_partition(parts, digits_labels.size)
    assert min(p.size for p in parts) >= 5


def test_dirichlet_skew_grows_as_concentration_falls(digits_labels: np.ndarray) -> None:
    def mean_entropy(alpha: float) -> float:
        ents = []
        for seed in range(3):
            parts = dirichlet_partition(digits_labels, 20, alpha, seed=seed)
            ents += [label_entropy(digits_labels[p], 10) for p in parts]
        return float(np.mean(ents))

    e = [mean_entropy(a) for a in (0.05, 0.5, 5.0, 500.0)]
    assert e[0] < e[1] < e[2] < e[3], e
    assert e[3] > 0.95 * np.log(10)  # near-IID for a huge concentration
    iid = np.mean([label_entropy(digits_labels[p], 10) for p in iid_partition(1797, 20, 0)])
    assert e[0] < 0.5 * iid


def test_dirichlet_partition_seeded(digits_labels: np.ndarray) -> None:
    a = dirichlet_partition(digits_labels, 7, 0.3, seed=11)
    b = dirichlet_partition(digits_labels, 7, 0.3, seed=11)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_dirichlet_partition_errors() -> None:
    y = np.repeat(np.arange(5), 10)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="concentration"):
            dirichlet_partition(y, 5, bad, seed=0)
    with pytest.raises(ValueError, match="larger than the number of examples"):
        dirichlet_partition(y, 51, 1.0, seed=0)
    with pytest.raises(ValueError, match="min_size"):
        dirichlet_partition(y, 10, 1.0, seed=0, min_size=6)
    with pytest.raises(ValueError, match="one-dimensional"):
        dirichlet_partition(y.reshape(5, 10), 2, 1.0, seed=0)
    # One class and a tiny concentration: one client takes nearly everything, every time.
    with pytest.raises(ValueError, match="attempts"):
        dirichlet_partition(np.zeros(50, dtype=int), 10, 1e-3, seed=0, max_retries=5)


def test_label_entropy() -> None:
    assert label_entropy([]) == 0.0
    assert label_entropy([3, 3, 3]) == 0.0
    assert label_entropy([0, 1]) == pytest.approx(np.log(2))


# ----------------------------------------------------------------------------- sklearn data


def test_digits_tensors() -> None:
    x, y = load_digits_tensors()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == torch.float32
    assert y.shape == (1797,) and y.dtype == torch.int64
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert set(y.tolist()) == set(range(10))
    xf, yf = load_digits_tensors(flatten=True)
    assert xf.shape == (1797, 64)
    torch.testing.assert_close(xf, x.reshape(1797, 64))
    assert torch.equal(yf, y)


def test_breast_cancer_tensors() -> None:
    x, y = load_breast_cancer_tensors()
    assert x.shape == (569, 30) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and set(y.tolist()) == {0, 1}
    torch.testing.assert_close(x.mean(0), torch.zeros(30), atol=1e-4, rtol=0)
    torch.testing.assert_close(x.std(0, unbiased=False), torch.ones(30), atol=1e-3, rtol=0)
    raw, _ = load_breast_cancer_tensors(standardize=False)
    assert float(raw.max()) > 100  # unscaled areas


def test_zscore_uses_train_statistics() -> None:
    train = torch.tensor([[0.0, 10.0], [2.0, 10.0]])
    test = torch.tensor([[4.0, 11.0]])
    tz, sz = zscore(train, test)
    torch.testing.assert_close(tz[:, 0], torch.tensor([-1.0, 1.0]))
    assert float(sz[0, 0]) == pytest.approx(3.0)
    assert torch.isfinite(sz).all()  # the constant column does not blow up to inf/nan


# ----------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_round_trip(tmp_path: Path, dtype: type, compress: bool) -> None:
    rng = np.random.default_rng(0)
    arr = (rng.standard_normal((3, 4, 5)) * 50).astype(dtype)
    path = write_idx(tmp_path / "a.idx", arr, compress=compress)
    out = read_idx(path)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


def test_read_idx_one_dimensional(tmp_path: Path) -> None:
    labels = np.array([5, 0, 4, 1, 9], dtype=np.uint8)
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "l.gz", labels)), labels)


def test_read_idx_rejects_corruption(tmp_path: Path) -> None:
    good = idx_bytes(np.zeros((2, 3), dtype=np.uint8))
    cases = {
        "magic": b"\x08\x03" + good[2:],
        "type code": good[:2] + b"\x07" + good[3:],
        "zero dimensions": good[:3] + b"\x00",
        "bytes after the header": good[:-1],
        "short": good[:3],
    }
    for name, data in cases.items():
        path = tmp_path / f"bad-{name.replace(' ', '_')}.gz"
        path.write_bytes(gzip.compress(data))
        with pytest.raises(ValueError):
            read_idx(path)
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad-magic.gz")


# ----------------------------------------------------------------------------- MNIST


def _mnist_arrays() -> dict[str, np.ndarray]:
    return {
        "train-images-idx3-ubyte": fake_images(6, seed=1),
        "train-labels-idx1-ubyte": np.array([0, 1, 2, 3, 4, 5], dtype=np.uint8),
        "t10k-images-idx3-ubyte": fake_images(4, seed=2),
        "t10k-labels-idx1-ubyte": np.array([9, 8, 7, 6], dtype=np.uint8),
    }


def test_load_mnist_from_local_files(tmp_path: Path) -> None:
    arrays = _mnist_arrays()
    raw = tmp_path / "MNIST" / "raw"
    for i, (stem, arr) in enumerate(arrays.items()):
        compress = i % 2 == 0  # both .gz and already-extracted files are accepted
        write_idx(raw / (stem + (".gz" if compress else "")), arr, compress=compress)
    x, y = load_mnist(tmp_path, train=True)
    assert x.shape == (6, 1, 28, 28) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and y.tolist() == [0, 1, 2, 3, 4, 5]
    torch.testing.assert_close(x[:, 0], torch.from_numpy(arrays["train-images-idx3-ubyte"]) / 255.0)
    xt, yt = load_mnist(tmp_path, train=False)
    assert xt.shape == (4, 1, 28, 28) and yt.tolist() == [9, 8, 7, 6]
    assert 0.0 <= float(xt.min()) and float(xt.max()) <= 1.0


def test_load_mnist_missing_names_files_and_url(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_mnist(tmp_path, train=False)
    msg = str(info.value)
    assert "t10k-images-idx3-ubyte.gz" in msg and "t10k-labels-idx1-ubyte.gz" in msg
    assert "https://ossci-datasets.s3.amazonaws.com/mnist/" in msg
    assert "download=True" in msg


def test_load_mnist_download_from_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "mirror"
    files = {}
    for stem, arr in _mnist_arrays().items():
        p = write_idx(mirror / (stem + ".gz"), arr)
        files[p.name] = md5sum(p)
    broken = (tmp_path / "nowhere").as_uri()  # first mirror fails, second one is used
    monkeypatch.setitem(RESOURCES, "mnist", RemoteSource((broken, mirror.as_uri()), files))
    root = tmp_path / "data"
    x, y = load_mnist(root, train=True, download=True)
    assert x.shape == (6, 1, 28, 28) and y.tolist() == [0, 1, 2, 3, 4, 5]
    assert (root / "MNIST" / "raw" / "train-images-idx3-ubyte.gz").is_file()
    assert not (root / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz").exists()

    # A wrong checksum in the table: the download is refused.
    bad = dict(files, **{"t10k-images-idx3-ubyte.gz": "0" * 32})
    monkeypatch.setitem(RESOURCES, "mnist", RemoteSource((mirror.as_uri(),), bad))
    with pytest.raises(DownloadError, match="MD5 mismatch"):
        load_mnist(root, train=False, download=True)
    assert not (root / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz").exists()


# ----------------------------------------------------------------------------- EMNIST


def _emnist_zip(path: Path, split: str, n_train: int, n_test: int) -> dict[str, np.ndarray]:
    """NIST-style gzip.zip: members gzip/emnist-<split>-*-ubyte.gz holding *transposed*
    images. Returns the upright images and the labels."""
    upright = {"train": fake_images(n_train, seed=5), "test": fake_images(n_test, seed=6)}
    labels = {"train": np.arange(n_train) % 26 + 1, "test": np.arange(n_test) % 26 + 1}
    with zipfile.ZipFile(path, "w") as zf:
        for part in ("train", "test"):
            stored = np.ascontiguousarray(upright[part].transpose(0, 2, 1))
            zf.writestr(
                f"gzip/emnist-{split}-{part}-images-idx3-ubyte.gz", gzip.compress(idx_bytes(stored))
            )
            zf.writestr(
                f"gzip/emnist-{split}-{part}-labels-idx1-ubyte.gz",
                gzip.compress(idx_bytes(labels[part].astype(np.uint8))),
            )
        zf.writestr("gzip/emnist-other-train-images-idx3-ubyte.gz", b"not extracted")
        zf.writestr(f"gzip/emnist-{split}-mapping.txt", "0 48\n")
    return {
        "train": upright["train"],
        "test": upright["test"],
        **{f"{k}_labels": v for k, v in labels.items()},
    }


def test_load_emnist_download_extract_transpose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    arrays = _emnist_zip(mirror / "gzip.zip", "letters", n_train=7, n_test=3)
    monkeypatch.setitem(
        RESOURCES,
        "emnist",
        RemoteSource((mirror.as_uri(),), {"gzip.zip": md5sum(mirror / "gzip.zip")}),
    )
    root = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="emnist-letters-train-images-idx3-ubyte"):
        load_emnist(root, split="letters")
    x, y = load_emnist(root, split="letters", train=True, download=True)
    assert x.shape == (7, 1, 28, 28) and x.dtype == torch.float32
    # Stored transposed on disk, returned upright.
    torch.testing.assert_close(x[:, 0], torch.from_numpy(arrays["train"]) / 255.0)
    # "letters" labels 1..26 are shifted to 0..25.
    assert y.dtype == torch.int64
    assert y.tolist() == (arrays["train_labels"] - 1).tolist()
    raw = root / "EMNIST" / "raw"
    assert (raw / "emnist-letters-test-images-idx3-ubyte.gz").is_file()
    assert not (raw / "emnist-other-train-images-idx3-ubyte.gz").exists()
    xt, yt = load_emnist(root, split="letters", train=False)  # already extracted
    assert xt.shape == (3, 1, 28, 28) and yt.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown EMNIST split"):
        load_emnist(root, split="nope")


def test_load_emnist_balanced_keeps_labels(tmp_path: Path) -> None:
    archive = tmp_path / "gzip.zip"
    arrays = _emnist_zip(archive, "balanced", n_train=4, n_test=2)
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    with zipfile.ZipFile(archive) as zf:  # extracted by hand, then un-gzipped
        for name in zf.namelist():
            if name.startswith("gzip/emnist-balanced-") and name.endswith(".gz"):
                (raw / Path(name).stem).write_bytes(gzip.decompress(zf.read(name)))
    x, y = load_emnist(tmp_path, split="balanced", train=False)
    torch.testing.assert_close(x[:, 0], torch.from_numpy(arrays["test"]) / 255.0)
    assert y.tolist() == arrays["test_labels"].tolist()


# ----------------------------------------------------------------------------- CIFAR-10


def _cifar_batch(n: int, seed: int, bytes_keys: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, size=n)]
    if bytes_keys:
        return {b"batch_label": b"x", b"data": data, b"labels": labels}
    return {"batch_label": "x", "data": data, "labels": labels, "filenames": ["f"] * n}


def _cifar_tarball(path: Path) -> dict[str, dict]:
    batches = {f"data_batch_{i}": _cifar_batch(3, seed=i, bytes_keys=i == 2) for i in range(1, 6)}
    batches["test_batch"] = _cifar_batch(4, seed=9)
    with tarfile.open(path, "w:gz") as tar:
        for name, batch in [*batches.items(), ("batches.meta", {"label_names": ["a"] * 10})]:
            payload = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        evil = tarfile.TarInfo("../escape.txt")
        evil.size = 3
        tar.addfile(evil, io.BytesIO(b"bad"))
    return batches


def test_load_cifar10_download_and_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    archive = mirror / "cifar-10-python.tar.gz"
    batches = _cifar_tarball(archive)
    monkeypatch.setitem(
        RESOURCES,
        "cifar10",
        RemoteSource((mirror.as_uri(),), {archive.name: md5sum(archive)}),
    )
    root = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match="data_batch_1"):
        load_cifar10(root, train=True)
    x, y = load_cifar10(root, train=True, download=True)
    assert x.shape == (15, 3, 32, 32) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and y.shape == (15,)
    first = batches["data_batch_1"]
    assert y[:3].tolist() == first["labels"]
    # Row layout: 1024 red, then 1024 green, then 1024 blue values, each row-major 32x32.
    expected = torch.from_numpy(first["data"][0].reshape(3, 32, 32)) / 255.0
    torch.testing.assert_close(x[0], expected)
    second = batches["data_batch_2"]  # bytes keys, as unpickled by encoding="bytes" pickles
    assert y[3:6].tolist() == second[b"labels"]
    xt, yt = load_cifar10(root, train=False)
    assert xt.shape == (4, 3, 32, 32) and yt.tolist() == batches["test_batch"]["labels"]
    assert not (tmp_path / "escape.txt").exists() and not (root.parent / "escape.txt").exists()


def test_cifar_batch_with_code_is_rejected(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):  # noqa: ANN204 - pickle protocol
            return (os.system, ("echo pwned",))

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "test_batch").write_bytes(pickle.dumps({"data": Evil(), "labels": []}))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        load_cifar10(tmp_path, train=False)


# ----------------------------------------------------------------------------- download_url


def test_download_url_file_uri_and_checksums(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"hello audit" * 1000)
    good = md5sum(src)
    dest = tmp_path / "sub" / "dest.bin"
    assert download_url(src.as_uri(), dest, md5=good) == dest
    assert dest.read_bytes() == src.read_bytes()

    # Present with the right checksum: nothing is fetched (the source may be gone).
    moved = src.rename(tmp_path / "moved.bin")
    assert download_url(src.as_uri(), dest, md5=good) == dest

    bad_dest = tmp_path / "bad.bin"
    with pytest.raises(ChecksumError, match="MD5 mismatch"):
        download_url(moved.as_uri(), bad_dest, md5="0" * 32)
    assert not bad_dest.exists() and not (tmp_path / "bad.bin.part").exists()

    # Present but corrupted: fetched again.
    dest.write_bytes(b"corrupt")
    assert download_url(moved.as_uri(), dest, md5=good).read_bytes() == moved.read_bytes()


def test_download_url_unreachable_is_clear(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="offline"):
        download_url((tmp_path / "missing.bin").as_uri(), tmp_path / "out.bin")
    with pytest.raises(DownloadError, match="offline"):
        download_url("http://127.0.0.1:9/none.gz", tmp_path / "out.bin", timeout=5)
    assert not (tmp_path / "out.bin").exists()


# ----------------------------------------------------------------------------- FederatedDataModule


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_federated_digits_setup_and_loaders(partition: str) -> None:
    dm = FederatedDataModule(
        dataset="digits",
        num_clients=20,
        partition=partition,
        concentration=0.3,
        rounds_per_epoch=7,
        eval_batch_size=100,
        seed=1,
    )
    dm.setup("fit")
    assert dm.num_clients == 20 and len(dm.client_datasets) == 20
    assert dm.num_classes == 10 and dm.input_shape == (1, 8, 8)
    assert all(isinstance(d, TensorDataset) for d in dm.client_datasets)
    n_train, n_test = len(dm.train_dataset), len(dm.test_dataset)
    assert n_train + n_test == 1797 and n_test == pytest.approx(0.2 * 1797, abs=1)
    assert sum(dm.client_sizes) == n_train and min(dm.client_sizes) >= 1
    assert_partition(dm.client_indices, n_train)
    x0, y0 = dm.client_datasets[0].tensors
    assert x0.shape[1:] == (1, 8, 8) and x0.dtype == torch.float32 and y0.dtype == torch.int64
    torch.testing.assert_close(x0, dm.train_dataset.tensors[0][dm.client_indices[0]])
    if partition == "iid":
        assert max(dm.client_sizes) - min(dm.client_sizes) <= 1
    # Stratified split: test class shares match the full set's.
    test_counts = torch.bincount(dm.test_dataset.tensors[1], minlength=10)
    assert int(test_counts.min()) >= 34

    ticks = list(dm.train_dataloader())
    assert len(ticks) == 7
    assert all(
        isinstance(t, torch.Tensor) and t.ndim == 0 and t.dtype == torch.int64 for t in ticks
    )
    assert [int(t) for t in ticks] == list(range(7))
    for loader in (dm.val_dataloader(), dm.test_dataloader()):
        batches = list(loader)
        assert len(batches) == 4
        x, y = batches[0]
        assert x.shape == (100, 1, 8, 8) and y.shape == (100,) and y.dtype == torch.int64
        assert sum(b[1].shape[0] for b in batches) == n_test

    dm.setup("validate")  # idempotent
    assert len(dm.client_datasets) == 20


def test_federated_partitions_differ_in_skew() -> None:
    def entropy(partition: str) -> float:
        dm = FederatedDataModule(num_clients=20, partition=partition, concentration=0.1, seed=0)
        dm.setup()
        return float(np.mean([label_entropy(d.tensors[1].numpy(), 10) for d in dm.client_datasets]))

    assert entropy("dirichlet") < 0.7 * entropy("iid")


def test_federated_too_many_clients() -> None:
    dm = FederatedDataModule(dataset="digits", num_clients=1500)
    with pytest.raises(ValueError, match="larger than the number of training examples"):
        dm.setup()


def test_federated_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        FederatedDataModule(dataset="imagenet")
    with pytest.raises(ValueError, match="unknown partition"):
        FederatedDataModule(partition="shards")
    with pytest.raises(ValueError, match="test_fraction"):
        FederatedDataModule(test_fraction=1.0)
    with pytest.raises(ValueError, match="concentration"):
        FederatedDataModule(partition="dirichlet", concentration=0.0)
    with pytest.raises(ValueError, match="both features and labels"):
        FederatedDataModule(features=torch.zeros(4, 2))
    with pytest.raises(ValueError, match="num_clients"):
        FederatedDataModule(num_clients=0)
    with pytest.raises(RuntimeError, match="setup"):
        FederatedDataModule().val_dataloader()


def test_federated_custom_tensors_and_breast_cancer() -> None:
    g = torch.Generator().manual_seed(0)
    features = torch.randn(200, 5, generator=g)
    labels = torch.arange(200) % 3
    dm = FederatedDataModule(features=features, labels=labels, num_clients=8, test_fraction=0.25)
    dm.setup()
    assert dm.dataset == "custom" and dm.num_classes == 3 and dm.input_shape == (5,)
    assert len(dm.test_dataset) == 50 and sum(dm.client_sizes) == 150

    bc = FederatedDataModule(dataset="breast_cancer", num_clients=5, partition="dirichlet")
    bc.setup()
    x_train = bc.train_dataset.tensors[0]
    assert bc.num_classes == 2 and bc.input_shape == (30,)
    torch.testing.assert_close(x_train.mean(0), torch.zeros(30), atol=1e-4, rtol=0)


def test_federated_mnist_uses_official_split(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    for stem, arr in _mnist_arrays().items():
        write_idx(raw / (stem + ".gz"), arr)
    dm = FederatedDataModule(dataset="mnist", data_root=tmp_path, num_clients=3, eval_batch_size=2)
    dm.prepare_data()  # download=False: nothing to do
    dm.setup()
    assert dm.input_shape == (1, 28, 28) and dm.num_classes == 10
    assert len(dm.train_dataset) == 6 and len(dm.test_dataset) == 4
    assert dm.client_sizes == [2, 2, 2]
    assert len(list(dm.test_dataloader())) == 2
    missing = FederatedDataModule(dataset="cifar10", data_root=tmp_path / "empty", num_clients=2)
    with pytest.raises(FileNotFoundError, match="cifar-10-python.tar.gz"):
        missing.setup()


class _TickModule(L.LightningModule):
    """Consumes round ticks the way the federated LightningModule does."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.ticks: list[int] = []
        self.client_counts: list[int] = []
        self.val_examples = 0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        assert batch.ndim == 0 and batch.dtype == torch.int64
        self.ticks.append(int(batch))
        self.client_counts.append(len(self.trainer.datamodule.client_datasets))
        return (self.weight**2).sum()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.val_examples += batch[1].shape[0]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_federated_with_lightning_trainer(tmp_path: Path) -> None:
    dm = FederatedDataModule(num_clients=10, rounds_per_epoch=3, seed=0)
    module = _TickModule()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=dm)
    assert module.ticks == [0, 1, 2, 0, 1, 2]
    assert module.client_counts == [10] * 6
    assert module.val_examples == 2 * len(dm.test_dataset)


@pytest.mark.parametrize("bad", [-1, 2.5, True, "3"])
def test_central_sampling_seed_is_checked_by_name(bad: object) -> None:
    from datamodules.central import CentralDataModule

    with pytest.raises(ValueError, match="sampling_seed"):
        CentralDataModule("breast_cancer", sampling_seed=bad)


def test_central_split_seed_never_drives_the_batches() -> None:
    """The public split seed and the secret batches are separate: two modules with one split
    seed and no sampling seed draw different batches from the same split."""
    from datamodules.central import CentralDataModule

    a, b = CentralDataModule("breast_cancer", seed=5), CentralDataModule("breast_cancer", seed=5)
    a.setup("fit")
    b.setup("fit")
    assert torch.equal(a.train_set.tensors[0], b.train_set.tensors[0])
    xa = torch.cat([x for x, _ in a.train_dataloader()])
    xb = torch.cat([x for x, _ in b.train_dataloader()])
    assert xa.shape != xb.shape or not torch.equal(xa, xb)
