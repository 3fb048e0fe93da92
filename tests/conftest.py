"""Shared fixtures: paths to the shared data, loopback ICE, a real app served on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from assistant.bench.shared_data import shared_dir
from assistant.rtc.loopback_ice import allow_loopback_ice
from tests import needs
from tests.turnserver import TURNSERVER, TurnServer, run_turnserver

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False, help="run the long soak tests")


def pytest_configure(config: pytest.Config) -> None:
    """Under CI the shared data must be there: about 130 tests need it, and a run without it is not a run. Nothing is
    fetched from a model hub (``respond.model_path = auto`` would pull the machine's model at a server's start,
    children included): a test that pulls serves its own local hub and lifts this (tests/test_pull.py)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    if needs.in_ci() and shared_dir("audio") is None:
        raise pytest.UsageError(needs.shared_missing_message("audio"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="long soak run: pass --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if "browser" in item.keywords:  # headless Chromium driven by playwright: both must be there
        needs.chromium()
        needs.module("playwright.async_api")


@pytest.fixture(scope="session")
def shared_audio() -> Path:
    """The shared speech files with their manifest (``../shared/audio``: see ``tests/needs.py``)."""
    return needs.shared("audio")


@pytest.fixture
def mic_wav(tmp_path: Path, shared_audio: Path) -> Path:
    """en_weather.wav with 4 s of silence after, as the browser tests' fake microphone plays it (tests/browser.py)."""
    from tests.browser import mic_file

    return mic_file(tmp_path / "mic.wav", shared_audio / "en_weather.wav", 4.0)


@pytest.fixture(scope="session", autouse=True)
def loopback_ice() -> None:
    """aioice leaves 127.0.0.1 out of its host candidates; peers in tests talk over loopback."""
    undo = allow_loopback_ice()
    yield
    undo()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """One local Ray cluster for the whole run (starting one costs seconds); yields the address other
    processes join. Each module deploys its own Serve applications and deletes them when done."""
    import ray
    from ray import serve

    from assistant.serve_ray.app import start_local_cluster

    try:
        yield start_local_cluster(num_cpus=6)
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _quiet_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def test_config(**sections: dict) -> object:
    """The default config with test-friendly overrides: the ``echo`` responder unless ``respond`` names another
    (the conversation's machinery is tested on a reply that is quick and known word for word; the embedded model's
    own tests ask for ``{"engine": "llama"}``), and the bundled model, whatever an earlier pull left here
    (``respond.model_path = auto`` is tested on its own)."""
    from assistant.config import load_config

    overrides = {**sections, "respond": {"engine": "echo", "model_path": "", **sections.get("respond", {})}}
    return load_config(overrides=overrides, environ={})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services() -> AsyncIterator[object]:
    """The default stack loaded and warmed once per test module; pass it to :func:`serve` to share it.

    Tests that swap an engine (``services.tts = ...``) put the original back.
    """
    from assistant.server.services import Services

    svc = Services(test_config())  # type: ignore[arg-type]
    await svc.load()
    yield svc
    await svc.close()


def tts_only_services(cfg: object, engine: object) -> object:
    """Services for an app that only speaks (TTS API tests): ``engine``, and stand-ins for the rest."""
    from assistant.server.services import Services

    services = Services(cfg)  # type: ignore[arg-type]
    services.tts = engine  # type: ignore[assignment]
    services.vad_model, services.asr, services.responder = object(), object(), object()  # type: ignore[assignment]
    return services


@contextlib.asynccontextmanager
async def serve(cfg: object, services: object | None = None) -> AsyncIterator[tuple[str, object]]:
    """Run the real app on 127.0.0.1 with a free port until the block ends; yields (base URL, app)."""
    from assistant.server.app import create_app, wait_ready
    from assistant.server.local import serve_on_loopback
    from assistant.server.tls import ssl_context

    tls = ssl_context(cfg.server)  # type: ignore[attr-defined]
    app = create_app(cfg, services)  # type: ignore[arg-type]
    async with serve_on_loopback(app, tls=tls) as url:
        await asyncio.wait_for(wait_ready(app), 120)
        yield url, app


@pytest.fixture(scope="session")
def turn_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TurnServer]:
    """Debian's coturn on loopback with TURN REST auth (use-auth-secret); scripts/test.sh installs it."""
    if not Path(TURNSERVER).exists():
        needs.missing("coturn (turnserver) is not installed: scripts/test.sh installs it (apt-get install coturn)")
    with run_turnserver(tmp_path_factory.mktemp("coturn")) as server:
        yield server


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """A throw-away certificate for 127.0.0.1 and localhost (cert.pem, key.pem) made with ``cryptography``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


test_config.__test__ = False  # type: ignore[attr-defined]
