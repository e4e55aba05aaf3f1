"""Configuration precedence (flags > env > TOML > defaults) and the CLI surface."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from imp_proxy.cli import build_parser, library_settings
from imp_proxy.config import ConfigError, ProxyConfig, TlsConfig, load_config, parse_listen

from .conftest import launch_proxy

ROOT = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    cfg = load_config({}, env={})
    assert (cfg.listen_host, cfg.listen_port, cfg.upstream) == ("127.0.0.1", 6432, None)
    assert cfg.sketches is True and cfg.tls is None and cfg.library == ()


def test_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "imp.toml"
    toml.write_text('listen = "0.0.0.0:7000"\nupstream = "postgresql://file@h/db"\n'
                    'service_pool_size = 9\nsketches = false\n'
                    '[tls]\ncert = "/c.pem"\nkey = "/k.pem"\n'
                    '[library]\ncapture_after = 3\npersist = false\n')
    env = {"IMP_CONFIG": str(toml), "IMP_UPSTREAM": "postgresql://env@h/db"}
    cfg = load_config({}, env=env)
    assert cfg.listen == "0.0.0.0:7000" and cfg.upstream == "postgresql://env@h/db"
    assert cfg.service_pool_size == 9 and cfg.sketches is False
    assert cfg.tls == TlsConfig(Path("/c.pem"), Path("/k.pem"))
    assert cfg.library == (("capture_after", "3"), ("persist", "false"))
    env["IMP_LISTEN"] = "127.0.0.1:7001"
    cfg = load_config({"listen": "[::1]:7002", "upstream": None,
                       "library": ["capture_after=5"]}, env=env)
    assert (cfg.listen_host, cfg.listen_port) == ("::1", 7002)
    assert cfg.upstream == "postgresql://env@h/db"
    assert dict(cfg.library)["capture_after"] == "5"


def test_listen_forms() -> None:
    assert parse_listen("6433") == ("127.0.0.1", 6433)
    assert parse_listen(" :6434 ") == ("127.0.0.1", 6434)
    assert parse_listen("0.0.0.0:6435") == ("0.0.0.0", 6435)
    assert parse_listen("[::1]:6436") == ("::1", 6436)
    for bad in ("nohost", "[::1]6437", "[::1]", "host:", "host:99999", "-1", "6x"):
        with pytest.raises(ConfigError):
            parse_listen(bad)


def test_invalid_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_config({"service_pool_size": 0}, env={})
    with pytest.raises(ConfigError):
        load_config({"tls_cert": "/x.pem"}, env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("colour = 'red'\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_config({}, env={"IMP_CONFIG": str(bad)})
    with pytest.raises(ConfigError):
        load_config({}, env={"IMP_CONFIG": str(tmp_path / "missing.toml")})


def test_library_settings_coerced() -> None:
    manager = pytest.importorskip("sketches.manager")
    s = library_settings(manager.SketchSettings, [("capture_after", "4"), ("persist", "off"),
                                                  ("max_coverage", "0.5")])
    assert (s.capture_after, s.persist, s.max_coverage) == (4, False, 0.5)
    with pytest.raises(ConfigError):
        library_settings(manager.SketchSettings, [("nope", "1")])
    with pytest.raises(ConfigError):
        library_settings(manager.SketchSettings, [("capture_after", "many")])


@pytest.mark.parametrize("setting", [("strategy", "bogus"), ("batch_size", "0"),
                                     ("batch_interval", "0"), ("state_interval", "nan"),
                                     ("own_sketch_min_coverage", "2"), ("max_state_rows", "0"),
                                     ("fragments", "0")])
def test_library_settings_the_library_refuses_are_configuration_errors(
        setting: tuple[str, str]) -> None:
    """A value of the right type that the settings' own checks refuse is a configuration
    error too (found by a documentation search in session 28: a Python traceback and exit
    status 1, not the README's one line and status 2; a NaN interval and 0 fragments were
    even accepted, and stopped the background's rounds or every capture)."""
    manager = pytest.importorskip("sketches.manager")
    with pytest.raises(ConfigError, match="invalid library settings"):
        library_settings(manager.SketchSettings, [setting])


def test_a_library_strategy_is_read_in_any_case() -> None:
    """``strategy=Lazy`` in a flag or the file was kept as written, matched neither ``lazy``
    nor ``eager``, and every write made a recapture (found by a documentation search in
    session 28); ``IMP SET strategy = Lazy`` always took it in any case."""
    manager = pytest.importorskip("sketches.manager")
    assert library_settings(manager.SketchSettings, [("strategy", " Lazy")]).strategy == "lazy"
    assert manager.SketchSettings(strategy="EAGER").strategy == "eager"


def test_help_documents_every_option() -> None:
    parser = build_parser()
    out = subprocess.run([sys.executable, "-m", "imp_proxy", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    sub = next(a for a in parser._actions if a.dest == "command")
    serve = sub.choices["serve"]  # type: ignore[attr-defined]
    for action in serve._actions:
        for flag in action.option_strings:
            assert flag in out
        assert action.help, action.option_strings
    for cmd in ("serve", "install", "demo"):
        assert subprocess.run([sys.executable, "-m", "imp_proxy", cmd, "--help"], cwd=ROOT,
                              capture_output=True).returncode == 0
    assert isinstance(ProxyConfig().data_dir, Path)


def test_install_command(fresh_db: Callable[[], str]) -> None:
    dsn = fresh_db()
    res = subprocess.run([sys.executable, "-m", "imp_proxy", "install", "--upstream", dsn],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("applied: ") and "001_" in res.stdout
    again = subprocess.run([sys.executable, "-m", "imp_proxy", "install", "--upstream", dsn],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "already up to date" in again.stdout
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) > 0 FROM imp.schema_version").fetchone() == (True,)


def test_serve_without_upstream_starts_and_reuses_embedded_postgres() -> None:
    data = Path(tempfile.mkdtemp(prefix="imp-data-", dir="/tmp"))
    data.chmod(0o755)
    try:
        p = launch_proxy(None, "--data-dir", str(data), "--no-sketches")
        try:
            with psycopg.connect(f"host=127.0.0.1 port={p.port} user=postgres dbname=postgres",
                                 autocommit=True) as c:
                c.execute("CREATE TABLE kept (x int)")
                c.execute("INSERT INTO kept VALUES (42)")
        finally:
            p.stop()
        pidfile = data / "pg" / "data" / "postmaster.pid"
        assert not pidfile.exists()  # the proxy stopped the cluster it started
        p = launch_proxy(None, "--data-dir", str(data), "--no-sketches")
        try:
            with psycopg.connect(f"host=127.0.0.1 port={p.port} user=postgres dbname=postgres",
                                 autocommit=True) as c:
                assert c.execute("SELECT x FROM kept").fetchone() == (42,)
        finally:
            p.stop()
        assert not pidfile.exists()
    finally:
        shutil.rmtree(data, ignore_errors=True)
